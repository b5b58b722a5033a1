"""`ablate compare`'s summary in words: one verdict per metric and pair of arms, the clear ones first, at
one false-alarm rate however many tests and metrics stand behind it.

Each metric of a pair of arms may have up to three tests: the seed-paired t test (from stats.MIN_N pairs),
the Mann-Whitney test of the probability of improvement (from many_seeds.MANY_SEEDS seeds) and the
per-example paired test (eval_examples.jsonl). Calling the metric clear when any of them rejects at 5%
would call two identical arms clear more often than 5% (6.7% with the first two at 5 independent seeds,
docs/compare.md), so the tests of one metric are combined by Holm's step-down procedure (Holm 1979): the
metric is clear when its smallest p-value times the number of its tests is below 5% (Holm's first step).
The metrics of one pair are then adjusted together by Benjamini-Hochberg (1995), which keeps the share
of false verdicts among the clear ones at 5%, and with no true difference at all (an A/A comparison) the
chance of any clear verdict at 5%. `--metric M` alone is one metric: nothing to adjust across.
A/A simulation through this function: tests/unit/test_stats_calibration.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ablate.analysis.comparable import held_out_name
from ablate.analysis.many_seeds import Improvement
from ablate.analysis.per_example import ExamplePaired
from ablate.analysis.stats import LEVEL, Paired

TITLE = (
    "in words (one verdict per metric: clear when its smallest p-value, Holm-adjusted over its tests "
    "(seed-paired t; Mann-Whitney from 5 seeds; per example) and Benjamini-Hochberg-adjusted over the "
    f"metrics ranked, is below {1 - LEVEL:.2g})"
)
WHAT = {Paired: "seed-paired t", Improvement: "Mann-Whitney", ExamplePaired: "per example"}


@dataclass
class Verdict:
    """One metric of one pair of arms: its tests, their p-values, and the adjusted one."""

    launch: str
    a: str
    b: str
    metric: str
    tests: list[Any] = field(default_factory=list)  # Paired, Improvement, ExamplePaired with a p-value
    adjusted: float | None = None  # Holm over the tests, then Benjamini-Hochberg over the pair's metrics

    @property
    def holm(self) -> float | None:
        """Holm's adjusted smallest p-value over this metric's tests: min(1, k · min p)."""
        ps = [t.pvalue for t in self.tests]
        return min(1.0, len(ps) * min(ps)) if ps else None

    @property
    def clear(self) -> bool:
        return self.adjusted is not None and self.adjusted < 1 - LEVEL

    def line(self, metrics: int) -> str:
        where = f"[{self.launch}] " if self.launch else ""
        if not self.tests:
            return f"not enough seeds to tell: {where}{self.b} vs {self.a} on {self.metric}"
        best = min(self.tests, key=lambda t: t.pvalue)
        tests = f"{len(self.tests)} test{'s' if len(self.tests) > 1 else ''}"
        over = f", {metrics} metrics" if metrics > 1 else ""
        why = f"{WHAT[type(best)]} p {_p(best.pvalue)}; adjusted for {tests}{over}: {_p(self.adjusted)}"
        if not self.clear:
            return f"not clear: {where}{self.b} vs {self.a} on {self.metric} ({why})"
        if isinstance(best, Improvement):
            how = "better" if best.p > 0.5 else "worse"
        else:
            how = "higher" if (best.mean or 0.0) > 0 else "lower"
        return f"clear: {where}{self.b} {how} than {self.a} on {self.metric} ({why})"


def _p(p: float | None) -> str:
    """`= 0.012`, or `< 0.001` (a smaller one says no more, and float noise makes a constant difference's
    p-value read 1e-80)."""
    return "< 0.001" if p is not None and p < 0.001 else f"= {p:.2g}"


def benjamini_hochberg(ps: list[float]) -> list[float]:
    """Benjamini-Hochberg adjusted p-values, in the given order: sorted ascending, p_(i) · m / i, made
    monotone from the largest down, capped at 1.

    Hand-computed: [0.01, 0.04, 0.03] -> sorted 0.01, 0.03, 0.04; times 3/1, 3/2, 3/3: 0.03, 0.045, 0.04;
    monotone from the top: 0.03, 0.04, 0.04 -> in the given order [0.03, 0.04, 0.04]."""
    m = len(ps)
    order = sorted(range(m), key=lambda i: ps[i])
    out = [1.0] * m
    running = 1.0
    for rank in range(m, 0, -1):
        i = order[rank - 1]
        running = min(running, ps[i] * m / rank)
        out[i] = min(1.0, running)
    return out


def verdicts(paired: list[Paired], better: list[Improvement], examples: list[ExamplePaired]) -> list[Verdict]:
    """The tests grouped per (launch, arm pair, metric), each metric Holm-adjusted over its tests, then the
    metrics of each pair Benjamini-Hochberg-adjusted together. A per-example test of `m` is a test of the
    held-out metric `eval_m` (comparable.held_out_name), as is the seed-paired test of `eval_m`."""
    found: dict[tuple[str, str, str, str], Verdict] = {}
    for d in [*paired, *better, *examples]:
        metric = held_out_name(d.metric) if isinstance(d, ExamplePaired) else d.metric
        v = found.setdefault((d.launch, d.a, d.b, metric), Verdict(d.launch, d.a, d.b, metric))
        if getattr(d, "pvalue", None) is not None and (not isinstance(d, Paired) or d.tellable):
            v.tests.append(d)
    pairs: dict[tuple[str, str, str], list[Verdict]] = {}
    for v in found.values():
        if v.tests:
            pairs.setdefault((v.launch, v.a, v.b), []).append(v)
    for tested in pairs.values():
        for v, p in zip(tested, benjamini_hochberg([1.0 if v.holm is None else v.holm for v in tested])):
            v.adjusted = p
    return list(found.values())


def in_words(paired: list[Paired], better: list[Improvement], examples: list[ExamplePaired]) -> list[str]:
    """One line per metric and pair of arms, the clear ones first: `clear: b higher than a on m (seed-paired
    t p = 0.002; adjusted for 2 tests, 3 metrics: = 0.006)`, else `not clear: b vs a on m (...)`, or `not
    enough seeds to tell: ...` when no test has the seeds it needs."""
    found = verdicts(paired, better, examples)
    counts: dict[tuple[str, str, str], int] = {}
    for v in found:
        if v.tests:
            counts[(v.launch, v.a, v.b)] = counts.get((v.launch, v.a, v.b), 0) + 1
    lines = [(v.clear, v.line(counts.get((v.launch, v.a, v.b), 0))) for v in found]
    return [text for clear, text in lines if clear] + [text for clear, text in lines if not clear]
