"""`ablate compare` on a sweep where some runs diverged (NaN or inf: a learning rate of 1e12), and on an
eval.json holding a value that is not a number, from a scratch dir as a user runs it. Run dirs written to
the contract (every number known); tests/slow/test_compare_eval.py trains the real diverging sweep."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

from integration.test_compare import write_run

ENV = {**os.environ, "COLUMNS": "250"}


def ablate(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, "-m", "ablate", *args], cwd=cwd, capture_output=True, text=True, timeout=120, env=ENV
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def write_sweep(tmp_path: Path) -> Path:
    """lr=0.01 x seeds 1-3 (margins 0.1, 0.2, 0.3; seed 3 diverged: NaN in summary.json) and lr=1e12 x seeds
    1-3 (every run diverged: inf in summary.json, NaN in its last logged step)."""
    sweep = tmp_path / "outputs" / "sweeps" / "multirun" / "2026-01-01_00-00-00"
    for num, (lr, seed) in enumerate([(lr, s) for lr in ("0.01", "1e12") for s in (1, 2, 3)]):
        margin = {("0.01", 1): 0.1, ("0.01", 2): 0.2, ("0.01", 3): math.nan}.get((lr, seed), math.inf)
        run = write_run(
            sweep,
            num,
            ["optimizer=sgd", f"optimizer.optimizer.lr={lr}", f"seed={seed}"],
            {"rewards/margins": margin, "rewards/accuracies": 1.0, "loss": 0.6},
        )
        (run / "summary.json").write_text((run / "summary.json").read_text())  # NaN/Infinity: as json writes
    (sweep / "multirun.yaml").write_text("{}\n")
    return sweep


def test_diverged_runs_are_named_left_out_and_the_rest_compared(tmp_path: Path) -> None:
    write_sweep(tmp_path)
    out = ablate("compare", "outputs/sweeps/multirun", cwd=tmp_path).stdout
    assert "Traceback" not in out
    row = next(line for line in out.splitlines() if "lr=0.01" in line and "│" in line)
    assert "2 completed, 1 diverged" in row and "0.15 ± 0.071 (2 of 3)" in row  # margins of seeds 1, 2
    assert "3 diverged" in next(line for line in out.splitlines() if "lr=1e12" in line and "│" in line)
    line = next(line for line in out.splitlines() if line.startswith("diverged"))
    assert line == (
        "diverged (NaN or inf), left out of the statistics: 2_optimizer=sgd,optimizer.optimizer.lr=0.01,seed=3 "
        "(rewards/margins nan); 3_optimizer=sgd,optimizer.optimizer.lr=1e12,seed=1 (rewards/margins inf); "
        "4_optimizer=sgd,optimizer.optimizer.lr=1e12,seed=2 (rewards/margins inf); "
        "5_optimizer=sgd,optimizer.optimizer.lr=1e12,seed=3 (rewards/margins inf); "
        "not compared (no run left): lr=1e12"
    )
    assert "lr=1e12 − lr=0.01" not in out  # nothing to pair with


def test_a_value_that_is_not_a_number_is_named_in_one_line(tmp_path: Path) -> None:
    """Each of the 2 seeds of both arms evaluated; one eval.json says `"eval_loss": "low"`: that arm's cell
    says it is over 1 of its 2 runs, and one line names the file and the value."""
    sweep = tmp_path / "outputs" / "sweeps" / "s" / "2026-01-01_00-00-00"
    for num, (beta, seed) in enumerate([(b, s) for b in ("0.1", "0.5") for s in (1, 2)]):
        run = write_run(sweep, num, [f"method.args.beta={beta}", f"seed={seed}"], {"loss": 0.5})
        value = "low" if num == 3 else 0.4 + 0.1 * num
        (run / "eval.json").write_text(
            json.dumps({"split": "eval", "examples": 8, "metrics": {"eval_loss": value}})
        )
    (sweep / "multirun.yaml").write_text("{}\n")
    out = ablate("compare", "outputs/sweeps/s", "--metric", "eval_loss", cwd=tmp_path).stdout
    bad = sweep.relative_to(tmp_path) / "3_method.args.beta=0.5,seed=2" / "eval.json"  # as the user named it
    assert f"{bad}: eval_loss is 'low', not a number: left out of this run's metrics" in out
    row = next(line for line in out.splitlines() if "beta=0.5" in line and "│" in line)
    assert "0.6 (1 of 2)" in row
