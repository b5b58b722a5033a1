"""`last` wherever a command takes a run dir, as a user types it from a scratch directory: `ablate eval last`,
`generate last`, `resume last`, `ls last` take the newest run under outputs/ (by run.json's start time, not by
its dir's name), `compare last` the newest sweep; with none there, one line and nothing created."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from conftest import ablate


def _fake_run(run: Path, started: str, overrides: list[str], metrics: dict | None = None) -> Path:
    """A finished run's record, as ablate writes it (run.json, summary.json, metrics.jsonl)."""
    metrics = metrics or {"loss": 0.5}
    run.mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"overrides": overrides, "started": started}))
    (run / "summary.json").write_text(
        json.dumps(
            {
                "status": "completed",
                "method": "dpo",
                "overrides": overrides,
                "global_step": 2,
                "compare_metrics": list(metrics),
                "metrics": metrics,
            }
        )
    )
    (run / "metrics.jsonl").write_text(json.dumps({"step": 2, "time": 1.0, **metrics}) + "\n")
    return run


@pytest.mark.parametrize(
    "argv",
    [
        ["eval", "last"],
        ["generate", "last", "--prompt", "x"],
        ["resume", "last"],
        ["ls", "last"],
        ["compare", "last"],
    ],
)
def test_last_with_nothing_there_is_one_line(tmp_path: Path, argv: list[str]) -> None:
    r = ablate(*argv, cwd=tmp_path)
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "`last` is the newest" in lines[0] and "there is none" in lines[0], r.stderr
    assert list(tmp_path.iterdir()) == []  # nothing created


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A scratch cwd holding a real SFT run (trained now) and an older run whose dir name sorts after it
    (a later date in its name, an earlier start in its run.json): `last` is the real one."""
    cwd = tmp_path_factory.mktemp("scratch dir")
    _fake_run(cwd / "outputs/runs/2999-01-01/00-00-00_seed-1", "2020-01-01T00:00:00", ["seed=1"])
    r = ablate("train", "method=sft", "method.args.max_steps=2", "method.args.save_strategy=no", cwd=cwd)
    assert r.returncode == 0, r.stderr[-3000:]
    (real,) = [p.parent for p in (cwd / "outputs/runs").glob("*/*/run.json") if "2999" not in str(p)]
    return cwd, real


def test_eval_last_scores_the_newest_run(scratch: tuple[Path, Path]) -> None:
    cwd, real = scratch
    r = ablate("eval", "last", cwd=cwd)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"last: {real.relative_to(cwd)}" in r.stderr
    assert (real / "eval.json").is_file() and f"wrote {real / 'eval.json'}" in r.stdout
    assert not (cwd / "outputs/runs/2999-01-01/00-00-00_seed-1/eval.json").exists()


def test_generate_last_writes_from_the_newest_run(scratch: tuple[Path, Path]) -> None:
    cwd, real = scratch
    r = ablate("generate", "last", "--prompt", "sort: dcba =", "--max-new-tokens", "4", "--json", cwd=cwd)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"last: {real.relative_to(cwd)}" in r.stderr
    (row,) = [json.loads(line) for line in r.stdout.splitlines()]  # --json: stdout holds the rows only
    assert row["prompt"] == "sort: dcba =" and isinstance(row["completion"], str)


def test_resume_last_names_the_newest_run(scratch: tuple[Path, Path]) -> None:
    cwd, real = scratch
    r = ablate("resume", "last", cwd=cwd)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"{real} already completed at step 2: nothing to resume" in r.stdout


def test_ls_last_shows_the_newest_run_alone(scratch: tuple[Path, Path]) -> None:
    cwd, real = scratch
    r = ablate("ls", "last", "--json", cwd=cwd)
    assert r.returncode == 0, r.stderr[-3000:]
    (row,) = json.loads(r.stdout)
    assert Path(row["path"]) == real and row["method"] == "sft"


def test_compare_last_takes_the_newest_sweep(tmp_path: Path) -> None:
    older = tmp_path / "outputs/sweeps/zeta/2026-01-02_00-00-00"  # sorts last by name, written first
    newer = tmp_path / "outputs/sweeps/alpha/2026-01-01_00-00-00"
    for launch, metric in ((older, "older_metric"), (newer, "newer_metric")):
        for num, seed in enumerate((1, 2)):
            _fake_run(
                launch / f"{num}_seed-{seed}", "2026-01-01T00:00:00", [f"seed={seed}"], {metric: 0.1 * seed}
            )
        (launch / "multirun.yaml").write_text("{}\n")
    os.utime(older / "multirun.yaml", (1_000_000_000, 1_000_000_000))
    r = ablate("compare", "last", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"last: {newer.relative_to(tmp_path)}" in r.stderr
    assert "newer_metric" in r.stdout and "older_metric" not in r.stdout


def test_last_and_ls_agree_on_dirs_that_hold_no_usable_run(tmp_path: Path) -> None:
    """A newer dir whose run.json is cut short, another with summary.json but no run.json, and an older one
    with no run.json: `last` takes the good run and names the newer dirs it skipped and why; `ablate ls` lists
    all three broken ones `unreadable` with the same reasons (where it used to call the one without run.json
    `completed`, the newest run, while `last` skipped it without a word)."""
    good = _fake_run(tmp_path / "outputs/runs/2026-01-01/00-00-00_good", "2026-01-01T00:00:00", [])
    cut = _fake_run(tmp_path / "outputs/runs/2026-01-02/00-00-00_cut", "2026-01-02T00:00:00", ["seed=2"])
    (cut / "run.json").write_text('{"overrides": ["seed=2"], "sta')
    gone = _fake_run(tmp_path / "outputs/runs/2026-01-03/00-00-00_gone", "2026-01-03T00:00:00", ["seed=3"])
    (gone / "run.json").unlink()
    old = _fake_run(tmp_path / "outputs/runs/2019-01-01/00-00-00_old", "2019-01-01T00:00:00", ["seed=4"])
    (old / "run.json").unlink()
    os.utime(old, (1_500_000_000, 1_500_000_000))  # 2017: older than the good run
    for d, day in ((cut, 2), (gone, 3)):  # a broken dir's time is its modification time, as ls shows it
        when = time.mktime((2026, 1, day, 0, 0, 0, 0, 0, -1))
        os.utime(d, (when, when))
    r = ablate("ls", "last", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    (row,) = json.loads(r.stdout)
    assert Path(row["path"]) == good.resolve()
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith(f"last: {good.relative_to(tmp_path)} (skipped 2 newer dirs"), line
    assert "the newest outputs/runs/2026-01-03/00-00-00_gone: no run.json" in line and "_old" not in line
    rows = {Path(r["path"]).name: r for r in json.loads(ablate("ls", "--json", cwd=tmp_path).stdout)}
    assert rows["00-00-00_good"]["status"] == "completed"
    for name in ("00-00-00_cut", "00-00-00_gone", "00-00-00_old"):
        assert rows[name]["status"] == "unreadable" and "`last` skips it" in rows[name]["error"], rows[name]
    assert "its run.json is not JSON (30 bytes: cut short?)" in rows["00-00-00_cut"]["error"]
    text = ablate("ls", cwd=tmp_path).stdout
    assert "unreadable: runs/2026-01-02/00-00-00_cut: its run.json is not JSON" in text, text
    (gone / "run.json").write_text(json.dumps({"overrides": ["seed=3"], "started": "2026-01-03T00:00:00"}))
    r = ablate("ls", "last", "--json", cwd=tmp_path)
    assert Path(json.loads(r.stdout)[0]["path"]) == gone.resolve() and "skipped" not in r.stderr, r.stderr
