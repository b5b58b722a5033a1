"""`ablate compare`'s summary in words: every difference it tested on one line, the clear ones first."""

from __future__ import annotations

from ablate.analysis.many_seeds import Improvement
from ablate.analysis.per_example import ExamplePaired
from ablate.analysis.stats import Paired

TITLE = (
    "in words (clear: the 95% t interval excludes 0, or the Mann-Whitney test rejects a probability "
    "of improvement of 0.5)"
)


def in_words(paired: list[Paired], better: list[Improvement], examples: list[ExamplePaired]) -> list[str]:
    """One line per difference, the clear ones first: `clear: b higher than a on m (seed-paired)`,
    else `not clear: b vs a on m (...)`, or `not enough seeds to tell: ...` below the seeds a verdict
    needs."""
    clear: list[str] = []
    unclear: list[str] = []
    for what, items in (
        ("seed-paired", paired),
        ("probability of improvement", better),
        ("per example", examples),
    ):
        for d in items:
            where = f"[{d.launch}] " if d.launch else ""
            metric = f"eval {d.metric}" if isinstance(d, ExamplePaired) else d.metric
            if isinstance(d, Paired) and not d.tellable:
                unclear.append(f"not enough seeds to tell: {where}{d.b} vs {d.a} on {metric} ({what})")
            elif not d.clear:
                unclear.append(f"not clear: {where}{d.b} vs {d.a} on {metric} ({what})")
            elif isinstance(d, Improvement):
                clear.append(
                    f"clear: {where}{d.b} {'better' if d.p > 0.5 else 'worse'} "
                    f"than {d.a} on {metric} ({what})"
                )
            else:
                clear.append(
                    f"clear: {where}{d.b} {'higher' if (d.mean or 0.0) > 0 else 'lower'} than {d.a} on "
                    f"{metric} ({what})"
                )
    return clear + unclear
