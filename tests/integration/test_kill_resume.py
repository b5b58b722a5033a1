"""kill -9 at random moments (startup, a step, a checkpoint save, the final save), then the same
command again until the run completes: the result is the uninterrupted run's, bit for bit (every
logged loss (and GRPO reward), the final weights, summary.json's train_loss). The default suite
kills a short DPO run 3 times and an asynchronous GRPO run twice; `-m slow` kills a DPO and a GRPO run
at 20 moments each (issue 12) and an async GRPO run at 8, the GRPO runs first right after their
mid-round checkpoints, so resumes start mid-round (async: with a round in flight, saved with the checkpoint)."""

from __future__ import annotations

import hashlib
import os
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import ablate, ablate_started, metrics, summary

RUNS = {
    "dpo": ["method.args.max_steps=12", "method.args.save_steps=2", "method.args.logging_steps=1"],
    # 3 rounds of 3 micro-steps, checkpoints at steps 2, 4, 8 (mid-round: the round's completions are
    # saved with them and served after the resume) and 6, 9 (round boundaries)
    "grpo": [
        "method=grpo",
        "method.args.max_steps=9",
        "method.args.save_steps=2",
        "method.args.logging_steps=1",
        "method.args.steps_per_generation=3",
        "method.args.per_device_train_batch_size=16",
    ],
    # asynchronous GRPO (a worker samples round k+1 by round k's start weights): 5 rounds of 2 steps,
    # checkpoints at steps 3, 9 (mid-round) and 6 (a boundary), each with the round in flight saved
    "grpo_async": [
        "method=grpo",
        "method.args.max_steps=10",
        "method.args.save_steps=3",
        "method.args.logging_steps=1",
        "method.args.steps_per_generation=2",
        "method.args.per_device_train_batch_size=16",
        "method.args.max_staleness=1",
    ],
}
# checkpoints saved mid-round: a launch is killed as soon as each is complete, so a resume starts there
MID_ROUND = {"dpo": [], "grpo": [2, 4], "grpo_async": [3]}


def _result(run_dir: Path) -> tuple:
    s = summary(run_dir)
    # a GRPO round logs its rewards at its first micro-step (None at the others and for DPO)
    losses = [
        (e["step"], e["loss"], e.get("reward"), e.get("reward_std")) for e in metrics(run_dir) if "loss" in e
    ]
    weights = hashlib.sha256((run_dir / "model" / "model.safetensors").read_bytes()).hexdigest()
    return s["status"], s["global_step"], losses, weights, s["metrics"]["train_loss"]


def _kill_and_resume(method: str, kills: int, tmp_path: Path) -> None:
    overrides = RUNS[method]
    kills = int(os.environ.get("ABLATE_TEST_KILLS", kills))  # fewer for a quick check, more for a soak
    ref = tmp_path / "ref"
    t0 = time.time()
    r = ablate("train", *overrides, f"hydra.run.dir={ref}")
    assert r.returncode == 0, r.stderr[-3000:]
    duration = time.time() - t0
    seed = int(os.environ.get("ABLATE_TEST_KILL_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    run_dir = tmp_path / "killed"
    # every launch is a forked child of the tests' fork server, as the reference run was (conftest.ablate):
    # its startup is building the model, data, reference log-probs (the imports are done). Kill from
    # mid-startup to the end, so the moments fall on steps, checkpoint saves and the final save too
    startup = max(duration - metrics(ref)[-1]["time"], 0.0)
    moments = [rng.uniform(0.5 * startup, duration) for _ in range(kills)]
    for step in MID_ROUND[
        method
    ]:  # first kill -9 right after each mid-round checkpoint: resumes start mid-round
        ckpt = run_dir / "checkpoints" / f"checkpoint-{step}"
        proc = ablate_started("train", *overrides, f"hydra.run.dir={run_dir}")
        while proc.poll() is None and not (ckpt / "trainer_state.json").is_file():  # written last
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert (ckpt / "generation_buffer.pt").is_file(), f"{ckpt.name} should hold its round's completions"
        if "max_staleness" in " ".join(overrides):  # and the round sampled ahead (ablate.rollouts.ahead)
            assert (ckpt / "async_rounds.pt").is_file(), f"{ckpt.name} should hold the round in flight"
    for delay in moments:  # each launch runs the same command in the same dir, so it resumes
        proc = ablate_started("train", *overrides, f"hydra.run.dir={run_dir}")
        try:
            proc.wait(timeout=delay)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
    final = ablate("train", *overrides, f"hydra.run.dir={run_dir}")
    assert final.returncode == 0, f"seed {seed}: {final.stderr[-3000:]}"
    assert _result(run_dir) == _result(ref), f"kill moments {moments} (ABLATE_TEST_KILL_SEED={seed})"


def test_dpo_killed_at_random_moments_resumes_to_the_same_result(tmp_path):
    _kill_and_resume("dpo", 3, tmp_path)


def test_async_grpo_killed_at_random_moments_resumes_to_the_same_result(tmp_path):
    """The generation worker dies with the trainer (kill -9 included); the rounds it had sampled
    ahead come back from the checkpoint, the later ones are sampled again identically."""
    _kill_and_resume("grpo_async", 2, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize(("method", "kills"), [("dpo", 20), ("grpo", 20), ("grpo_async", 8)])
def test_killed_at_random_moments_many_times(tmp_path, method, kills):
    _kill_and_resume(method, kills, tmp_path)
