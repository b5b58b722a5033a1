"""W&B, offline: one run per job of a sequential sweep, right group/name/config, secrets kept out.

Offline runs are read back without a server through wandb's own reader of the `.wandb`
transaction log, `wandb leet inspect --json` (wandb >= 0.31; the old datastore reader is gone).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
WANDB = shutil.which("wandb") or str(Path(sys.executable).with_name("wandb"))
SECRETS = {"WANDB_API_KEY": "test-wandb-key-0123456789abcdef", "HF_TOKEN": "hf_testtoken_zyxwvu987654"}


def records(run_dir: Path) -> list[dict[str, Any]]:
    """Every record of the job's offline W&B run, as wandb's own reader prints them."""
    proc = subprocess.run(
        [WANDB, "leet", "inspect", "--json", str(run_dir / "wandb")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]


@pytest.fixture(scope="module")
def wandb_sweep(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess]:
    """The dpo_loss sweep cut to one seed (2 jobs: sigmoid, hinge), sequential, logger=wandb."""
    tmp = tmp_path_factory.mktemp("wandb_sweep")
    sweep_dir = tmp / "dpo_loss" / "2026-01-01_00-00-00"
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")} | SECRETS
    # a config value holding a secret (as a user might, to pass a hub token): must reach W&B masked
    cmd = [
        sys.executable,
        "-m",
        "ablate",
        "sweep",
        "dpo_loss",
        "seed=0",
        "logger=wandb",
        "method.args.max_steps=3",
        "method.args.logging_steps=1",
        "+method.args.hub_token=${oc.env:HF_TOKEN}",
        f"hydra.sweep.dir={sweep_dir}",
    ]
    proc = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return sweep_dir, proc


def test_two_jobs_two_distinct_offline_runs(wandb_sweep: tuple[Path, subprocess.CompletedProcess]) -> None:
    sweep_dir, proc = wandb_sweep
    jobs = sorted(p for p in sweep_dir.iterdir() if p.is_dir())
    assert [j.name for j in jobs] == ["0_dpo_loss-sigmoid-9ed88e63", "1_dpo_loss-hinge-d73de010"]
    ids = []
    for job, loss in zip(jobs, ("sigmoid", "hinge")):
        offline = list((job / "wandb").glob("offline-run-*"))
        assert len(offline) == 1, offline  # no second run from the Trainer's own integration
        recs = records(job)
        run = next(r["run"] for r in recs if r["type"] == "run")
        run_json = json.loads((job / "run.json").read_text())
        assert run["run_id"] == run_json["wandb_run_id"] and offline[0].name.endswith(run["run_id"])
        ids.append(run["run_id"])
        assert run["run_group"] == "dpo_loss/2026-01-01_00-00-00"
        assert run["display_name"] == f"method/dpo_loss={loss}"
        assert run["job_type"] == "dpo" and "dpo_loss" in run["tags"]
        config = run["config"]["update"]
        hydra_cfg = yaml.safe_load((job / ".hydra" / "config.yaml").read_text())
        assert (
            config["method"]["dpo_loss"]["_target_"]
            == hydra_cfg["method"]["dpo_loss"]["_target_"]
            == f"ablate.losses.dpo.{loss}"
        )
        assert config["method"]["args"]["max_steps"] == 3 and config["seed"] == 0
        assert config["model"] == hydra_cfg["model"] and config["sweep_name"] == "dpo_loss"
        assert config["method"]["args"]["hub_token"] == "${oc.env:HF_TOKEN}"  # as written, never resolved
        # the speed plan, known once the trainer exists, is added to the run's config (as in run.json)
        plan = next(r["config"]["update"]["speed_plan"] for r in recs if r["type"] == "config")
        assert plan == run_json["speed_plan"] and plan["policy"]["paths"]["dpo_pair_rows"]["on"]
        # this job's metrics went to this job's run: steps 1..3, and the final loss is summary.json's
        history = [r["history"]["item"] for r in recs if r["type"] == "history"]
        assert [h["_step"] for h in history] == [1, 2, 3], history[:1]
        summary = json.loads((job / "summary.json").read_text())
        assert history[-1]["train/rewards/margins"] == pytest.approx(summary["metrics"]["rewards/margins"])
        state = next(r for r in recs if r["type"] == "exit")
        assert state["exit"]["exit_code"] == 0  # wandb's reader prints it, 0 included: missing is a failure
    assert len(set(ids)) == 2
    assert "wandb sync" in proc.stdout


def test_secrets_never_saved(wandb_sweep: tuple[Path, subprocess.CompletedProcess]) -> None:
    sweep_dir, proc = wandb_sweep
    leaks = [
        p
        for p in sweep_dir.rglob("*")
        if p.is_file() and any(v.encode() in p.read_bytes() for v in SECRETS.values())
    ]
    assert leaks == []
    assert not any(v in proc.stdout + proc.stderr for v in SECRETS.values())


def test_resume_continues_the_same_wandb_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The id ablate.train stored in run.json is reused: same W&B run id, a config secret masked."""
    from ablate.logger.wandb import WandbTracker

    monkeypatch.setenv("HF_TOKEN", SECRETS["HF_TOKEN"])
    info = {"wandb_run_id": "resumeid"}
    tracker = WandbTracker(mode="offline", job_type="dpo")
    tracker.start({"seed": 0, "note": f"token {SECRETS['HF_TOKEN']}"}, tmp_path, info)
    assert tracker.run.id == "resumeid" and info["wandb_run_id"] == "resumeid"
    tracker.finish("completed")
    run = next(r["run"] for r in records(tmp_path) if r["type"] == "run")
    assert run["run_id"] == "resumeid" and run["config"]["update"]["note"] == "token ***"
    assert run["display_name"] == tmp_path.name  # outside a sweep: the run dir's name, no group
    assert not run.get("run_group")


