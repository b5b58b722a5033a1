"""The README's path to a verdict, from a scratch dir: `ablate sweep dpo_loss` (3 seeds, tiny model, 2 steps),
`ablate compare` (training metrics ranked, the losses' `loss` not), `ablate eval` on every run, `ablate compare`
again (held-out metrics ranked instead, with t intervals and per-example differences).

Run with `python -m pytest -m slow tests/slow/test_compare_eval.py -n 0` (a few minutes on 2 CPU cores)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
ENV = {**os.environ, "COLUMNS": "250", "WANDB_MODE": "disabled"}


def ablate(*args: str, cwd: Path) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "ablate", *args],
        cwd=cwd,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def test_sweep_compare_eval_compare(tmp_path: Path) -> None:
    ablate("sweep", "dpo_loss", "method.args.max_steps=2", cwd=tmp_path)
    before = ablate("compare", "outputs/sweeps/dpo_loss", cwd=tmp_path)
    assert (
        "not compared: loss is defined by each arm's dpo_loss (sigmoid vs hinge); ranking the others instead "
        "(`ablate eval RUN_DIR` on each run adds held-out ones)"
    ) in before
    assert "dpo_loss=hinge − dpo_loss=sigmoid rewards/margins = " in before and " loss = " not in before

    runs = sorted(p for p in (tmp_path / "outputs" / "sweeps" / "dpo_loss").glob("*/[0-9]*") if p.is_dir())
    assert len(runs) == 6
    for run in runs:
        ablate("eval", str(run), "data.max_eval_samples=16", cwd=tmp_path)
    after = ablate("compare", "outputs/sweeps/dpo_loss", cwd=tmp_path)
    assert (
        "not compared: eval_loss is defined by each arm's dpo_loss (sigmoid vs hinge); ranking the held-out "
        "metrics instead"
    ) in after
    assert "dpo_loss=hinge − dpo_loss=sigmoid eval_rewards/margins = " in after and "n=3 pairs" in after
    assert "n=16 examples" in after  # per-example differences on the held-out pairs
    assert (
        "sigmoid rewards/margins = " not in after and "eval_loss = " not in after
    )  # the training metric gave way


def test_a_sweep_with_diverged_runs_compares(tmp_path: Path) -> None:
    """The diverging sweep as a user types it (SGD at lr 0.01 and 1e12, 3 seeds): the 1e12 runs end in NaN
    (NaNGuard stops them), and compare names them in one line and compares the rest, with no traceback."""
    proc = subprocess.run(
        [sys.executable, "-m", "ablate", "train", "-m", "optimizer=sgd", "optimizer.optimizer.lr=0.01,1e12"]
        + ["seed=1,2,3", "method.args.max_steps=10"],
        cwd=tmp_path,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert proc.returncode == 1 and "3 sweep job(s) failed" in proc.stderr, proc.stderr[-3000:]
    out = ablate("compare", "outputs/sweeps/multirun", cwd=tmp_path)
    assert "3 completed" in out and "3 diverged" in out
    line = next(line for line in out.splitlines() if line.startswith("diverged (NaN or inf)"))
    assert line.count("nan at step") == 3 and line.endswith("not compared (no run left): lr=1000000000000.0")
