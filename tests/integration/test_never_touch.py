"""Issue 32, data loss: ablate never touches what it did not write. A sweep's job whose dir is not
ablate's (a folder of the user's, another run's dir) is refused with nothing written into it (no
ablate.log, no .lock) and counted as failed in the sweep's table and exit status; a resume whose
composed config changed on disk is refused naming the keys, nothing rewritten. (`ablate cache clear`
on a folder that is not a cache: tests/unit/test_cache.py; a sweep into a dir holding a sweep: the
bad-inputs table.)"""

from __future__ import annotations

import json
from pathlib import Path

from conftest import ablate


def _snapshot(d: Path) -> dict[str, tuple[bytes | None, int]]:
    return {
        str(p.relative_to(d)): (None if p.is_dir() else p.read_bytes(), p.stat().st_mtime_ns)
        for p in sorted([d, *d.rglob("*")])
    }


def test_a_refused_job_dir_is_left_as_it_was_and_counted_as_failed(tmp_path):
    sweep = tmp_path / "sw"
    (sweep / "0_seed-1-389c96e3").mkdir(parents=True)
    (sweep / "0_seed-1-389c96e3" / "notes.txt").write_text("the user's\n")
    (sweep / "1_seed-2-bb1b9ecd").mkdir()
    (sweep / "1_seed-2-bb1b9ecd" / "run.json").write_text(
        json.dumps({"overrides": ["seed=7"]})
    )  # another run's
    before = {d: _snapshot(sweep / d) for d in ("0_seed-1-389c96e3", "1_seed-2-bb1b9ecd")}
    r = ablate(
        "train", "-m", "seed=1,2,3", f"hydra.sweep.dir={sweep}", "method.args.max_steps=1", cwd=tmp_path
    )
    assert r.returncode == 1, r.stderr[-3000:]
    assert (
        "Traceback" not in r.stderr
        and r.stderr.strip().splitlines()[-1] == "ablate: 2 sweep job(s) failed (see the table above)"
    ), r.stderr[-3000:]
    assert {d: _snapshot(sweep / d) for d in before} == before  # no ablate.log, no .lock: nothing
    assert "1/3 jobs completed" in r.stdout, r.stdout[-3000:]
    rows = [line for line in r.stdout.splitlines() if line.startswith("│ ")]
    assert any("0_seed-1-389c96e3" in line and " failed " in line for line in rows), rows
    assert any("1_seed-2-bb1b9ecd" in line and " failed " in line for line in rows), rows
    errors = sorted(
        json.loads(p.read_text())["error"] for p in (sweep / ".refused").glob("*.json")
    )  # the table's column
    assert (
        len(errors) == 2
        and any("is not empty and holds no ablate run" in e for e in errors)
        and any("holds another run" in e for e in errors)
    ), errors
    assert json.loads((sweep / "2_seed-3-bd4da476" / "summary.json").read_text())["status"] == "completed"


def test_a_resume_on_a_config_changed_on_disk_is_refused_naming_the_keys(tmp_path):
    """A run crashed at step 3 (checkpoint at 2), its config file edited (lr 3e-3 -> 9e-3): the resume
    said nothing, rewrote .hydra/config.yaml to the new lr and trained on the checkpoint's old schedule.
    Now refused in one line naming the key, every file of the run as it was; `--force` resumes."""
    conf = tmp_path / "myconf" / "experiment"
    conf.mkdir(parents=True)
    mine = conf / "mine.yaml"
    mine.write_text("# @package _global_\noptimizer:\n  optimizer:\n    lr: 3.0e-3\n")
    run = tmp_path / "run"
    args = (
        "train",
        "--config-dir",
        str(tmp_path / "myconf"),
        "+experiment=mine",
        "method.args.max_steps=4",
        "method.args.save_steps=2",
        "+callbacks.crash._target_=crashing.CrashAt",
        f"hydra.run.dir={run}",
    )
    crashed = ablate(*args, cwd=tmp_path, env={"ABLATE_TEST_CRASH_AT": "3"})
    assert crashed.returncode != 0 and (run / "checkpoints" / "checkpoint-2").is_dir(), crashed.stderr[-3000:]
    mine.write_text("# @package _global_\noptimizer:\n  optimizer:\n    lr: 9.0e-3\n")
    before = _snapshot(run)
    for how in (("resume", str(run)), args):
        r = ablate(*how, cwd=tmp_path)
        assert r.returncode == 2 and r.stderr.strip().splitlines() == [r.stderr.strip()], r.stderr[-3000:]
        assert (
            "the composed config changed since this run started: optimizer.optimizer.lr (was 0.003, now 0.009)"
            in r.stderr
            and f"ablate resume {run} --force" in r.stderr
        ), r.stderr
        assert _snapshot(run) == before, how
    forced = ablate("resume", str(run), "--force", cwd=tmp_path)
    assert forced.returncode == 0, forced.stderr[-3000:]
    assert "optimizer.optimizer.lr (was 0.003, now 0.009)): resuming with it (--force)" in forced.stdout, (
        forced.stdout[-3000:]
    )
    assert json.loads((run / "summary.json").read_text())["status"] == "completed"
    assert "lr: 0.009" in (run / ".hydra" / "config.yaml").read_text()


def test_the_same_sweep_command_again_continues_its_dir_and_another_launch_is_refused(tmp_path):
    """docs/runs.md: after a crash, the same command again continues the sweep (each job resumes its
    run dir; SLURM's DDP jobs rely on it). A launch with other overrides into that dir is refused,
    its multirun.yaml left as it was."""
    sweep = tmp_path / "sw"
    args = ("train", "-m", "seed=1", f"hydra.sweep.dir={sweep}", "method.args.max_steps=2")
    assert ablate(*args, cwd=tmp_path).returncode == 0
    record = (sweep / "multirun.yaml").read_bytes()
    r = ablate(*args, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "the same launch again" in r.stderr + r.stdout, r.stderr[-3000:]
    assert "1/1 jobs completed" in r.stdout, r.stdout[-3000:]
    r = ablate("train", "-m", "seed=2", f"hydra.sweep.dir={sweep}", "method.args.max_steps=2", cwd=tmp_path)
    assert r.returncode != 0 and f"hydra.sweep.dir={sweep} holds a sweep (multirun.yaml)" in r.stderr, (
        r.stderr[-3000:]
    )
    assert (sweep / "multirun.yaml").read_bytes() == record and not (sweep / "0_seed-2-bb1b9ecd").exists()
