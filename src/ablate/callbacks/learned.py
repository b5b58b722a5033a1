"""Whether a finished run learned: its progress metric (`method.progress`: GRPO's reward rises) compared
between the first and the last quarter of its logged values. A run that did not move it gets one line
in its summary (summary.json's `note`, printed under the final table) with the hints that fit: the
method's own (`method.progress.too_few_steps`: how many steps its default task needs, said when the run
had fewer than `steps_needed`) and, when
`method.args.max_steps` was given with a decaying schedule, that max_steps shortened the schedule too.
`debug=overfit` fails a run on one repeated batch; this only says so, for a real run, and only for a
method that sets `method.progress.min_change_run` (GRPO and RLOO; a real DPO or SFT loss need not halve).

"Moved" is robust to noise: the quarters' means must differ, in the metric's direction, by more than
two standard errors of their difference and by more than `min_change_run` (absolute: a reward in
[0, 1]), so a sampled reward's noise, or 0.006 -> 0.02 in 40 steps of the tiny task, is not learning."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

MIN_LOGGED = 4  # fewer logged values cannot tell a first quarter from a last: nothing said
CONSTANT = "constant"  # the schedule max_steps does not shorten


def moved(values: Sequence[float], mode: str, min_change: float) -> tuple[float, float, int] | None:
    """(first quarter's mean, last quarter's mean, quarter size) when `values` did not move in `mode`'s
    direction (max: up, min: down) by more than `min_change` and two standard errors; None when it did,
    or when there are too few values to tell."""
    q = len(values) // 4
    if len(values) < MIN_LOGGED:
        return None
    first, last = values[:q], values[-q:]
    m0, m1 = sum(first) / q, sum(last) / q

    def var(xs: Sequence[float], m: float) -> float:  # one value: 0
        return sum((x - m) ** 2 for x in xs) / max(len(xs) - 1, 1)

    se = math.sqrt(var(first, m0) / q + var(last, m1) / q)
    gain = m1 - m0 if mode == "max" else m0 - m1
    return None if gain > max(2 * se, min_change) else (m0, m1, q)


def note(
    history: Sequence[Mapping[str, Any]],
    progress: Mapping[str, Any] | None,
    steps: int,
    overrides: Sequence[str],
    scheduler: str | None,
) -> str | None:
    """The summary's line when the run's progress metric did not move (None if it did, or if unknown)."""
    if not progress or progress.get("metric") is None or progress.get("min_change_run") is None:
        return None
    metric, mode = progress["metric"], progress.get("mode", "min")
    values = [float(e[metric]) for e in history if isinstance(e.get(metric), (int, float))]
    still = moved(values, mode, float(progress["min_change_run"]))
    if still is None:
        return None
    m0, m1, q = still
    verb = "rose above" if mode == "max" else "fell below"
    # else steps were not it
    short = progress.get("steps_needed") is None or steps < int(progress["steps_needed"])
    hints = [progress["too_few_steps"]] if progress.get("too_few_steps") and short else []
    if (
        any(o.split("=")[0].lstrip("+") == "method.args.max_steps" for o in overrides)
        and scheduler != CONSTANT
    ):
        hints.append(
            "max_steps also shortens the LR schedule "
            f"({scheduler + ': ' if scheduler else ''}it ends at step {steps})"
        )
    span = "first and last logged values" if q == 1 else f"means of the first and last {q} logged"
    return (
        f"{metric} never {verb} its first steps' level ({m0:.2g} -> {m1:.2g}, {span}, over {steps} steps)"
        + (f": {'; '.join(hints)}" if hints else "")
    )
