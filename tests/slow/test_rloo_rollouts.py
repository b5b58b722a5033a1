"""RLOO on GRPO's rollout machinery beyond the synchronous default (the parity tests cover one round per step
and num_iterations): rounds sampled ahead by the async worker (max_staleness) with several micro-steps per
round, and the KL penalty scoring pi_old at round time. Through the CLI, a few steps."""

from __future__ import annotations

import pytest
from conftest import ablate, metrics, summary

pytestmark = pytest.mark.slow


def test_rloo_async_with_the_kl_penalty(tmp_path):
    r = ablate(
        "train",
        "method=rloo",
        "method.args.max_staleness=1",
        "method.args.steps_per_generation=2",
        "method.args.beta=0.05",
        "method.args.max_steps=6",
        "method.args.logging_steps=1",
        f"hydra.run.dir={tmp_path}",
        env={"OMP_NUM_THREADS": "1"},
    )
    assert r.returncode == 0, r.stderr[-3000:]
    s = summary(tmp_path)
    assert (
        s["status"] == "completed" and s["generation_rounds"] == 3 and s["background_generation_seconds"] > 0
    )
    events = metrics(tmp_path)
    assert [e["step"] for e in events if "kl" in e] == [1, 3, 5]  # logged where a round is scored
    assert all("sample/staleness_mean" in e for e in events if "loss" in e and "train_loss" not in e)
