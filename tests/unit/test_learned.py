"""ablate.callbacks.learned: a run whose progress metric never moved gets one note, with the hints that fit;
noise is not called learning, and a run that learns gets none."""

from __future__ import annotations

import random

from ablate.callbacks.learned import moved, note

GRPO = {
    "metric": "reward",
    "mode": "max",
    "min_change_run": 0.05,
    "steps_needed": 80,
    "too_few_steps": "the default task needs ~80 steps",
}


def _history(values: list[float]) -> list[dict]:
    return [{"step": i + 1, "reward": v, "loss": 0.0} for i, v in enumerate(values)] + [{"train_loss": 0.0}]


def test_the_tiny_task_in_40_steps_did_not_rise():
    """metrics.jsonl's rewards of `method=grpo method.args.max_steps=40 method.args.logging_steps=1` (2 CPU cores)."""
    rewards = [
        0.002,
        0.008,
        0.012,
        0.008,
        0.002,
        0.006,
        0.008,
        0.006,
        0.014,
        0.01,
        0.004,
        0.014,
        0.012,
        0.014,
        0.016,
        0.014,
        0.008,
        0.008,
        0.018,
        0.02,
        0.014,
        0.016,
        0.018,
        0.023,
        0.02,
        0.021,
        0.012,
        0.002,
        0.012,
        0.023,
        0.021,
        0.021,
        0.014,
        0.031,
        0.018,
        0.02,
        0.018,
        0.033,
        0.016,
        0.02,
    ]
    line = note(_history(rewards), GRPO, 40, ["method=grpo", "method.args.max_steps=40"], "cosine")
    assert line == (
        "reward never rose above its first steps' level (0.0076 -> 0.021, means of the first and last 10 "
        "logged, over 40 steps): the default task needs ~80 steps; max_steps also shortens the LR schedule "
        "(cosine: it ends at step 40)"
    )


def test_a_rise_is_not_noted_and_the_hints_fit():
    rising = [0.01 * i for i in range(40)]
    assert note(_history(rising), GRPO, 40, ["method.args.max_steps=40"], "cosine") is None
    flat = [0.01] * 40
    # max_steps not given (the default schedule), or a constant schedule: no word about the schedule
    assert note(_history(flat), GRPO, 40, [], "cosine").endswith(
        "over 40 steps): the default task needs ~80 steps"
    )
    assert "LR schedule" not in note(_history(flat), GRPO, 40, ["++method.args.max_steps=40"], "constant")
    # a method that sets no min_change_run (DPO, SFT: a real run's loss need not halve) is never noted
    assert note(_history(flat), {"metric": "reward", "mode": "max"}, 40, [], "cosine") is None
    assert note(_history(flat[:3]), GRPO, 3, [], "cosine") is None  # too few logged values to tell
    # 200 steps (RLOO with a KL penalty that holds the reward down): the steps were enough, the task hint is not said
    assert note(_history(flat), GRPO, 200, [], "cosine") == (
        "reward never rose above its first steps' level (0.01 -> "
        "0.01, means of the first and last 10 logged, over 200 steps)"
    )


def test_noise_is_not_learning_and_learning_through_noise_is():
    rng = random.Random(0)
    noisy = [
        0.3 + rng.gauss(0, 0.2) for _ in range(40)
    ]  # sd 0.2 around a flat 0.3: quarters differ by chance
    assert moved(noisy, "max", 0.05) is not None
    rising = [
        0.3 + 0.02 * i + rng.gauss(0, 0.2) for i in range(40)
    ]  # +0.6 over the run, through the same noise
    assert moved(rising, "max", 0.05) is None
    assert moved([1.0 - 0.02 * i for i in range(40)], "min", 0.05) is None  # a falling loss, mode=min
