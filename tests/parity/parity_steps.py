"""What the TRL parity tests share: the arguments of a short training run, and the step-by-step comparison of
what both trainers log (a policy moved off its reference: tests/tiny_setups.py).

A module the tests import (`from parity_steps import ...`, tests/parity being on their path), not a
tests/parity/conftest.py: pytest imports every conftest.py of a folder without __init__.py as the module
`conftest`, so a second one would shadow tests/conftest.py for the `from conftest import ...` of tests/slow.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

# a parity run's Trainer arguments besides max_steps: AdamW at lr 1e-3 (the steps after the first run on
# moved weights), every step logged, nothing saved
STEPS = dict(learning_rate=1e-3, logging_steps=1, save_strategy="no", disable_tqdm=True)
# the sampling methods' runs besides max_steps: plain SGD at lr 1 (an update is the gradient itself), every
# step logged, nothing saved, float32 on the CPU (TRL defaults to bf16 autocast: a comparison of precision)
SGD_STEPS = dict(
    optim="sgd",
    learning_rate=1.0,
    logging_steps=1,
    save_strategy="no",
    disable_tqdm=True,
    report_to="none",
    use_cpu=True,
    bf16=False,
)


def train_both(
    theirs: Any, ours: Any, steps: int, names: Iterable[str], optional: bool = False
) -> list[dict[str, Any]]:
    """Train TRL's trainer and ours: each logs `steps` steps, and at each step `loss` and every one of `names`
    are within 1e-5 of TRL's, relative above 1 (float32 keeps ~7 digits). `optional`: a name TRL did not log
    at a step must be missing from ours too (KTO: a batch of one label has no margin; RLOO: a round's
    metrics are logged at the step that generates it). Returns our steps' logs, for the test's own checks
    that the run moved."""
    theirs.train()
    ours.train()
    steps_theirs = [e for e in theirs.state.log_history if "loss" in e]
    steps_ours = [e for e in ours.state.log_history if "loss" in e]
    assert len(steps_theirs) == len(steps_ours) == steps
    for a, b in zip(steps_ours, steps_theirs):
        for name in ("loss", *names):
            if optional and name not in b:
                assert name not in a, name
                continue
            assert name in a and name in b, (a["step"], name)
            assert abs(a[name] - b[name]) <= 1e-5 * max(1.0, abs(b[name])), (
                a["step"],
                name,
                a[name],
                b[name],
            )
    return steps_ours
