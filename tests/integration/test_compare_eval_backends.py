"""`ablate compare` on runs evaluated by every backend (eval.json and eval_examples.jsonl as `ablate eval` writes
them for eval=[heldout,lm_eval,judge]), from a scratch dir as a user runs it: held-out, downstream and judged
metrics ranked side by side, the losses and the standard errors not; `--wandb` logs the comparison to the
sweep's W&B group, read back from the offline files."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from integration.test_compare import write_run
from unit.test_comparable import composed

ENV = {**os.environ, "COLUMNS": "300"}
WANDB = shutil.which("wandb") or str(Path(sys.executable).with_name("wandb"))
# per (loss, seed): eval_rewards/margins, lm_eval exact match, judge win rate
NUMBERS = {
    ("sigmoid", 1): (0.2, 0.50, 0.50),
    ("sigmoid", 2): (0.3, 0.75, 0.55),
    ("sigmoid", 3): (0.25, 0.50, 0.45),
    ("hinge", 1): (0.6, 0.75, 0.70),
    ("hinge", 2): (0.7, 1.00, 0.80),
    ("hinge", 3): (0.65, 0.75, 0.75),
}
DOCS = 8  # lm-eval documents and judged prompts per run


def ablate(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, "-m", "ablate", *args], cwd=cwd, capture_output=True, text=True, timeout=300, env=ENV
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


@pytest.fixture
def sweep(tmp_path: Path) -> Path:
    root = tmp_path / "outputs" / "sweeps" / "dpo_loss" / "2026-01-01_00-00-00"
    configs = {v: composed("method=dpo", f"method/dpo_loss={v}") for v in ("sigmoid", "hinge")}
    for num, ((loss, seed), (margin, exact, win)) in enumerate(NUMBERS.items()):
        run = write_run(
            root,
            num,
            ["sweep_name=dpo_loss", f"method/dpo_loss={loss}", f"seed={seed}"],
            {"rewards/margins": margin, "rewards/accuracies": 1.0, "loss": 0.5},
        )
        (run / ".hydra" / "config.yaml").write_text(yaml.safe_dump({**configs[loss], "seed": seed}))
        (run / "run.json").write_text(json.dumps({"wandb_group": "dpo_loss/2026-01-01_00-00-00"}))
        metrics = {
            "eval_rewards/margins": margin,
            "eval_loss": 1 - margin,
            "lm_eval/ablate_sort/exact_match": exact,
            "lm_eval/ablate_sort/exact_match_stderr": 0.1,
            "judge/win_rate": win,
            "judge/lc_win_rate": win,
            "judge/score_diff": win - 0.5,
            "judge/baseline_score": -1.0,
        }
        record = {
            "evals": ["heldout", "lm_eval", "judge"],
            "split": "eval",
            "examples": DOCS,
            "metrics": metrics,
        }
        (run / "eval.json").write_text(json.dumps(record))
        rows = [
            {"id": f"lm_eval/ablate_sort/{d}", "eval": "lm_eval", "lm_eval/ablate_sort/exact_match": float(d < exact * DOCS)}
            for d in range(DOCS)
        ] + [
            {"id": f"judge/{d}", "eval": "judge", "judge/win_rate": float(d < win * DOCS), "prompt": "sort: cba ="}
            for d in range(DOCS)
        ]  # fmt: skip
        (run / "eval_examples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "multirun.yaml").write_text("{}\n")
    return tmp_path


def test_every_backends_metrics_are_ranked_and_the_losses_are_not(sweep: Path) -> None:
    out = ablate("compare", "outputs/sweeps/dpo_loss", cwd=sweep).stdout
    header = next(line for line in out.splitlines() if line.startswith("┃ group"))
    for column in (
        "eval_rewards/margins",
        "lm_eval/ablate_sort/exact_match",
        "judge/win_rate",
        "judge/lc_win_rate",
    ):
        assert column in header, column
    assert "stderr" not in header and "baseline_score" not in header and " eval_loss " in header
    assert "not compared: eval_loss is defined by each arm's dpo_loss (sigmoid vs hinge)" in out
    assert "eval_loss = " not in out
    # seed-paired: hinge − sigmoid judge/win_rate = 0.2, 0.25, 0.3 (mean 0.25, sd 0.05): t 8.66, 2 df
    assert "dpo_loss=hinge − dpo_loss=sigmoid judge/win_rate = +0.25 [+0.1258, +0.3742], n=3 pairs" in out
    # per example: the lm-eval documents and the judged prompts, paired by id
    assert "dpo_loss=hinge − dpo_loss=sigmoid eval lm_eval/ablate_sort/exact_match = " in out
    assert "n=8 examples" in out
    words = out.split("\nin words")[1]
    assert "clear: dpo_loss=hinge higher than dpo_loss=sigmoid on judge/win_rate (" in words
    # +0.25 in every pair (p 0 to the float's precision): clear after the adjustment too
    assert "clear: dpo_loss=hinge higher than dpo_loss=sigmoid on lm_eval/ablate_sort/exact_match (" in words
    assert (
        ", 6 metrics: " in words
    )  # margins, accuracies, exact match, win rate, LC win rate, score difference


def test_compare_wandb_logs_the_comparison_to_the_sweeps_group(sweep: Path) -> None:
    pytest.importorskip("wandb")
    out = ablate("compare", "outputs/sweeps/dpo_loss", "--wandb", cwd=sweep).stdout
    launch = sweep / "outputs" / "sweeps" / "dpo_loss" / "2026-01-01_00-00-00"
    assert "W&B: the comparison logged to group dpo_loss/2026-01-01_00-00-00 (offline: " in out
    proc = subprocess.run(
        [WANDB, "leet", "inspect", "--json", str(launch / "wandb")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    records = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    run = next(r["run"] for r in records if r["type"] == "run")
    assert run["run_group"] == "dpo_loss/2026-01-01_00-00-00" and run["job_type"] == "compare"
    tables = {
        p.name.split("_")[0]: json.loads(p.read_text())
        for p in launch.glob("wandb/offline-run-*/files/media/table/compare/*.json")
    }
    assert set(tables) == {"arms", "differences", "verdicts"}
    assert tables["arms"]["columns"][:3] == ["group", "runs", "status"]
    assert [row[0] for row in tables["arms"]["data"]] == ["dpo_loss=sigmoid", "dpo_loss=hinge"]
    assert any("judge/win_rate = +0.25" in row[0] for row in tables["differences"]["data"])
    assert any(row[0].startswith("clear: dpo_loss=hinge higher") for row in tables["verdicts"]["data"])


def test_compare_wandb_on_runs_without_wandb_is_one_line(sweep: Path) -> None:
    pytest.importorskip("wandb")
    for run_json in sweep.rglob("run.json"):
        run_json.write_text("{}")
    proc = subprocess.run(
        [sys.executable, "-m", "ablate", "compare", "outputs/sweeps/dpo_loss", "--wandb"],
        cwd=sweep, capture_output=True, text=True, timeout=300, env=ENV,
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "ablate: error: --wandb: these runs did not log to W&B (no wandb_group in their run.json: train them "
        "with logger=wandb), so there is no group to log the comparison to"
    ]
    assert not list(sweep.rglob("wandb"))