def test_root_tags_and_notes_reach_wandb(tmp_path: Path) -> None:
    """`tags=[...]` and `notes="..."` (root config keys) become the W&B run's tags and notes."""
    from ablate.logger.wandb import WandbTracker

    tracker = WandbTracker(mode="offline", job_type="dpo", tags=["from_logger"])
    tracker.start({"seed": 0, "tags": ["baseline", "v2"], "notes": "why this run"}, tmp_path, {})
    tracker.finish("completed")
    run = next(r["run"] for r in records(tmp_path) if r["type"] == "run")
    assert run["tags"] == ["from_logger", "baseline", "v2"] and run["notes"] == "why this run"


def test_eval_metrics_and_examples_reach_the_runs_own_wandb_run(tmp_path: Path) -> None:
    """ablate.record.lifecycle.evaluate hands eval.json's metrics and the examples with text to the tracker: the
    run's own W&B run (run.json's id) resumed, the metrics as summary values (eval_x under eval/), the rows
    as a wandb.Table read back from the offline files."""
    from ablate.logger.wandb import WandbTracker

    info = {"wandb_run_id": "evalrun1", "wandb_group": "dpo_loss/2026-01-01_00-00-00", "wandb_name": "seed=1"}
    metrics = {
        "eval_rewards/accuracies": 0.75,
        "lm_eval/ablate_sort/exact_match": 0.5,
        "judge/win_rate": 0.625,
    }
    rows = [
        {"id": "a", "eval": "heldout", "loss": 0.5},  # no text: not in the table
        {"id": "judge/1", "eval": "judge", "judge/win_rate": 1.0, "prompt": "sort: cba =", "completion": " abc",
         "baseline": " cab", "score": 2.0, "baseline_score": -1.0},
        {"id": "lm_eval/ablate_sort/2", "eval": "lm_eval", "lm_eval/ablate_sort/exact_match": 0.0,
         "prompt": "sort: ba =", "response": "[' ba']", "target": " ab"},
    ]  # fmt: skip
    WandbTracker(mode="offline", job_type="dpo").log_eval(tmp_path, info, metrics, rows)
    recs = records(tmp_path)
    run = next(r["run"] for r in recs if r["type"] == "run")
    assert (
        run["run_id"] == "evalrun1"
        and run["run_group"] == info["wandb_group"]
        and run["display_name"] == "seed=1"
    )
    summary: dict[str, Any] = {}
    for r in recs:
        if r["type"] == "summary":
            summary.update(r["summary"].get("update") or {})
    assert summary["eval/rewards/accuracies"] == 0.75 and summary["lm_eval/ablate_sort/exact_match"] == 0.5
    assert summary["judge/win_rate"] == 0.625
    (table,) = tmp_path.glob("wandb/offline-run-*/files/media/table/eval/examples_*.table.json")
    data = json.loads(table.read_text())
    assert data["columns"][:4] == ["id", "eval", "judge/win_rate", "prompt"]
    got = [dict(zip(data["columns"], row)) for row in data["data"]]
    assert [g["id"] for g in got] == ["judge/1", "lm_eval/ablate_sort/2"]
    assert got[0]["completion"] == " abc" and got[0]["baseline_score"] == -1.0 and got[1]["target"] == " ab"
