"""A study as a user runs it (hydra/sweeper=optuna, issue 21B): real trials of the tiny DPO task.
A clearly worse trial (an lr of 1e-7 after a good one) is pruned at its first eval and recorded as
`pruned` (summary.json, `ablate ls`, the sweep table, study.db); a driver killed with SIGKILL in the
middle of its second trial, then rerun with --resume, continues the study in study.db: the finished
trial is not repeated, the killed one's parameters run again, and the budget ends it.

Run with `python -m pytest -m slow tests/slow/test_optuna_study.py` (a few minutes on 2 CPU cores).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
optuna = pytest.importorskip("optuna")
TESTS = Path(__file__).resolve().parents[1]
ENV = {
    **os.environ,
    "COLUMNS": "250",
    "WANDB_MODE": "disabled",
    "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
}
SHORT = ["method.args.max_steps=10", "method.args.eval_steps=5", "method.args.logging_steps=5"]
PRUNE = """# @package _global_
defaults:
  - override /hydra/sweeper: optuna
sweep_name: prune_check
method:
  args: {eval_strategy: steps, save_strategy: "no"}
hydra:
  sweeper:
    metric: eval_loss
    n_trials: 2
    pruner: {n_startup_trials: 1}
    enqueue: [{optimizer.optimizer.lr: 0.003}, {optimizer.optimizer.lr: 1.0e-7}]
    params:
      optimizer.optimizer.lr: tag(log, interval(1e-8, 1e-2))
"""


def ablate(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "ablate", *args],
        cwd=cwd,
        env={**ENV, **(env or {})},
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def finished(proc: subprocess.Popen, timeout: int = 900) -> str:
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, out[-3000:]
    return out


def trials(sweep_dir: Path) -> list:
    return optuna.load_study(study_name=None, storage=f"sqlite:///{sweep_dir / 'study.db'}").get_trials()


def test_clearly_worse_trial_is_pruned(tmp_path):
    (tmp_path / "prune.yaml").write_text(PRUNE)
    out = finished(ablate(["sweep", "prune.yaml", *SHORT, f"hydra.sweep.dir={tmp_path / 's'}"], tmp_path))
    assert "2/2 jobs completed (1 pruned)" in out
    good, bad = sorted((tmp_path / "s").glob("[0-9]*"))
    assert json.loads((good / "summary.json").read_text())["status"] == "completed"
    summary = json.loads((bad / "summary.json").read_text())
    assert summary["status"] == "pruned" and summary["pruned_at"] == 5  # its first eval: worse than trial 0's
    assert not (bad / "model").exists()  # stopped: no model saved
    assert [t.state.name for t in trials(tmp_path / "s")] == ["COMPLETE", "PRUNED"]
    ls = subprocess.run(
        [sys.executable, "-m", "ablate", "ls", "s"], cwd=tmp_path, env=ENV, capture_output=True, text=True
    )
    assert " pruned " in ls.stdout and " completed " in ls.stdout


def test_killed_driver_resumes_the_study(tmp_path):
    sweep_dir = tmp_path / "s"
    args = ["sweep", "tune_dpo_beta_lr", "hydra.sweeper.n_trials=3", *SHORT, f"hydra.sweep.dir={sweep_dir}"]
    # Trial 1 kills its own process at step 3: the driver and its in-process trial die at once, mid-trial
    # (a kill timed from outside could land after the short trial had already finished).
    kill = ["+callbacks.kill._target_=crashing.KillAt"]
    proc = ablate([*args, *kill], tmp_path, {"ABLATE_TEST_KILL_AT": "3", "ABLATE_TEST_KILL_JOB": "1"})
    out, _ = proc.communicate(timeout=900)
    assert proc.returncode == -signal.SIGKILL, out[-3000:]
    assert list(sweep_dir.glob("1_*/killed.*"))
    first = next(sweep_dir.glob("0_*"))
    before = (first / "summary.json").read_text()
    assert [t.state.name for t in trials(sweep_dir)] == ["COMPLETE", "RUNNING"]
    out = finished(ablate([*args, *kill, "--resume"], tmp_path))  # the same command; no kill step set now
    assert "the study in study.db" in out
    after = trials(sweep_dir)
    assert [t.state.name for t in after][:3] == ["COMPLETE", "FAIL", "COMPLETE"]
    assert after[3].state.name in ("COMPLETE", "PRUNED")  # a new point: the median pruner may stop it
    assert after[2].params == after[1].params  # the killed trial's parameters ran again, first
    assert (
        after[3].params != after[0].params
    )  # the continued sampler draws new points, not its first ones again
    assert list((sweep_dir / ".replaced").glob("1_*"))  # the killed trial's dir, out of the table
    assert (first / "summary.json").read_text() == before  # the finished trial was not repeated
    assert "best trial" in out
