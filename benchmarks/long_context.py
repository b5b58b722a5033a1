"""Long sequences: peak memory and seconds per step of ablate vs TRL 1.16, SmolLM2-135M-Instruct, fp32.

    python benchmarks/long_context.py --method dpo --lengths 2048 4096 8192 16384
    python benchmarks/long_context.py --method grpo --lengths 2048 4096 --impls ablate,trl,ablate_sp2
    python benchmarks/long_context.py --lengths 8192 --impls ablate_fsdp_sp2   # FSDP2 x sequence parallel
    ... --limit-mb 9000     # a run whose memory (all its processes) passes this is stopped: "over"
    ... --steps 2           # optimizer steps per run (s/step: the last one; the first carries warm-up)

Every sequence is `length` tokens: DPO, one pair a step whose prompt (128 tokens) plus chosen, and prompt
plus rejected, are `length` each; GRPO, one prompt (128 tokens) and its 8 completions of `length - 128`
tokens, all in one micro-batch (whole groups, ablate's batch), scored and trained (the completions are
fixed token strings handed to both trainers instead of sampled ones: `generator=` for ablate, TRL's
`rollout_func`; the reward is their count of one word, so advantages differ). Both sides take their
leanest memory settings: gradient checkpointing (TRL's default; `use_reentrant=False` on both), DPO's
reference precomputed, GRPO's beta 0 (no reference), TRL's fused LM head (its default); TRL 1.16's DPO
`padding_free` is disabled in that release (it warns and pads) and its GRPO has none. ablate runs every
speed path (shared prompt, padding-free rows, chunked head, lean layers) whatever this CPU's speed record
says (`speed.unverified_devices=true`: the record decides a CPU's speed defaults, and a family without one
runs the plain path, full logits included; this benchmark compares memory settings). Activation offload
(`torch.autograd.graph.save_on_cpu`, TRL's `activation_offloading`) is off: it moves saved activations
from GPU memory to host memory, and on a CPU they are already there.

Sides: `ablate`, `ablate_plain` (speed=off: TRL's layout and full logits, the reference for equal
losses), `trl`, `ablate_sp2` (2 gloo ranks under torchrun, `sequence_parallel=2`: each rank holds half
of every sequence through the decoder; peak RSS per rank, the larger of the two), `ablate_fsdp_sp2` (the
same under FSDP2, full shard: parameters, gradients and AdamW's state split over the 2 ranks too). Each
run is its own process (peak RSS is its own); the table gives peak RSS, the ratio to TRL's, seconds of
the last step, `ablate plan`'s total for the run (glibc's heap as `MALLOC_MMAP_THRESHOLD_` leaves it), and
each step's loss and gradient norm. Not part of the test run.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

import harness  # benchmarks/harness.py (the script's dir is on sys.path)
import sides  # benchmarks/sides.py

PROMPT = 128  # prompt tokens
GENERATIONS = 8  # GRPO's completions per prompt
# RSS of a process that has imported the libraries and built nothing (runs that predate `runtime_mb`)
RUNTIME_MB = 700.0
MARK = "long_context: "  # the child's result line (Trainer prints its own dicts on stdout too)
# single-token words of SmolLM2's tokenizer (each " word" is one token): the text is exactly its length
WORDS = " apple river stone cloud green house light water music paper table chair bread horse".split()


def words(n: int, rng: random.Random) -> str:
    return "".join(" " + rng.choice(WORDS) for _ in range(n))


def dpo_rows(length: int, steps: int) -> list[dict[str, str]]:
    """`steps` pairs (one a step): prompt of PROMPT tokens, chosen and rejected of `length - PROMPT - 1`
    (EOS closes each completion: prompt + completion + EOS = `length`)."""
    rng = random.Random(0)
    c = length - PROMPT - 1
    return [
        {"prompt": words(PROMPT, rng), "chosen": words(c, rng), "rejected": words(c, rng)}
        for _ in range(steps)
    ]


def completions(length: int, tokenizer, rounds: int) -> list[list[list[int]]]:
    """GRPO's fixed samples: per round, GENERATIONS completions of `length - PROMPT` word tokens, no EOS."""
    rng = random.Random(1)
    return [
        [
            tokenizer(words(length - PROMPT, rng), add_special_tokens=False)["input_ids"]
            for _ in range(GENERATIONS)
        ]
        for _ in range(rounds)
    ]


def river_count(completions, **kwargs) -> list[float]:  # noqa: ANN001
    """The reward: how often " river" occurs (varies across completions, so advantages are not zero)."""
    texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
    return [float(t.count(" river")) / 100 for t in texts]


