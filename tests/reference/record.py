"""Record the reference curves (tests/reference/curves.json): one short tiny-model CPU run per method,
with the CPU and library versions they were recorded on, and how far other CPU kernels move each step
(the spread). Rerun only on purpose (a deliberate numerical change, or new library versions):

    python tests/reference/record.py                (every method: values, then the spread)
    python tests/reference/record.py rloo distill   (only these: a new method; the others' kept)
    python tests/reference/record.py --add-cpu      (another CPU, code unchanged: widen the spread by it)

tests/integration/test_reference_curves.py replays each run and compares every step with `tolerance`:
MARGIN times the largest deviation measured up to that step, and never less than FLOOR of the value.
The spread is measured by rerunning each curve under every entry of KERNELS (tests/reference/README.md
has the numbers and why these variants); `--add-cpu` on a CPU of another family adds that CPU's own
curves and variants, each compared with the recorded values.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
CURVES = HERE / "curves.json"
sys.path.insert(0, str(HERE.parent))

from conftest import ablate, metrics  # noqa: E402

# per method: the overrides of its reference run (short, logged every step)
RUNS = {
    "dpo": ["method=dpo", "method.args.max_steps=20"],
    "dpo_hinge": ["method=dpo_hinge", "method.args.max_steps=20"],
    "sft": ["method=sft", "method.args.max_steps=20"],
    "grpo": ["method=grpo", "method.args.max_steps=12", "method.args.steps_per_generation=2"],
    "reward": ["method=reward", "method.args.max_steps=20"],
    "kto": ["method=kto", "method.args.max_steps=20"],
    "rloo": ["method=rloo", "method.args.max_steps=12", "method.args.steps_per_generation=2"],
    "distill": ["method=distill", "method.args.max_steps=12"],
}
COMMON = ["method.args.logging_steps=1", "method.args.save_strategy=no"]
# GRPO's and RLOO's loss is ~0 by design (advantages centred): their reward is the curve, and the policy's
# entropy beside it (the reward is a count of letters: a 1% change of lr leaves it bit-identical for 12 steps)
KEYS = {
    "dpo": ["loss"],
    "dpo_hinge": ["loss"],
    "sft": ["loss"],
    "grpo": ["reward", "entropy"],
    "reward": ["loss"],
    "kto": ["loss"],
    "rloo": ["reward", "entropy"],
    "distill": ["loss"],
}
# The kernels one x86 machine can switch between: ATen's vector kernels (ATEN_CPU_CAPABILITY), MKL's GEMMs
# (MKL_ENABLE_INSTRUCTIONS), oneDNN's (ONEDNN_MAX_CPU_ISA), and the thread count; each run on one thread
# unless it says otherwise. "avx2_cpu" is an AVX2-only CPU's choice of all three, "no_vectors" none at all.
KERNELS = {
    "aten_avx2": {"ATEN_CPU_CAPABILITY": "avx2"},
    "aten_default": {"ATEN_CPU_CAPABILITY": "default"},
    "threads2": {"OMP_NUM_THREADS": "2"},
    "avx2_cpu": {
        "ATEN_CPU_CAPABILITY": "avx2",
        "MKL_ENABLE_INSTRUCTIONS": "AVX2",
        "ONEDNN_MAX_CPU_ISA": "AVX2",
    },
    "no_vectors": {
        "ATEN_CPU_CAPABILITY": "default",
        "MKL_ENABLE_INSTRUCTIONS": "SSE4_2",
        "ONEDNN_MAX_CPU_ISA": "SSE41",
    },
}
KERNEL_VARS = ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA")
# Leaving one variant out, the others' spread predicted it within 0.74x of MARGIN=3 (README): 10 leaves room
# for a CPU none of them is, and stays below what a real change moves (the closest, lr x 1.01 on the reward
# model, is 7x over it)
MARGIN = 10.0
FLOOR = 1e-6  # relative: where every kernel gave the same value (step 0), only float32 rounding is allowed


def versions() -> dict[str, str]:
    return {p: metadata.version(p) for p in ("torch", "transformers", "accelerate")}


def machine(threads: int = 1) -> dict[str, Any]:
    """What a curve's rounding depends on besides the code and `versions()`: the CPU, the kernels torch
    picks on it (ATEN_CPU_CAPABILITY and the like, set, move them), the thread count."""
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    return {
        "cpu": cpu,
        "arch": platform.machine(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "threads": threads,
        "kernel_env": {k: os.environ[k] for k in KERNEL_VARS if k in os.environ},
    }


def curve(method: str, *overrides: str, env: dict[str, str] | None = None) -> dict[str, list[float]]:
    """Per-step values of the method's key metrics in a fresh run of its reference overrides (and `overrides`;
    `env`: on top of one thread, e.g. a kernel variant)."""
    with tempfile.TemporaryDirectory() as tmp:
        r = ablate(
            "train",
            *RUNS[method],
            *COMMON,
            *overrides,
            f"hydra.run.dir={tmp}/run",
            env={"OMP_NUM_THREADS": "1", **(env or {})},
        )
        if r.returncode != 0:
            raise RuntimeError(r.stderr[-2000:])
        events = [
            e for e in metrics(Path(tmp) / "run") if "train_loss" not in e
        ]  # not the end-of-train summary
        return {k: [e[k] for e in events if k in e] for k in KEYS[method]}


def tolerance(values: list[float], spread: list[float]) -> list[float]:
    """Per step: MARGIN x the largest deviation measured up to it (rounding differences grow as training
    goes on, never shrink), at least FLOOR of the value."""
    out, widest = [], 0.0
    for v, s in zip(values, spread):
        widest = max(widest, s)
        out.append(max(MARGIN * widest, FLOOR * abs(v)))
    return out


def widen(entry: dict[str, Any], method: str, runs: dict[str, dict[str, list[float]]]) -> None:
    """Widen each recorded metric's per-step spread by how far each of `runs` (name -> curve) is from it."""
    for key, rec in entry["metrics"].items():
        for got in (r for r in runs.values() if key in r):  # an older recording may lack a metric
            if len(got[key]) != len(rec["values"]):
                raise SystemExit(f"{method} {key}: {len(got[key])} steps, recorded {len(rec['values'])}")
            rec["spread"] = [max(s, abs(g - v)) for s, g, v in zip(rec["spread"], got[key], rec["values"])]


