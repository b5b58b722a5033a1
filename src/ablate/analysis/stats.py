"""Statistics for `ablate compare`: bootstrap confidence intervals over seeds and seed-paired
differences between two arms, with a verdict in words.

Why a bootstrap: a sweep has a handful of seeds per arm and no reason to assume normal errors; the
percentile bootstrap (Efron & Tibshirani 1993, ch. 13) makes no such assumption. With very few
seeds it is still too optimistic (it can never be wider than the spread of the values seen), so
below MIN_N values no interval is given at all and the output says so instead.

Why paired: seed s of arm A and seed s of arm B share data order and sampling, so the per-seed
difference B_s - A_s cancels what the seed does to both; its interval is usually far narrower than
the two arms' intervals side by side.

Pure Python with a fixed RNG seed: the same runs always give the same intervals, and no numpy.
"""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass

MIN_N = 3  # fewer values than this: no interval (a 2-value bootstrap is just [min, max])
RESAMPLES = 10_000
LEVEL = 0.95


def bootstrap_ci(values: list[float], level: float = LEVEL, resamples: int = RESAMPLES,
                 seed: int = 0) -> tuple[float, float] | None:
    """Percentile bootstrap interval of the mean of `values`; None when len(values) < MIN_N."""
    n = len(values)
    if n < MIN_N:
        return None
    rng = random.Random(seed)
    means = sorted(sum(rng.choices(values, k=n)) / n for _ in range(resamples))
    lo = means[int((1 - level) / 2 * resamples)]
    hi = means[min(resamples - 1, int((1 + level) / 2 * resamples))]
    return lo, hi


@dataclass
class Paired:
    """Arm `b` minus arm `a` on `metric`, one difference per seed both arms ran."""

    a: str
    b: str
    metric: str
    seeds: list[str]
    diffs: list[float]
    launch: str = ""  # the launch both arms ran in ("" when launches are pooled or there is one)

    @property
    def n(self) -> int:
        return len(self.diffs)

    @property
    def mean(self) -> float | None:
        return statistics.fmean(self.diffs) if self.diffs else None

    @property
    def ci(self) -> tuple[float, float] | None:
        return bootstrap_ci(self.diffs)

    def verdict(self) -> str:
        """One line: `b − a metric = d [lo, hi], n=3 pairs: b higher (interval excludes 0)`."""
        head = f"{self.b} − {self.a} {self.metric}"
        if self.n == 0:
            return f"{head}: no seed ran in both arms, so no paired difference"
        value = f"{head} = {self.mean:+.4g}"
        ci = self.ci
        if ci is None:
            return (f"{value}, n={self.n} pair{'s' if self.n > 1 else ''}: too few seeds to say anything "
                    f"(an interval needs n ≥ {MIN_N} pairs; run more seeds)")
        text = f"{value} [{ci[0]:+.4g}, {ci[1]:+.4g}], n={self.n} pairs: "
        if all(d == 0 for d in self.diffs):
            return text + "identical in every pair"
        if ci[0] > 0:
            return text + f"{self.b} higher (95% interval excludes 0)"
        if ci[1] < 0:
            return text + f"{self.b} lower (95% interval excludes 0)"
        return text + "no clear difference (95% interval includes 0)"


def paired(a_label: str, a: dict[str, list[float]], b_label: str, b: dict[str, list[float]],
           metric: str) -> Paired:
    """Seed-paired difference b - a. `a`, `b`: values per seed (a seed run twice, e.g. by two pooled
    launches, counts once, with its mean)."""
    seeds = [s for s in a if s in b and a[s] and b[s]]
    diffs = [statistics.fmean(b[s]) - statistics.fmean(a[s]) for s in seeds]
    return Paired(a_label, b_label, metric, seeds, diffs)
