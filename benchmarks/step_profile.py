"""What a DPO training step asks of the device, counted on a CPU, per side, for one forward + backward
(`Trainer.training_step`, after one warm-up step). `--measure ops`: ops dispatched (on a GPU, about one
kernel launch each: a cost in Python and launch time the GPU waits through when kernels are small) and the
ops that make the host wait for the device (on a GPU: `.item()`, `.tolist()`, `nonzero`, boolean indexing,
`if tensor:`). `--measure memory`: the step's peak of live tensor bytes (torch's MemTracker, which counts
every tensor storage as it is made and freed: what `torch.cuda.max_memory_allocated` counts on a GPU, less
the caching allocator's rounding), parameters and gradients included, optimizer state not (no optimizer step).

    OMP_NUM_THREADS=1 python benchmarks/step_profile.py [--impls trl,ablate_off,ablate_forced] [--vocab 49152]
    python benchmarks/step_profile.py --measure memory --impls trl,ablate_off,ablate_completion_only_logits \
        --shape 0.5b --side 192

The GPU's own numbers are benchmarks/gpu.py's; this is why they could differ, measured where there is no GPU:
torch.profiler's op events are the same dispatches a CUDA run makes (the same Python runs), only their
durations are the CPU's. Each side runs in its own process; sides: `trl` (TRL 1.16's DPOTrainer, its
fastest configuration), `ablate_off` (speed=off), `ablate_forced` (every speed path, as forced on a GPU by
speed.unverified_devices=true), `ablate_<path>` (that path alone, e.g. ablate_lean_layers). Not part of the
test run.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
from typing import Any

# ops that wait for the device on a GPU: a scalar read (item, bool(tensor), int(tensor)), a data-dependent
# output size (nonzero: boolean indexing, masked_select, repeat_interleave without output_size), a copy to the host
SYNCS = (
    "aten::_local_scalar_dense",
    "aten::nonzero",
    "aten::masked_select",
    "aten::is_nonzero",
    "aten::repeat_interleave",
    "aten::unique",
    "aten::_unique2",
)


def profile_side(
    impl: str,
    vocab: int,
    hidden: int,
    layers: int,
    side: int = 128,
    measure: str = "ops",
    shape: str | None = None,
) -> dict[str, Any]:
    import torch
    from datasets import Dataset
    from torch.profiler import ProfilerActivity, profile

    sys.path.insert(0, os.path.dirname(__file__))
    from gpu_sides import build, pairs, perf_of, wide_tokenizer
    from transformers import LlamaConfig, LlamaForCausalLM

    if shape:  # benchmarks/gpu.py's model of that name (gpu_sides.SHAPES)
        tok, model = build(shape, "cpu")
    else:
        tok = wide_tokenizer(vocab)
        torch.manual_seed(0)
        model = LlamaForCausalLM(
            LlamaConfig(
                vocab_size=vocab,
                hidden_size=hidden,
                num_hidden_layers=layers,
                num_attention_heads=8,
                num_key_value_heads=4,
                intermediate_size=4 * hidden,
                pad_token_id=tok.pad_token_id,
                eos_token_id=tok.eos_token_id,
                tie_word_embeddings=True,
            )
        )
    rows = Dataset.from_list(pairs(16, side))
    common = dict(
        output_dir="/tmp/ablate-sync-profile",
        per_device_train_batch_size=8,
        report_to="none",
        use_cpu=True,
        max_length=512,
        precompute_ref_log_probs=True,
        disable_tqdm=True,
        bf16=True,
    )
    if impl == "trl":
        import trl

        trainer = trl.DPOTrainer(
            model=model,
            ref_model=None,
            train_dataset=rows,
            processing_class=tok,
            args=trl.DPOConfig(gradient_checkpointing=False, **common),
        )
    else:
        from ablate.methods.dpo import DPOConfig, DPOTrainer

        name = impl.removeprefix("ablate_")
        spec = {"off": "off", "forced": {"unverified_devices": True}}.get(name, name)  # or one path alone
        trainer = DPOTrainer(
            model=model,
            args=DPOConfig(**common),
            train_dataset=rows,
            processing_class=tok,
            perf=perf_of(spec),
        )
    batches = iter(trainer.get_train_dataloader())
    trainer.create_optimizer_and_scheduler(num_training_steps=2)
    model = trainer.accelerator.prepare_model(model)  # Trainer.train does: the bf16 autocast around forward
    trainer.current_gradient_accumulation_steps = 1  # what Trainer.train sets before its steps
    model.train()
    trainer.training_step(model, next(batches))  # warm-up
    batch = next(batches)
    if measure == "memory":
        return {"impl": impl, **peak_bytes(trainer, model, batch)}
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        trainer.training_step(model, batch)
    counts = collections.Counter(e.name for e in prof.events() if e.name.startswith("aten::"))
    top = [e for e in prof.key_averages() if e.key.startswith("aten::")]
    return {
        "impl": impl,
        "ops": sum(counts.values()),
        "syncs": {k: counts[k] for k in SYNCS if counts[k]},
        "top": [(e.key, e.count) for e in sorted(top, key=lambda e: -e.count)[:12]],
    }


def peak_bytes(trainer: Any, model: Any, batch: Any) -> dict[str, int]:
    """The peak of live tensor bytes over one `training_step` (MemTracker: every storage made and freed),
    and what was live before it (the parameters, their gradients from the warm-up step)."""
    import torch
    from torch.distributed._tools.mem_tracker import MemTracker

    tracker = MemTracker()
    tracker.track_external(model)
    with tracker:
        before = tracker.get_tracker_snapshot("current")
        trainer.training_step(model, batch)
    peak = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]
    return {"peak": peak["Total"], "before": before.get(torch.device("cpu"), {}).get("Total", 0)}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--impls", default="trl,ablate_off,ablate_forced")
    p.add_argument("--vocab", type=int, default=49152)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument(
        "--shape",
        help="a model of benchmarks/gpu.py by name (gpu_sides.SHAPES: 0.5b, 1.5b, ...), "
        "instead of --hidden/--layers/--vocab",
    )
    p.add_argument("--side", type=int, default=128, help="~tokens a side (prompt + completion) of each pair")
    p.add_argument("--measure", choices=("ops", "memory"), default="ops")
    p.add_argument("--child", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        print(
            json.dumps(profile_side(a.child, a.vocab, a.hidden, a.layers, a.side, a.measure, a.shape)),
            flush=True,
        )
        return
    what = "peak live tensor bytes" if a.measure == "memory" else "ops dispatched and host-syncing ops"
    model = f"the {a.shape} Llama" if a.shape else f"Llama {a.hidden} x {a.layers} layers, vocab {a.vocab}"
    print(
        f"DPO, one training step (forward + backward), 8 pairs of ~{a.side} tokens a side, {model}, bf16 "
        f"autocast on a CPU: {what}"
    )
    first = None
    for impl in a.impls.split(","):
        proc = subprocess.run(
            [
                sys.executable,
                __file__,
                "--child",
                impl,
                "--vocab",
                str(a.vocab),
                "--hidden",
                str(a.hidden),
                "--layers",
                str(a.layers),
                "--side",
                str(a.side),
                "--measure",
                a.measure,
                *(["--shape", a.shape] if a.shape else []),
            ],
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            print(f"{impl}: failed\n{proc.stderr[-2000:]}")
            continue
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        if a.measure == "memory":
            first = first or r
            step = lambda x: (x["peak"] - x["before"]) / 2**20  # noqa: E731
            print(
                f"{impl:32} peak {r['peak'] / 2**20:9.1f} MB ({r['peak'] / first['peak']:.3f}x {first['impl']}), "
                f"above what was live before the step {step(r):9.1f} MB ({step(r) / step(first):.3f}x)"
            )
            continue
        syncs = sum(r["syncs"].values())
        print(
            f"\n{impl:14} {r['ops']:6d} aten ops, {syncs:4d} syncing: "
            + ", ".join(f"{k.removeprefix('aten::')} {v}" for k, v in r["syncs"].items())
        )
        print("  most frequent: " + ", ".join(f"{k.removeprefix('aten::')} {v}" for k, v in r["top"]))


if __name__ == "__main__":
    main()
