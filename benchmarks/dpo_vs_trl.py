"""Side by side: ablate's DPOTrainer vs TRL's on the same model, data, optimizer and steps.

    python benchmarks/dpo_vs_trl.py                       # overhead-bound: the tiny model, 40 steps
    python benchmarks/dpo_vs_trl.py --preset compute      # compute-bound: 33.7M Llama, bf16, ~130 tokens/side
    python benchmarks/dpo_vs_trl.py --preset smollm2      # memory: SmolLM2-135M-Instruct, fp32, equal batch
    ... --preset smollm2_bf16                             # the same in bf16 autocast
    ... --impls trl,ablate,ablate_plain --repeats 2       # which sides (alternated), how often
    ... --preset compute --record                         # + each path's CPU verdict for this CPU family

Each run is its own subprocess (so peak memory and start-up are its own), the sides alternated;
benchmarks/harness.py prints the table (s/step, whole-process s, tokens/s, MFU, peak RSS, per-step loss
difference). A second table gives the same in CPU seconds of the measured process (user + system):
with OMP_NUM_THREADS=1 that is what an idle machine's wall clock would show, and it barely moves when
other work shares the cores. Sides: `trl` (TRL 1.16 in its fastest CPU configuration: precomputed
reference, bf16 autocast when the preset uses it, gradient checkpointing off, which TRL's DPOConfig
turns on by default, and transformers' own RMSNorm and MLP modules), `ablate` (defaults: shared prompt,
completion-only logits, padding-free, lean layers), `ablate_plain` (the first three off: TRL's layout),
`ablate_shared`, `ablate_logits` (one each), `ablate_padded` (the defaults but padded), `ablate_heavy`
(the defaults but no lean layers: transformers' RMSNorm and MLP save more for backward), `ablate_lowmem`
(the defaults plus `malloc_mmap_threshold=131072`, applied by the same ablate.process.memory.apply as the CLI's). Tokens/s counts prompt +
completion tokens of both sides (TRL's `num_tokens`) for every side, so the shared prompt shows as
more tokens/s for the same data. Not part of the test run: numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time

import harness  # benchmarks/harness.py (the script's dir is on sys.path)
import sides  # benchmarks/sides.py

PRESETS = {
    # overhead-bound: a small model on the packaged sort task, fp32
    "tiny": dict(hidden=256, layers=4, steps=40, bf16=False, data="sort_prefs", model="tiny"),
    # compute-bound (issue 13): a Llama of hidden 512 x 8 layers (33.7M parameters with the byte
    # vocabulary), batch 8 pairs of ~130 tokens per side, max_length 256, bf16 autocast
    "compute": dict(hidden=512, layers=8, steps=12, bf16=True, data="long_sort", model="tiny"),
    # the real 135M model (49152-token BPE vocabulary), fp32: peak memory at equal batch
    "smollm2": dict(hidden=0, layers=0, steps=2, bf16=False, data="long_sort", model="smollm2"),
    # the same in bf16 autocast: the logits bf16, and accelerate's float32 copy of a model's outputs in play
    "smollm2_bf16": dict(hidden=0, layers=0, steps=2, bf16=True, data="long_sort", model="smollm2"),
}
# the speed switches per side (ablate.speed.plan.SpeedSwitches; default: conf/speed/on.yaml's)
SPEED = {
    "ablate": {},
    "ablate_plain": dict(dpo_pair_rows=False, completion_only_logits=False, padding_free=False),
    "ablate_shared": dict(completion_only_logits=False, padding_free=False),
    "ablate_logits": dict(dpo_pair_rows=False, padding_free=False),
    "ablate_padded": dict(padding_free=False),
    "ablate_heavy": dict(lean_layers=False),
    "ablate_lowmem": {},
}
# the `malloc_mmap_threshold` config key per side (ablate.process.memory; default: malloc as it is)
MALLOC = {"ablate_lowmem": 131072}


def long_sort(n: int, seed: int = 0) -> list[dict[str, str]]:
    """Sort 50-70 random letters: with the byte tokenizer ~70 prompt and ~60 completion tokens per side
    (~130), lengths varying so batches pad; rejected swaps two letters of the sorted answer."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        k = rng.randint(50, 70)
        s = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(k))
        chosen = sorted(s)
        rejected = list(chosen)
        i, j = rng.sample(range(k), 2)
        rejected[i], rejected[j] = rejected[j], rejected[i]
        rows.append(
            {"prompt": f"sort: {s} =", "chosen": " " + "".join(chosen), "rejected": " " + "".join(rejected)}
        )
    return rows


class CPURecorder(harness.StepRecorder):
    """harness.StepRecorder plus each step's CPU seconds (process_time: this process, all threads)."""

    def __init__(self) -> None:
        super().__init__()
        self.cpu_step_seconds: list[float] = []
        self._cpu = 0.0

    def on_train_begin(self, args, state, control, **kwargs) -> None:  # noqa: ANN001
        super().on_train_begin(args, state, control, **kwargs)
        self._cpu = time.process_time()

    def on_step_end(self, args, state, control, **kwargs) -> None:  # noqa: ANN001
        super().on_step_end(args, state, control, **kwargs)
        now = time.process_time()
        self.cpu_step_seconds.append(now - self._cpu)
        self._cpu = now


