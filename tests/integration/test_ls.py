"""`ablate ls` as a user runs it: default outputs/ from a scratch cwd, one real tiny run plus
hand-written run dirs for the other statuses (their numbers known); tags and notes end to end."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from conftest import ablate

from ablate.analysis import runs


def fake_run(
    root: Path,
    rel: str,
    started: str,
    status: str,
    method: str = "dpo",
    step: int = 4,
    tags: list[str] | None = None,
    pid: int | None = None,
    error: str | None = None,
    metrics: dict | None = None,
) -> Path:
    run = root / rel
    run.mkdir(parents=True)
    info = {
        "overrides": [f"seed={step}"],
        "started": started,
        "tags": tags or [],
        "host": __import__("socket").gethostname(),
    }
    if pid is not None:
        info["pid"] = pid
    (run / "run.json").write_text(json.dumps(info))
    summary = {
        "status": status,
        "method": method,
        "overrides": info["overrides"],
        "global_step": step,
        "metrics": metrics or {},
        # as train.py records it from the method's YAML (compare_metrics): ls shows the first
        "compare_metrics": {"grpo": ["reward"], "dpo": ["rewards/accuracies"]}.get(method, ["loss"]),
    }
    if error:
        summary["error"] = error
    (run / "summary.json").write_text(json.dumps(summary))
    return run


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A scratch cwd with one real run (default run dir) and a few hand-written ones."""
    cwd = tmp_path_factory.mktemp("scratch dir")
    r = ablate(
        "train",
        "method.args.max_steps=2",
        "method.args.save_strategy=no",
        "tags=[baseline,v2]",
        'notes="first try"',
        "threads=1",
        "malloc_mmap_threshold=131072",
        cwd=cwd,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    out = cwd / "outputs"
    dead = 2**22 + 12345  # above the default pid_max: no such process
    fake_run(
        out,
        "runs/2020-01-01/00-00-00_seed=1",
        "2020-01-01T00:00:00",
        "failed",
        step=1,
        error="RuntimeError: boom",
    )
    fake_run(
        out,
        "sweeps/grpo_sweep/2020-01-02_00-00-00/0_seed=2",
        "2020-01-02T00:00:00",
        "completed",
        method="grpo",
        step=2,
        tags=["v2"],
        metrics={"reward": 0.75},
    )
    fake_run(out, "runs/2020-01-03/00-00-00_seed=3", "2020-01-03T00:00:00", "running", step=3, pid=dead)
    fake_run(
        out,
        "runs/2020-01-04/00-00-00_seed=4",
        "2020-01-04T00:00:00",
        "failed",
        step=4,
        error="KeyboardInterrupt",
    )
    return cwd


def test_real_run_records_tags_notes_and_threads(scratch: Path) -> None:
    (info_path,) = (scratch / "outputs" / "runs").glob("*/*max_steps-2*/run.json")
    info = json.loads(info_path.read_text())
    assert info["tags"] == ["baseline", "v2"] and info["notes"] == "first try"
    assert info["threads"] == 1 and info["threads_source"] == "config threads"
    assert info["malloc_mmap_threshold"] == 131072  # ablate.process.memory applied (glibc) in the user's run
    assert (
        "tags" not in info_path.parent.name and "notes" not in info_path.parent.name
    )  # labels don't name the dir


def test_ls_lists_newest_first_with_status_step_metric_tags(scratch: Path) -> None:
    r = ablate("ls", cwd=scratch)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split()[:6] == ["started", "method", "status", "step", "metric", "tags"]
    rows = lines[1:-1]
    assert len(rows) == 5 and r.stdout.splitlines()[-1].startswith("5 run(s) under")
    assert "completed" in rows[0] and "baseline,v2" in rows[0] and "method.args.save_strategy=no" in rows[0]
    assert [row.split()[3] for row in rows] == [
        "completed",
        "interrupted",
        "interrupted",
        "completed",
        "failed",
    ]
    assert "reward=0.75" in rows[3] and rows[3].endswith("sweeps/grpo_sweep/2020-01-02_00-00-00/0_seed=2")


def test_ls_filters(scratch: Path) -> None:
    def paths(*args: str) -> list[str]:
        r = ablate("ls", "--json", *args, cwd=scratch)
        assert r.returncode == 0, r.stderr
        return [Path(row["path"]).name for row in json.loads(r.stdout)]

    assert paths("--status", "interrupted") == ["00-00-00_seed=4", "00-00-00_seed=3"]
    assert paths("--method", "grpo") == ["0_seed=2"]
    assert len(paths("--tag", "v2")) == 2 and len(paths("--tag", "v2", "--tag", "baseline")) == 1
    assert paths("--status", "failed", "--method", "grpo") == []


def test_ls_lines_are_not_wrapped_when_piped(scratch: Path) -> None:
    r = ablate("ls", cwd=scratch, env={"COLUMNS": "40"})
    rows = r.stdout.splitlines()[1:-1]
    assert len(rows) == 5 and all(row.split()[-1].startswith(("runs/", "sweeps/")) for row in rows)


def test_ls_on_a_missing_dir_is_one_line(tmp_path: Path) -> None:
    r = ablate("ls", cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.startswith("ablate: error: no directory outputs")


def test_compare_filters_by_tag(scratch: Path) -> None:
    r = ablate("compare", "outputs", "--tag", "baseline", cwd=scratch)
    assert r.returncode == 0, r.stderr
    assert "1 runs in 1 groups" in r.stdout
    r = ablate("compare", "outputs", "--tag", "nosuch", cwd=scratch)
    assert r.returncode == 2 and "tagged ['nosuch']" in r.stderr


def test_status_of_a_live_process_stays_running(tmp_path: Path) -> None:
    fake_run(tmp_path, "a", "2020-01-01T00:00:00", "running", pid=os.getpid())
    assert [r["status"] for r in runs.list_runs(tmp_path)] == ["running"]


def test_bad_threads_setting_is_one_line_before_the_run_dir(tmp_path: Path) -> None:
    r = ablate("train", "threads=0", cwd=tmp_path)
    assert r.returncode == 2 and "ablate: error: threads=0: must be null" in r.stderr
    assert not (tmp_path / "outputs").exists()  # a config mistake: refused before the run dir exists
