"""Evaluation inside jobs, for real, from scratch dirs as a user runs it: lm-eval itself on ablate's local tasks at
the end of a run; a job killed while it evaluates, run again, evaluates and does not train; a hub task offline
and an unknown task refused in one line by lm-eval's real task index; and the flagship path: SFT, a reward
model, then `ablate sweep dpo_loss` on the SFT model with eval=[heldout,lm_eval,judge] and logger=wandb, each
job's eval.json holding all three, the W&B files the same numbers, `ablate compare` ranking them (the two
losses not), and `ablate eval SWEEP_DIR` finding nothing left to do.

Run with `python -m pytest -m slow tests/slow/test_eval_jobs.py -n 0` (several minutes on 2 CPU cores)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
ENV = {**os.environ, "COLUMNS": "300", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
WANDB = shutil.which("wandb") or str(Path(sys.executable).with_name("wandb"))
LM_EVAL = ["eval=[heldout,lm_eval]", "eval.lm_eval.limit=8", "data.max_eval_samples=8"]


def ablate(*args: str, cwd: Path, code: int = 0) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, "-m", "ablate", *args],
        cwd=cwd,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=3000,
    )
    assert proc.returncode == code, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def test_lm_eval_runs_at_the_end_of_a_job_and_a_kill_mid_eval_reruns_only_eval(tmp_path: Path) -> None:
    pytest.importorskip("lm_eval")
    train = ["train", "method.args.max_steps=2", *LM_EVAL, "hydra.run.dir=outputs/run"]
    job = subprocess.Popen(
        [sys.executable, "-m", "ablate", *train],
        cwd=tmp_path, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip
    assert job.stdout is not None
    for line in job.stdout:  # killed as it evaluates: summary.json says completed, eval.json lacks lm_eval
        if line.startswith("evaluating: "):  # at once: on a fast CPU lm-eval's 8 rows take about a second
            os.killpg(job.pid, signal.SIGKILL)
            break
    job.wait(timeout=600)
    run = tmp_path / "outputs" / "run"
    assert json.loads((run / "summary.json").read_text())["status"] == "completed"
    # the held-out metrics (seconds here) may be recorded before the kill; lm-eval's are not
    partial = json.loads((run / "eval.json").read_text()) if (run / "eval.json").exists() else {}
    assert "lm_eval" not in partial.get("evals", [])
    trained = (run / "metrics.jsonl").read_bytes()
    again = ablate(*train, cwd=tmp_path)
    assert "already completed at step 2: evaluating what eval.json lacks" in again.stdout
    assert (run / "metrics.jsonl").read_bytes() == trained  # not trained again
    record = json.loads((run / "eval.json").read_text())
    assert record["evals"] == ["heldout", "lm_eval"] and record["lm_eval"]["tasks"] == [
        "ablate_sort",
        "ablate_sort_choice",
    ]
    rows = [json.loads(line) for line in (run / "eval_examples.jsonl").read_text().splitlines()]
    for task, metric in (("ablate_sort", "exact_match"), ("ablate_sort_choice", "acc")):
        name = f"lm_eval/{task}/{metric}"
        mine = [r[name] for r in rows if r["id"].startswith(f"lm_eval/{task}/")]
        assert len(mine) == 8 and record["metrics"][name] == pytest.approx(
            sum(mine) / 8
        )  # lm-eval's own mean
        assert f"{name}_stderr" in record["metrics"]


def test_a_hub_task_offline_and_an_unknown_task_are_one_line(tmp_path: Path) -> None:
    pytest.importorskip("lm_eval")
    ablate("train", "method.args.max_steps=1", "hydra.run.dir=outputs/run", cwd=tmp_path)
    for tasks, line in (
        ("[gsm8k]", "eval.lm_eval.tasks: gsm8k reads its data (openai/gsm8k) from the Hugging Face hub, which "
         "cannot be reached here (HF_HUB_OFFLINE=1), and no copy is cached"),
        ("[gsm9k]", "eval.lm_eval.tasks: no lm-eval task 'gsm9k' (did you mean gsm8k?"),
    ):  # fmt: skip
        proc = ablate(
            "eval", "outputs/run", "eval=lm_eval", f"eval.lm_eval.tasks={tasks}", cwd=tmp_path, code=2
        )
        assert proc.stderr.startswith(f"ablate: error: {line}") and len(proc.stderr.splitlines()) == 1, (
            proc.stderr
        )
        assert not (tmp_path / "outputs" / "run" / "eval.json").exists()


def test_a_sweep_evaluated_in_every_job_then_compared(tmp_path: Path) -> None:
    pytest.importorskip("lm_eval")
    pytest.importorskip("wandb")
    ablate("train", "method=sft", "method.args.max_steps=150", "hydra.run.dir=outputs/sft", cwd=tmp_path)
    ablate("train", "method=reward", "method.args.max_steps=30", "hydra.run.dir=outputs/rm", cwd=tmp_path)
    ablate(
        "sweep", "dpo_loss", "model=local", "model.path=outputs/sft/model", "method.args.max_steps=4",
        "eval=[heldout,lm_eval,judge]", "judge=reward_model", "judge.path=outputs/rm",
        "eval.lm_eval.limit=8", "eval.judge.limit=8", "data.max_eval_samples=8", "logger=wandb",
        cwd=tmp_path,
    )  # fmt: skip
    jobs = sorted(p for p in (tmp_path / "outputs" / "sweeps" / "dpo_loss").glob("*/[0-9]*") if p.is_dir())
    assert len(jobs) == 6
    for job in jobs:
        record = json.loads((job / "eval.json").read_text())
        assert record["evals"] == ["heldout", "lm_eval", "judge"]
        metrics = record["metrics"]
        assert {
            "eval_rewards/margins",
            "lm_eval/ablate_sort/exact_match",
            "judge/win_rate",
            "judge/lc_win_rate",
        } <= set(metrics)
        offline = sorted((job / "wandb").glob("offline-run-*"))[-1]  # the job's run, resumed for its eval
        proc = subprocess.run(
            [WANDB, "leet", "inspect", "--json", str(offline)], capture_output=True, text=True
        )
        logged = {}
        for line in proc.stdout.splitlines():
            r = json.loads(line) if line.strip() else {}
            if r.get("type") == "summary":
                logged.update(r["summary"].get("update") or {})
        assert logged["judge/win_rate"] == pytest.approx(metrics["judge/win_rate"])
        assert logged["lm_eval/ablate_sort_choice/acc"] == pytest.approx(
            metrics["lm_eval/ablate_sort_choice/acc"]
        )
        assert logged["eval/rewards/margins"] == pytest.approx(metrics["eval_rewards/margins"])
        assert list(offline.glob("files/media/table/eval/examples_*.table.json"))  # prompts, answers, scores
    out = ablate("compare", "outputs/sweeps/dpo_loss", cwd=tmp_path).stdout
    header = next(line for line in out.splitlines() if line.startswith("┃ group"))
    for column in (
        "eval_rewards/margins",
        "lm_eval/ablate_sort/exact_match",
        "judge/win_rate",
        "judge/lc_win_rate",
    ):
        assert column in header
    assert "not compared: eval_loss is defined by each arm's dpo_loss (sigmoid vs hinge)" in out
    assert "eval_loss = " not in out and "dpo_loss=hinge − dpo_loss=sigmoid judge/win_rate = " in out
    assert "in words (one verdict per metric" in out
    again = ablate("eval", str(jobs[0].parent), cwd=tmp_path).stdout
    assert again.count(": done (heldout, lm_eval, judge in eval.json)") == 6
