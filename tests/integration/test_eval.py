"""Evaluation at the end of a run and `ablate eval`, from a scratch dir as a user runs them: `eval=[heldout]` on
`ablate train` lands in eval.json and in the run's own W&B run (offline files read back); a completed run run
again evaluates only what eval.json lacks (what a job killed while it evaluated does), and never retrains; each
mistake is one line with nothing written. lm-eval's real runs, a job killed mid-eval and the flagship sweep:
tests/slow/test_eval_jobs.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ENV = {**os.environ, "COLUMNS": "250"}
WANDB = shutil.which("wandb") or str(Path(sys.executable).with_name("wandb"))
TRAIN = [
    "train",
    "method.args.max_steps=1",
    "method.args.save_strategy=no",
    "data.max_eval_samples=4",
    "eval=[heldout]",
    "logger=wandb",
    "hydra.run.dir=outputs/run",
]


def ablate(*args: str, cwd: Path, code: int = 0) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, "-m", "ablate", *args], cwd=cwd, capture_output=True, text=True, timeout=900, env=ENV
    )
    assert proc.returncode == code, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess]:
    pytest.importorskip("wandb")
    cwd = tmp_path_factory.mktemp("eval")
    return cwd, ablate(*TRAIN, cwd=cwd)


def summaries(offline: Path) -> dict:
    """Every summary value an offline W&B run dir holds, as wandb's own reader prints them."""
    proc = subprocess.run(
        [WANDB, "leet", "inspect", "--json", str(offline)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    out: dict = {}
    for line in proc.stdout.splitlines():
        record = json.loads(line) if line.strip() else {}
        if record.get("type") == "summary":
            out.update(record["summary"].get("update") or {})
    return out


def test_the_run_ends_evaluated_and_wandb_holds_the_same_numbers(
    trained: tuple[Path, subprocess.CompletedProcess],
) -> None:
    cwd, proc = trained
    run = cwd / "outputs" / "run"
    record = json.loads((run / "eval.json").read_text())
    assert record["evals"] == ["heldout"] and record["split"] == "eval" and record["examples"] == 4
    accuracy = record["metrics"]["eval_rewards/accuracies"]
    assert "evaluating: heldout" in proc.stdout + proc.stderr
    line = next(t for t in (proc.stdout + proc.stderr).splitlines() if t.startswith("eval.json: "))
    assert f"eval_rewards/accuracies {accuracy:.4g}" in line and "eval_runtime" not in line
    rows = [json.loads(line) for line in (run / "eval_examples.jsonl").read_text().splitlines()]
    assert len(rows) == 4 and all(r["eval"] == "heldout" for r in rows)
    # the job's own W&B run (one id, run.json's), resumed for the eval: its summary holds eval.json's numbers
    run_id = json.loads((run / "run.json").read_text())["wandb_run_id"]
    offline = sorted((run / "wandb").glob("offline-run-*"))
    assert len(offline) == 2 and all(p.name.endswith(run_id) for p in offline)
    logged = summaries(offline[-1])
    assert logged["eval/rewards/accuracies"] == pytest.approx(accuracy)
    assert logged["eval/rewards/margins"] == pytest.approx(record["metrics"]["eval_rewards/margins"])


def test_a_completed_run_evaluates_only_what_eval_json_lacks(
    trained: tuple[Path, subprocess.CompletedProcess],
) -> None:
    """As a job killed while it evaluated: eval.json missing. The same command again evaluates and does not
    train (metrics.jsonl and summary.json keep every byte); once more, there is nothing to do."""
    cwd, _ = trained
    run = cwd / "outputs" / "run"
    kept = {name: (run / name).read_bytes() for name in ("metrics.jsonl", "summary.json")}
    before = json.loads((run / "eval.json").read_text())
    (run / "eval.json").unlink()
    again = ablate(*TRAIN, cwd=cwd)
    assert f"{run.resolve()} already completed at step 1: evaluating what eval.json lacks" in again.stdout
    assert "evaluating: heldout" in again.stdout + again.stderr
    assert {name: (run / name).read_bytes() for name in kept} == kept
    after = json.loads((run / "eval.json").read_text())["metrics"]
    for name in (
        "eval_loss",
        "eval_rewards/accuracies",
        "eval_rewards/margins",
    ):  # the model's, not its timing
        assert after[name] == before["metrics"][name]
    once_more = ablate(*TRAIN, cwd=cwd)
    assert "already completed at step 1: nothing to do" in once_more.stdout
    assert "evaluating" not in once_more.stdout.replace("evaluating what", "") + once_more.stderr


@pytest.mark.parametrize(
    ("given", "line"),
    [
        (["eval=x"], "no option 'x' in config group 'eval' (options: heldout, judge, lm_eval)"),
        (["foo=1"], "unknown config key 'foo'; known under '<root>': hydra, optimizer, model, data, method,"),
        (
            ["eval=judge"],
            "eval=judge needs a judge: judge=reward_model judge.path=DIR (a method=reward run) or",
        ),
        (["eval=judge", "judge=reward_model"], "judge.path is required: add judge.path=..."),
        (
            ["eval.lm_eval.limit=0", "eval=lm_eval"],
            "eval.lm_eval.limit=0: must be null (every example) or an integer >= 1",
        ),
    ],
)
def test_a_mistake_is_one_line_and_nothing_is_written(
    trained: tuple[Path, subprocess.CompletedProcess], given: list[str], line: str
) -> None:
    cwd, _ = trained
    run = cwd / "outputs" / "run"
    before = {p.name: p.stat().st_mtime_ns for p in run.iterdir() if p.is_file()}
    proc = ablate("eval", "outputs/run", *given, cwd=cwd, code=2)
    assert len(proc.stderr.strip().splitlines()) == 1 and proc.stderr.startswith(f"ablate: error: {line}"), (
        proc.stderr
    )
    assert {p.name: p.stat().st_mtime_ns for p in run.iterdir() if p.is_file()} == before


def test_train_refuses_an_evaluation_it_could_not_run_before_any_run_dir(tmp_path: Path) -> None:
    proc = ablate("train", "eval=judge", cwd=tmp_path, code=2)
    assert proc.stderr.strip().splitlines() == [
        "ablate: error: eval=judge needs a judge: judge=reward_model judge.path=DIR (a method=reward run) or "
        "judge=reward_funcs (the data's)"
    ]
    assert not (tmp_path / "outputs").exists()
