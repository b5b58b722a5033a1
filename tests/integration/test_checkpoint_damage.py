"""A damaged newest checkpoint never blocks a resume nor resumes silently on wrong state (issue 22
item 7): every checkpoint is sealed by a manifest (every file, its size and sha256) written last; a
resume takes the newest one whose files match it, names the one it skipped in one line, and the
losses are the uninterrupted run's. GRPO's own files (generation buffer and counters) are covered
the same way, whatever files a trainer adds."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from conftest import ablate, metrics, summary

from ablate.record import checkpoints

FAST = [
    "method.args.max_steps=6",
    "method.args.save_steps=2",
    "method.args.logging_steps=1",
    "+callbacks.crash._target_=crashing.CrashAt",
]
# GRPO: rounds of 3 micro-steps, so checkpoints 2 and 4 are saved mid-round, with the round's buffer
GRPO = [
    "method=grpo",
    "method.args.max_steps=6",
    "method.args.save_steps=2",
    "method.args.logging_steps=1",
    "method.args.steps_per_generation=3",
    "method.args.per_device_train_batch_size=16",
    "+callbacks.crash._target_=crashing.CrashAt",
]
ENV = {"OMP_NUM_THREADS": "1"}  # GRPO's small generation ops: threads only contend


def _losses(run_dir: Path) -> list[tuple]:
    return [(e["step"], e["loss"], e.get("reward")) for e in metrics(run_dir) if "loss" in e]


def _crashed_and_reference(root: Path, overrides: list[str]) -> tuple[Path, Path]:
    ref, crashed = root / "ref", root / "crashed"
    r = ablate("train", *overrides, f"hydra.run.dir={ref}", env=ENV)
    assert r.returncode == 0, r.stderr[-3000:]
    r = ablate("train", *overrides, f"hydra.run.dir={crashed}", env={**ENV, "ABLATE_TEST_CRASH_AT": "5"})
    assert r.returncode != 0 and "simulated crash at step 5" in summary(crashed)["error"]
    return crashed, ref


@pytest.fixture(scope="module")
def dpo(tmp_path_factory) -> tuple[Path, Path]:
    """A DPO run killed at step 5 (checkpoints 2 and 4) and the same run uninterrupted."""
    return _crashed_and_reference(tmp_path_factory.mktemp("dpo"), FAST)


def _cut(path: Path) -> None:
    os.truncate(path, path.stat().st_size // 2)


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


DAMAGE = {
    "optimizer.pt cut in half": ("optimizer.pt", _cut, "optimizer.pt is truncated"),
    "optimizer.pt emptied": ("optimizer.pt", lambda p: p.write_bytes(b""), "optimizer.pt is truncated"),
    "optimizer.pt deleted": ("optimizer.pt", Path.unlink, "optimizer.pt is missing"),
    "optimizer.pt one byte flipped": ("optimizer.pt", _flip, "optimizer.pt is damaged"),
    "rng_state.pth cut": ("rng_state.pth", _cut, "rng_state.pth is truncated"),
    "scheduler.pt cut": ("scheduler.pt", _cut, "scheduler.pt is truncated"),
    "training_args.bin deleted": ("training_args.bin", Path.unlink, "training_args.bin is missing"),
}  # (a cut model.safetensors or trainer_state.json: test_run_dir.py's test_corrupt_newest_checkpoint_falls_back)


@pytest.mark.parametrize("kind", list(DAMAGE))
def test_damaged_newest_checkpoint_is_passed_over_for_the_previous_one(dpo, tmp_path, kind):
    """Every kind of damage to checkpoint-4 leaves checkpoint-2 as the resume point, with one line
    naming the file (today's main took checkpoint-4, and failed or resumed on wrong state)."""
    run = tmp_path / "run"
    shutil.copytree(dpo[0], run)
    name, damage, why = DAMAGE[kind]
    damage(run / "checkpoints" / "checkpoint-4" / name)
    skipped: list[str] = []
    assert checkpoints.latest_checkpoint(run, skipped) == run / "checkpoints" / "checkpoint-2"
    assert len(skipped) == 1 and skipped[0].startswith(f"checkpoint-4: {why}"), skipped


def test_checkpoint_without_manifest(dpo, tmp_path):
    """A save cut short after Trainer's files but before the manifest: an older sealed checkpoint
    wins; with none left (Trainer rotated it away, or an older ablate wrote them all), the newest
    unsealed one that passes the older checks is used."""
    run = tmp_path / "run"
    shutil.copytree(dpo[0], run)
    ckpts = run / "checkpoints"
    (ckpts / "checkpoint-4" / checkpoints.MANIFEST).unlink()
    skipped: list[str] = []
    assert checkpoints.latest_checkpoint(run, skipped) == ckpts / "checkpoint-2"
    assert skipped == [f"checkpoint-4: no {checkpoints.MANIFEST} (save interrupted)"]
    (ckpts / "checkpoint-2" / checkpoints.MANIFEST).unlink()  # as an older ablate left them
    assert checkpoints.latest_checkpoint(run) == ckpts / "checkpoint-4"
    _cut(ckpts / "checkpoint-4" / "model.safetensors")
    assert checkpoints.latest_checkpoint(run) == ckpts / "checkpoint-2"


def test_resume_after_deleted_optimizer_state_matches_the_uninterrupted_run(dpo, tmp_path):
    """The user's path: checkpoint-4 lost its optimizer.pt; `ablate resume` says in one line that it
    skips it, resumes from checkpoint-2 and ends with the uninterrupted run's losses (today's main
    resumed from checkpoint-4 with a fresh optimizer: other losses, silently). The skipped checkpoint
    is kept aside, not mixed with the new checkpoint-4."""
    run = tmp_path / "run"
    shutil.copytree(dpo[0], run)
    (run / "checkpoints" / "checkpoint-4" / "optimizer.pt").unlink()
    r = ablate("resume", str(run))
    assert r.returncode == 0, r.stderr[-3000:]
    lines = [ln for ln in (r.stdout + r.stderr).splitlines() if "skipping" in ln]
    assert (
        len(lines) == 1
        and "skipping checkpoint-4: optimizer.pt is missing; resuming from checkpoint-2" in lines[0]
    )
    assert summary(run)["status"] == "completed"
    assert _losses(run) == _losses(dpo[1])
    assert not (run / "checkpoints" / "skipped" / "checkpoint-4" / "optimizer.pt").exists()
    assert (run / "checkpoints" / "skipped" / "checkpoint-4" / "trainer_state.json").is_file()
    manifest = json.loads((run / "checkpoints" / "checkpoint-6" / checkpoints.MANIFEST).read_text())
    assert {"optimizer.pt", "trainer_state.json", "model.safetensors"} <= set(manifest["files"])


@pytest.fixture(scope="module")
def grpo(tmp_path_factory) -> tuple[Path, Path]:
    """A GRPO run killed at step 5 (checkpoints 2 and 4, both mid-round) and the same run uninterrupted."""
    crashed, ref = _crashed_and_reference(tmp_path_factory.mktemp("grpo"), GRPO)
    assert (crashed / "checkpoints" / "checkpoint-4" / "generation_buffer.pt").is_file()
    return crashed, ref


@pytest.mark.parametrize(
    "kind", ["generation_buffer.pt deleted", "generation_buffer.pt cut", "generation_state.json cut"]
)
def test_grpo_damaged_round_state_resumes_from_the_previous_checkpoint(grpo, tmp_path, kind):
    """GRPO's generation buffer (the round's completions) and counters: a resume with the buffer
    deleted regenerated the round silently (other losses); cut, it failed with a traceback. Now
    checkpoint-4 is skipped in one line and the losses and rewards are the uninterrupted run's."""
    run = tmp_path / "run"
    shutil.copytree(grpo[0], run)
    name, how = kind.split(" ")
    path = run / "checkpoints" / "checkpoint-4" / name
    path.unlink() if how == "deleted" else _cut(path)
    r = ablate("resume", str(run), env=ENV)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"skipping checkpoint-4: {name} is" in r.stdout + r.stderr
    assert summary(run)["status"] == "completed"
    assert _losses(run) == _losses(grpo[1])
