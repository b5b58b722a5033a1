"""A disk that fills up during a checkpoint (issue 22 item 8), on a real full disk: a 2.6 MB tmpfs
holds the run dir and the first checkpoint, not the second (needs root to mount; skipped without).
One line naming the disk and the dir, status `failed` with that error, no temp file and no
incomplete checkpoint left, and the resume works once there is space again."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from conftest import ablate, metrics, summary

pytestmark = pytest.mark.slow
ARGS = ["method.args.max_steps=6", "method.args.save_steps=2", "method.args.logging_steps=1"]


@pytest.fixture
def small_disk(tmp_path):
    mount = tmp_path / "disk"
    mount.mkdir()
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2600k", "tmpfs", str(mount)], capture_output=True, text=True
    )
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {r.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_disk_full_during_a_checkpoint(small_disk, tmp_path):
    run_dir = small_disk / "run"
    r = ablate("train", *ARGS, f"hydra.run.dir={run_dir}")
    assert r.returncode == 2, r.stderr[-3000:]
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    errors = [line for line in r.stderr.replace("\r", "\n").splitlines() if "ablate: error:" in line]
    assert len(errors) == 1, r.stderr[-3000:]
    line = errors[0][errors[0].index("ablate: error:") :]
    assert line == (
        f"ablate: error: disk full: no space left on {small_disk} (tmpfs) while writing "
        f"{run_dir / 'checkpoints' / 'checkpoint-4'} (removed: incomplete); free some space, "
        f"then resume: ablate resume {run_dir}"
    )
    s = summary(run_dir)
    assert s["status"] == "failed" and s["error"] == "DiskFullError: " + line.removeprefix("ablate: error: ")
    assert [p.name for p in (run_dir / "checkpoints").iterdir()] == ["checkpoint-2"]
    assert not [p for p in run_dir.rglob("*") if p.name.endswith(".tmp")]
    subprocess.run(["mount", "-o", "remount,size=50m", str(small_disk)], check=True)  # space is back
    r = ablate("resume", str(run_dir))
    assert r.returncode == 0, r.stderr[-3000:]
    assert summary(run_dir)["status"] == "completed"
    assert [e["step"] for e in metrics(run_dir) if "loss" in e] == [1, 2, 3, 4, 5, 6]
    assert json.loads((run_dir / "checkpoints" / "checkpoint-6" / "manifest.json").read_text())["files"]
    assert os.listdir(run_dir / "model")