def run_one(impl: str, method: str, length: int, steps: int) -> dict:
    import torch
    import trl  # noqa: F401  (every side imports the same libraries before `runtime_mb` is read)
    from datasets import Dataset

    from ablate.methods import dpo, grpo  # noqa: F401
    from ablate.models import smollm2_135m

    runtime = _rss_mb([os.getpid()])  # the libraries, before any tensor of the run exists
    torch.manual_seed(0)
    tok, model = smollm2_135m()
    rank = int(os.environ.get("RANK", "0"))
    common = sides.trainer_args(
        f"/tmp/bench-long-{impl}-{os.getpid()}",
        steps,
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=True,
        gradient_checkpointing_kwargs={"use_reentrant": False},
    )
    rec = harness.StepRecorder()
    kw: dict = {}
    if _ranks(impl) > 1:
        kw["sequence_parallel"] = _ranks(impl)
    if impl.startswith("ablate_fsdp"):  # conf/distributed/fsdp.yaml's TrainingArguments keys
        common.update(
            fsdp=True, fsdp_config={"fsdp_version": 2, "auto_wrap_policy": "TRANSFORMER_BASED_WRAP"}
        )
    if impl.startswith("ablate"):
        from ablate.speed.plan import SpeedSwitches

        # every memory path on, whatever this CPU family's speed record (or its lack of one) says
        kw["perf"] = SpeedSwitches.off() if impl == "ablate_plain" else SpeedSwitches(unverified_devices=True)
    side = {"model": model, "tok": tok, "args": common, "callbacks": [rec]}
    if method == "dpo":
        common.update(
            per_device_train_batch_size=1, beta=0.1, precompute_ref_log_probs=True, max_length=length
        )
        train = Dataset.from_list(dpo_rows(length, steps))
        trainer = sides.trainer("dpo", impl, train=train, **side, **kw)
    else:
        fixed = completions(length, tok, steps)
        rng = random.Random(2)
        train = Dataset.from_list([{"prompt": words(PROMPT, rng)} for _ in range(steps)])
        common.update(
            per_device_train_batch_size=GENERATIONS,
            num_generations=GENERATIONS,
            max_completion_length=length - PROMPT,
            beta=0.0,
            temperature=1.0,
        )
        rounds = iter(fixed)

        def rollout(prompts, trainer):  # noqa: ANN001  (TRL's rollout_func: the fixed completions)
            ids = next(rounds)
            prompt_ids = [tok(p, add_special_tokens=False)["input_ids"] for p in prompts]
            return {
                "prompt_ids": prompt_ids,
                "completion_ids": ids,
                "logprobs": [[0.0] * len(c) for c in ids],
            }

        if impl == "trl":
            os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"
            kw["rollout_func"] = rollout
        else:
            kw["generator"] = lambda model, prompt_ids: next(rounds)
        trainer = sides.trainer("grpo", impl, train=train, rewards=(river_count,), **side, **kw)
    trainer.train()
    out = {
        "step_seconds": rec.step_seconds,
        "losses": rec.losses,
        "grad_norms": rec.grad_norms,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "runtime_mb": runtime,
        "rank": rank,
    }
    print(MARK + json.dumps(out), flush=True)
    return out


def _rss_mb(pids: list[int]) -> float:
    """The resident memory of these processes and all their descendants, MB (/proc)."""
    seen, total, todo = set(), 0.0, list(pids)
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        try:
            with open(f"/proc/{pid}/status") as f:
                total += next(int(ln.split()[1]) for ln in f if ln.startswith("VmRSS")) / 1024
            with open(f"/proc/{pid}/task/{pid}/children") as f:
                todo += [int(c) for c in f.read().split()]
        except (OSError, StopIteration):
            continue
    return total


def measure(impl: str, method: str, length: int, steps: int, limit_mb: float) -> dict:
    """One side in its own process(es), stopped if their memory passes `limit_mb`."""
    child = [__file__, "--child", impl, "--method", method, "--lengths", str(length), "--steps", str(steps)]
    if _ranks(impl) > 1:
        ranks = _ranks(impl)
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={ranks}",
            *child,
        ]
    else:
        cmd = [sys.executable, *child]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    over = [0.0]

    def watch() -> None:
        while proc.poll() is None:
            rss = _rss_mb([proc.pid])
            over[0] = max(over[0], rss)
            if rss > limit_mb:
                subprocess.run(["pkill", "-KILL", "-P", str(proc.pid)], check=False)
                proc.kill()
                return
            time.sleep(0.5)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    out, err = proc.communicate()
    thread.join()
    seconds = time.perf_counter() - t0
    if over[0] > limit_mb:
        return {"impl": impl, "length": length, "over": over[0], "process_seconds": seconds}
    if proc.returncode != 0:
        return {"impl": impl, "length": length, "failed": err[-2000:], "process_seconds": seconds}
    ranks = [json.loads(ln.removeprefix(MARK)) for ln in out.splitlines() if ln.startswith(MARK)]
    first = min(ranks, key=lambda r: r["rank"])
    return {
        **first,
        "impl": impl,
        "length": length,
        "peak_rss_mb": max(r["peak_rss_mb"] for r in ranks),  # per rank: the larger
        "process_seconds": seconds,
    }


