"""The flagship path, as a user runs it from a scratch dir: a 3-seed sigmoid-vs-hinge `ablate sweep dpo_loss`
(tiny model, 2 steps, one eval on the held-out pairs at the end), then `ablate compare`: t intervals and
verdicts on the held-out metrics, and the two losses' `loss` values not ranked. (`ablate eval` on each run
instead of the eval during training: tests/slow/test_compare_eval.py.)"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

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


def test_dpo_loss_sweep_then_compare_ranks_held_out_metrics_not_the_losses(tmp_path: Path) -> None:
    ablate(
        "sweep",
        "dpo_loss",
        "method.args.max_steps=2",
        "method.args.save_strategy=no",
        "method.args.eval_strategy=steps",
        "method.args.eval_steps=2",
        cwd=tmp_path,
    )
    out = ablate("compare", "outputs/sweeps/dpo_loss", cwd=tmp_path)
    header = next(line for line in out.splitlines() if line.startswith("┃ group"))
    assert "eval_rewards/margins" in header and "eval_loss" in header and " loss " not in header
    assert (
        "not compared: eval_loss is defined by each arm's dpo_loss (sigmoid vs hinge); ranking the held-out "
        "metrics instead"
    ) in out
    assert "95% t interval over the per-seed differences (assumes they are roughly normal" in out
    verdict = re.search(
        r"dpo_loss=hinge − dpo_loss=sigmoid eval_rewards/margins = [-+][\d.e-]+ \[[-+][\d.e-]+, "
        r"[-+][\d.e-]+\], n=3 pairs: (.*)",
        out,
    )
    assert verdict, out
    assert verdict.group(1).startswith(
        ("dpo_loss=hinge higher", "dpo_loss=hinge lower", "no clear difference")
    )
    assert (
        "eval_loss = " not in out and " loss = " not in out
    )  # the two objectives' values are never differenced
