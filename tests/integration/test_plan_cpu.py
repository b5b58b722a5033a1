"""`ablate plan --cpu` from a scratch dir against the peak resident memory of the run it plans: a real
`ablate train` in a fresh interpreter whose only child is the run (its getrusage(RUSAGE_CHILDREN) is that
run's peak). The tiny model's memory is mostly the libraries' (the plan measures them in its own process);
the activations' and AdamW's CPU terms are checked at SmolLM2 scale by tests/unit/test_memory_plan.py and the
long-context benchmark's slow test."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from conftest import ablate

PEAK = (
    "import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True, capture_output=True); "
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)"  # KiB on Linux
)
SEQ = "48"  # the tiny data's rows (prompt and completion) hold fewer tokens than this


def _total(out: str) -> float:
    value, unit = re.search(r"^  total\s+([\d.]+) (GB|MB)$", out, re.M).groups()
    return float(value) * (1e9 if unit == "GB" else 1e6)


def _plan(tmp_path, *args: str, fresh: bool = True) -> str:
    """The plan's output; `fresh`: in a new interpreter, whose resident memory the plan measures as a run's."""
    r = ablate("plan", *args, "--cpu", cwd=tmp_path, fresh=fresh)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


@pytest.mark.slow  # a real run a method (~30 s each)
@pytest.mark.parametrize("method", ["dpo", "grpo"])
def test_the_cpu_plan_is_within_a_fifth_of_the_runs_peak(tmp_path, method):
    run = [f"method={method}", "method.args.max_steps=3"]
    peak = subprocess.run(
        [sys.executable, "-c", PEAK, sys.executable, "-m", "ablate", "train", *run, "hydra.run.dir=out"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert peak.returncode == 0, peak.stderr[-2000:]
    measured = float(peak.stdout.split()[-1])
    out = _plan(tmp_path, *run, "--seq-len", SEQ)
    assert "per process:" in out and "fits in" in out, out
    runtime = float(re.search(r"^  runtime\s+([\d.]+) GB$", out, re.M).group(1)) * 1e9
    assert 0.2e9 < runtime < measured  # the libraries as this process loaded them, short of the run's peak
    assert 0.8 <= _total(out) / measured <= 1.2, (out, measured)
    # at the method's max_length (longer than the tiny rows) the plan is an upper bound
    assert _total(_plan(tmp_path, *run)) >= measured


def test_on_a_cpu_adamw_steps_one_tensor_at_a_time_unless_told_foreach(tmp_path):
    # torch.optim.AdamW's default on CPU tensors is the single-tensor loop (on CUDA ones foreach: a copy of
    # every trainable tensor); the plan's `step` row follows the optimizer node
    single = _plan(tmp_path, "model=smollm2_135m", "method=sft", fresh=False)
    foreach = _plan(
        tmp_path, "model=smollm2_135m", "method=sft", "+optimizer.optimizer.foreach=true", fresh=False
    )
    step = [re.search(r"^  step\s+([\d.]+) (GB|MB)$", o, re.M).groups() for o in (single, foreach)]
    assert step[1] == ("0.54", "GB")  # 134.5M fp32 parameters: one copy
    assert step[0][1] == "GB" and float(step[0][0]) < 0.54
