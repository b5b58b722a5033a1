"""Save time and peak host memory per rank of one FSDP2 checkpoint, full vs sharded (docs/distributed.md).

    OMP_NUM_THREADS=1 python benchmarks/fsdp_checkpoint.py [--model ~/.cache/ablate/smollm2-135m-instruct] [--ranks 2]

Each form is measured in its own `--ranks` gloo processes (torch.multiprocessing): the model
(default: SmolLM2-135M as `ablate fetch smollm2_135m` caches it) is loaded in fp32, sharded as
`distributed=fsdp` shards it (FSDP2 `fully_shard`, one unit per decoder layer, then the root), and one
AdamW step fills the optimizer state; then one checkpoint is saved the way accelerate saves it under
each `state_dict_type`:
- `full` (FULL_STATE_DICT): the model's and optimizer's state dicts gathered whole to rank 0 on the host
  (`full_state_dict=True, cpu_offload=True`), which writes them (torch.save);
- `sharded` (SHARDED_STATE_DICT): every rank writes its own shards (torch.distributed.checkpoint.save,
  `.distcp` files and a `.metadata`), model and optimizer each in its own dir.
Per rank: seconds from a barrier to the end of the save (the slowest rank is the checkpoint's time), and
the save's peak host memory above the rank's RSS just before it (RSS sampled every 2 ms in a thread).
The file sizes are the checkpoint's bytes on disk. Run by hand; no test checks the timings.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakRSS:
    """The highest RSS seen while the block runs, sampled every 2 ms."""

    def __enter__(self) -> "PeakRSS":
        self.base = self.peak = _rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.002):
            self.peak = max(self.peak, _rss())

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss())


def _worker(rank: int, world: int, port: int, model_dir: str, form: str, out_dir: str, results: str) -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )
    from torch.distributed.fsdp import fully_shard
    from transformers import AutoModelForCausalLM

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    ids = torch.randint(0, model.config.vocab_size, (1, 64))
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    opt.zero_grad()
    out = Path(out_dir)
    dist.barrier()
    start = time.perf_counter()
    with PeakRSS() as mem:
        if form == "full":
            options = StateDictOptions(full_state_dict=True, cpu_offload=True)
            state = get_model_state_dict(model, options=options)
            optim = get_optimizer_state_dict(model, opt, options=options)
            if rank == 0:
                torch.save(state, out / "pytorch_model_fsdp.bin")
                torch.save(optim, out / "optimizer.bin")
            del state, optim
        else:
            dcp.save(
                {"model": get_model_state_dict(model)},
                storage_writer=dcp.FileSystemWriter(out / "pytorch_model_fsdp_0"),
            )
            dcp.save(
                {"optimizer": get_optimizer_state_dict(model, opt)},
                storage_writer=dcp.FileSystemWriter(out / "optimizer_0"),
            )
    seconds = time.perf_counter() - start
    dist.barrier()
    with open(results, "a") as f:
        f.write(
            json.dumps(
                {
                    "form": form,
                    "rank": rank,
                    "seconds": seconds,
                    "peak_mb": (mem.peak - mem.base) / 2**20,
                    "rss_before_mb": mem.base / 2**20,
                }
            )
            + "\n"
        )
    dist.destroy_process_group()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    import torch.multiprocessing as mp

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--model",
        default=str(
            Path(os.environ.get("ABLATE_CACHE", Path.home() / ".cache" / "ablate")) / "smollm2-135m-instruct"
        ),
    )
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--repeats", type=int, default=2, help="each form this many times, alternating")
    a = p.parse_args()
    if not (Path(a.model) / "config.json").is_file():
        sys.exit(
            f"fsdp_checkpoint: no model dir at {a.model}: run `ablate fetch smollm2_135m` or pass --model"
        )
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        results = Path(tmp) / "results.jsonl"
        for i in range(a.repeats):
            for form in ("full", "sharded"):
                out = Path(tmp) / f"{form}{i}"
                out.mkdir()
                mp.spawn(
                    _worker,
                    args=(a.ranks, _free_port(), a.model, form, str(out), str(results)),
                    nprocs=a.ranks,
                )
                size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
                rows += [
                    dict(json.loads(line), size_mb=size / 2**20, repeat=i)
                    for line in results.read_text().splitlines()
                    if json.loads(line)["form"] == form
                ]
                results.unlink()
    print(
        f"{a.model}, {a.ranks} gloo ranks, fp32, one checkpoint (model + AdamW state); "
        f"median over {a.repeats} repeats of the slowest rank's seconds, max peak per rank"
    )
    print(
        f"{'form':8} {'save s':>7} {'size MB':>8} "
        + " ".join(f"{'rank' + str(r) + ' peak MB':>14}" for r in range(a.ranks))
    )
    for form in ("full", "sharded"):
        mine = [r for r in rows if r["form"] == form]
        slowest = sorted(max(r["seconds"] for r in mine if r["repeat"] == i) for i in range(a.repeats))
        peaks = [max(r["peak_mb"] for r in mine if r["rank"] == k) for k in range(a.ranks)]
        print(
            f"{form:8} {slowest[len(slowest) // 2]:7.2f} {mine[0]['size_mb']:8.0f} "
            + " ".join(f"{x:14.0f}" for x in peaks)
        )


if __name__ == "__main__":
    main()