def _variants(method: str, here: bool) -> dict[str, dict[str, list[float]]]:
    """This machine's curves under each kernel variant (and, `here`, with no variant)."""
    out = {"as is": curve(method)} if here else {}
    for name, env in KERNELS.items():
        out[name] = curve(method, env=env)
        print(f"  {method}: {name}", flush=True)
    return out


def record(only: list[str]) -> None:
    old = json.loads(CURVES.read_text()) if only else {"runs": {}}
    if only and old["versions"] != versions():
        raise SystemExit(
            f"curves.json was recorded with {old['versions']}, this is {versions()}: record every method"
        )
    if only and old["recorded_on"] != machine():
        raise SystemExit(
            f"curves.json was recorded on {old['recorded_on']}, this is {machine()}: record every method"
        )
    runs = {}
    for m in RUNS:
        if only and m not in only:
            runs[m] = old["runs"][m]
            continue
        runs[m] = {
            "overrides": RUNS[m],
            "metrics": {k: {"values": v, "spread": [0.0] * len(v)} for k, v in curve(m).items()},
        }
        widen(runs[m], m, _variants(m, here=False))
    here = {**machine(), "variants": sorted(KERNELS)}
    out = {
        "versions": versions(),
        "recorded_on": machine(),
        "common": COMMON,
        "spread_measured_on": [here] if not only else old["spread_measured_on"],
        "runs": runs,
    }
    CURVES.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {CURVES} with {out['versions']} on {out['recorded_on']}")


def add_cpu() -> None:
    """This CPU (another family, same code and versions): its curves and kernel variants join the spread."""
    cur = json.loads(CURVES.read_text())
    if cur["versions"] != versions():
        raise SystemExit(
            f"curves.json was recorded with {cur['versions']}, this is {versions()}: "
            "install -c constraints.txt first"
        )
    for m in RUNS:
        widen(cur["runs"][m], m, _variants(m, here=True))
    cur["spread_measured_on"].append({**machine(), "variants": ["as is", *sorted(KERNELS)]})
    CURVES.write_text(json.dumps(cur, indent=1) + "\n")
    print(f"widened the spread in {CURVES} by {machine()}")


if __name__ == "__main__":
    args = sys.argv[1:]
    add_cpu() if args == ["--add-cpu"] else record(args)