def run_one(impl: str, preset: dict) -> dict:
    import torch
    from datasets import Dataset

    from ablate.data import packaged
    from ablate.models import smollm2_135m, tiny
    from ablate.process import memory

    memory.apply(
        MALLOC.get(impl)
    )  # as the CLI run (ablate.process.setup.prepare) does, before the model's tensors exist
    torch.manual_seed(0)
    if preset["model"] == "smollm2":
        tok, model = smollm2_135m()  # transformers' own modules: TRL keeps them
    else:
        h = preset["hidden"]
        tok, model = tiny(hidden_size=h, num_layers=preset["layers"], intermediate_size=4 * h)
    steps, batch = preset["steps"], 8
    if preset["data"] == "long_sort":  # one epoch: every precomputed pair is trained on
        train = Dataset.from_list(long_sort(steps * batch))
    else:
        train = packaged(preset["data"], with_eval=False).train
    common = sides.trainer_args(
        f"/tmp/bench-{impl}",
        steps,
        per_device_train_batch_size=batch,
        beta=0.1,
        use_cpu=True,
        bf16=preset["bf16"],
        precompute_ref_log_probs=True,
        gradient_checkpointing=False,
        learning_rate=1e-5 if preset["model"] == "smollm2" else 1e-3,
        max_length=256,
        include_num_input_tokens_seen="non_padding",
    )
    rec = CPURecorder()
    rec.watch(model)
    if impl == "trl":
        rec.watch_trl_fused_head()  # TRL projects through lm_head.weight, not the head module (HW MFU)
    from ablate.speed.plan import SpeedSwitches

    perf = None if impl == "trl" else SpeedSwitches(**SPEED[impl])
    trainer = sides.trainer(
        "dpo", impl, model=model, tok=tok, train=train, args=common, callbacks=[rec], perf=perf
    )
    trainer.train()
    # process_time() here: the whole process's CPU seconds so far (imports, data, precompute, steps)
    return harness.report(
        rec, model, trainer.args, cpu_step_seconds=rec.cpu_step_seconds, process_cpu_s=time.process_time()
    )


# --record: each path's two sides (without it, with it): one switch apart
RECORDED = {
    "dpo_pair_rows": ("ablate_plain", "ablate_shared"),
    "completion_only_logits": ("ablate_plain", "ablate_logits"),
    "padding_free": ("ablate_padded", "ablate"),
    "lean_layers": ("ablate_heavy", "ablate"),
}


def cpu_step(runs: list[dict]) -> float:
    """Median CPU seconds per step, each run's first step left out (warm-up)."""
    return statistics.median(s for r in runs for s in (r["cpu_step_seconds"][1:] or r["cpu_step_seconds"]))


def cpu_table(results: dict[str, list[dict]]) -> str:
    lines = [f"{'impl':14} {'CPU s/step':>10} {'process CPU s':>13} {'tokens/CPU-s':>12}"]
    for impl, runs in results.items():
        tokens = statistics.median(r["tokens"] / len(r["cpu_step_seconds"]) for r in runs)
        step = cpu_step(runs)
        lines.append(
            f"{impl:14} {step:10.3f} {statistics.median(r['process_cpu_s'] for r in runs):13.1f} "
            f"{tokens / step:12.0f}"
        )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    p.add_argument("--steps", type=int, help="override the preset's step count")
    p.add_argument("--hidden", type=int, help="override the preset's hidden size (tiny model)")
    p.add_argument("--layers", type=int, help="override the preset's layer count (tiny model)")
    p.add_argument(
        "--impls", default="trl,ablate", help="comma-separated, alternated: trl, " + ", ".join(SPEED)
    )
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument(
        "--record",
        nargs="?",
        const="",
        metavar="MEASURED_JSON",
        help="write each DPO path's CPU speedup and exactness (the sides in RECORDED) into this CPU "
        "family's record of ablate's measured.json (or of the file given)",
    )
    p.add_argument("--child", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.record is not None and a.child is None:
        missing = {side for pair in RECORDED.values() for side in pair} - set(a.impls.split(","))
        a.impls += "".join(f",{side}" for side in sorted(missing))  # --record runs the sides it compares
    preset = dict(PRESETS[a.preset])
    preset.update({k: v for k, v in (("steps", a.steps), ("hidden", a.hidden), ("layers", a.layers)) if v})
    if a.child:
        run_one(a.child, json.loads(os.environ["BENCH_PRESET"]))
        return
    load = harness.load_average()
    results = harness.run_alternately(
        {impl: [sys.executable, __file__, "--child", impl] for impl in a.impls.split(",")},
        a.repeats,
        env={"BENCH_PRESET": json.dumps(preset)},
    )
    what = (
        "SmolLM2-135M-Instruct"
        if preset["model"] == "smollm2"
        else f"hidden {preset['hidden']} x {preset['layers']} layers"
    )
    harness.print_table(
        f"DPO {a.preset}: {what}, {preset['steps']} steps, batch 8 pairs, CPU, "
        f"{'bf16 autocast' if preset['bf16'] else 'fp32'}",
        results,
        load,
    )
    print(cpu_table(results))
    if a.record is not None:
        print(harness.record_cpu(results, RECORDED, cpu_step, f"DPO {a.preset} ({what})", a.record or None))


if __name__ == "__main__":
    main()