def _ranks(impl: str) -> int:
    """The ranks a side splits each sequence over (`ablate_sp2`, `ablate_fsdp_sp2`: 2; else 1)."""
    return int(impl.rpartition("_sp")[2]) if "_sp" in impl else 1


def planned_mb(
    method: str, length: int, impl: str, runtime_mb: float = RUNTIME_MB, heap: bool = True
) -> float:
    """`ablate plan`'s total for the side's run on this CPU (ablate.models.memory, device "cpu": the peak
    RSS of one process a rank): fp32, AdamW (fused: transformers' default), gradient checkpointing, DDP
    over the ranks of a split sequence, the chunked head (TRL's fused head: the same) at the CPU's chunk,
    glibc's heap as malloc leaves it (`heap=False`: its mmap threshold fixed), and the libraries'
    `runtime_mb` the run measured."""
    from omegaconf import OmegaConf

    from ablate.cli.plan import meta_model, shape
    from ablate.models.memory import Setup, plan

    m = shape(meta_model(OmegaConf.create({"_target_": "ablate.models.smollm2_135m"})), None)
    ranks = _ranks(impl)
    s = Setup(
        weight_bytes=4,
        autocast=False,
        peft=None,
        optimizer_states=2,
        optimizer_fixed_bytes=None,
        reference=False,
        sequences=2 if method == "dpo" else GENERATIONS,
        seq_len=length,
        checkpointing=True,
        gpus=ranks,
        sharded=impl.startswith("ablate_fsdp"),
        sequence_parallel=ranks,
        chunked_head=impl != "ablate_plain",
        device="cpu",
        runtime_bytes=runtime_mb * 1e6,
        heap_keeps_activations=heap,
    )
    return plan(m, s)["total"] / 1e6


def table(method: str, rows: list[dict]) -> str:
    lines = [
        f"{'tokens/seq':>10} {'impl':12} {'peak RSS MB':>11} {'vs trl':>7} {'s/step':>8} {'plan MB':>8} "
        f"{'plan/peak':>9}  loss / grad norm per step"
    ]
    trl = {r["length"]: r.get("peak_rss_mb") for r in rows if r["impl"] == "trl" and "peak_rss_mb" in r}
    heap = "MALLOC_MMAP_THRESHOLD_" not in os.environ  # the children inherit it: glibc's heap as it is set
    for r in rows:
        if "over" in r:
            lines.append(
                f"{r['length']:>10} {r['impl']:12} {'> ' + format(r['over'], '.0f'):>11}  stopped: over the limit"
            )
            continue
        if "failed" in r:
            lines.append(
                f"{r['length']:>10} {r['impl']:12} failed: {r['failed'].strip().splitlines()[-1][:80]}"
            )
            continue
        ratio = f"{r['peak_rss_mb'] / trl[r['length']]:.2f}x" if trl.get(r["length"]) else "-"
        steps = ", ".join(f"{lo:.6f} / {g:.6f}" for lo, g in zip(r["losses"], r["grad_norms"]))
        plan = planned_mb(method, r["length"], r["impl"], r.get("runtime_mb", RUNTIME_MB), heap=heap)
        lines.append(
            f"{r['length']:>10} {r['impl']:12} {r['peak_rss_mb']:11.0f} {ratio:>7} {r['step_seconds'][-1]:8.1f} "
            f"{plan:8.0f} {plan / r['peak_rss_mb']:9.2f}  {steps}"
        )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--method", choices=["dpo", "grpo"], default="dpo")
    p.add_argument("--lengths", type=int, nargs="+", default=[2048, 4096, 8192, 16384])
    p.add_argument(
        "--impls",
        default="ablate,trl,ablate_sp2",
        help="comma-separated: ablate, ablate_plain, trl, ablate_spN, ablate_fsdp_spN",
    )
    p.add_argument("--steps", type=int, default=2)
    p.add_argument(
        "--limit-mb", type=float, default=9000, help="stop a run whose processes hold more than this"
    )
    p.add_argument("--child", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        run_one(a.child, a.method, a.lengths[0], a.steps)
        return
    load = harness.load_average()
    rows = []
    for length in a.lengths:
        for impl in a.impls.split(","):
            rows.append(measure(impl, a.method, length, a.steps, a.limit_mb))
            print(
                json.dumps({k: v for k, v in rows[-1].items() if k != "failed"}), file=sys.stderr, flush=True
            )
    print(f"{a.method.upper()}, SmolLM2-135M-Instruct, fp32, gradient checkpointing, {a.steps} steps")
    print(table(a.method, rows))
    print(harness.machine())
    print(f"load average before: {load}, after: {harness.load_average()}")
    Path("/tmp/long_context_last.json").write_text(json.dumps(rows))


if __name__ == "__main__":
    main()
