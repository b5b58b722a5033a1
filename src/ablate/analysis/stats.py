"""Statistics for `ablate compare` over a handful of seeds: the 95% interval of an arm's mean, and the
seed-paired difference between two arms with a verdict in words and the number of seeds a clear answer
would take. docs/compare.md has every formula and the false-alarm rates measured by A/A simulation
(tests/unit/test_stats_calibration.py). Many seeds: ablate.analysis.many_seeds; per eval example:
ablate.analysis.per_example.

Why Student's t (scipy.stats.t) and not a bootstrap: a sweep has 3 to 10 seeds, and a percentile
bootstrap's interval can be no wider than the values it resamples, so with 3 seeds it called two
identical arms "clear" in a quarter of comparisons (A/A simulation: 24.5%, normal differences). The t
interval is exact when the seed-to-seed differences are normal; heavy tails make it more cautious,
not less (measured: Student t with 3 df). Its one assumption, said in the output, is that the
differences are roughly normal; below MIN_N of them no verdict is given at all.

Why not an exact sign-flip (permutation) test alone, which assumes only symmetric differences: with n
pairs its smallest two-sided p-value is 2 / 2^n, so it cannot say "clear" below 6 seeds, and a
3-seed sweep is the default.

Why paired: seed s of arm A and seed s of arm B share data order and sampling, so the per-seed
difference B_s - A_s cancels what the seed does to both; its interval is usually far narrower than the
two arms' intervals side by side.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from functools import cache, cached_property

import numpy as np
from scipy import special
from scipy import stats as sps

LEVEL = 0.95  # every interval's confidence level; a difference is clear at two-sided p < 1 - LEVEL
MIN_N = 3  # fewer values than this: no interval (with 2, the normality it rests on cannot even be glimpsed)
POWER = 0.80  # the power the "about N seeds" line plans for (Cohen's convention)
MAX_SEEDS = 10_000  # the power line's search stops here
T_METHOD = "95% t interval over the seeds (assumes roughly normal seed-to-seed values)"
ROUGH = 0.80  # the power plan's range: the seeds it would take at either end of the spread's 80% interval
# Metrics that cannot be negative, by a part of their name (ablate's, TRL's and lm-eval's names); those in
# FRACTIONS cannot pass 1 either. An arm's t interval that crosses such a bound is cut there (`bounded`).
NONNEGATIVE = (
    "grad_norm", "accurac", "/acc", "exact_match", "win_rate", "runtime", "seconds", "tokens_per_second",
    "mfu", "entropy", "length", "perplexity", "clipped_ratio", "frequency", "learning_rate", "num_tokens",
)  # fmt: skip
FRACTIONS = ("accurac", "/acc", "exact_match", "win_rate", "clipped_ratio", "frequency", "mfu")
PAIRED_METHOD = (
    "95% t interval over the per-seed differences (assumes they are roughly normal; a verdict "
    f"from {MIN_N} pairs on)"
)


@cache
def t_quantile(df: int, level: float = LEVEL) -> float:
    """Student's t quantile (1 + level) / 2 with `df` degrees of freedom: t_{0.975, 2} = 4.302653."""
    return float(sps.t.ppf((1 + level) / 2, df))


def t_interval(values: list[float], level: float = LEVEL) -> tuple[float, float] | None:
    """Student's t interval of the mean, mean ± t_{(1+level)/2, n-1} · sd / √n (sd with n − 1); None
    below MIN_N values.

    Hand-computed: [0.3, 0.5, 0.4]: mean 0.4, sd 0.1, t_{0.975, 2} = 4.302653, half-width
    4.302653 · 0.1 / √3 = 0.248414, interval [0.151586, 0.648414].
    """
    n = len(values)
    if n < MIN_N:
        return None
    mean = statistics.fmean(values)
    half = t_quantile(n - 1, level) * statistics.stdev(values) / math.sqrt(n)
    return mean - half, mean + half


def bounds(metric: str) -> tuple[float | None, float | None]:
    """The values `metric` cannot pass, by its name: (0, 1) for accuracies and rates, (0, None) for norms,
    times and counts, (None, None) for anything else (a margin, a reward, a loss of some objective)."""
    name = metric.lower()
    low = 0.0 if any(part in name for part in NONNEGATIVE) else None
    return low, (1.0 if any(part in name for part in FRACTIONS) else None)


def bounded(ci: tuple[float, float], metric: str) -> tuple[tuple[float, float], bool]:
    """The interval cut at the bounds `metric` cannot pass, and whether it was cut. Cutting keeps its
    coverage (the true mean lies inside the bounds, so the cut interval holds it whenever the uncut one
    did); an interval that needed cutting says the seeds are too few to place the mean.

    Hand-checked: grad_norm [-0.3387, 1.296] -> ([0, 1.296], True); rewards/margins [-0.3, 0.5] stays."""
    low, high = bounds(metric)
    lo = max(ci[0], low) if low is not None else ci[0]
    hi = min(ci[1], high) if high is not None else ci[1]
    return (lo, hi), (lo, hi) != ci


def t_pvalue(values: list[float]) -> float | None:
    """Two-sided p-value of the one-sample t test of mean 0 (the t interval excludes 0 exactly when it is
    below 1 - LEVEL); None below MIN_N values. No spread: 0 when the mean is not 0, else 1.

    Hand-computed: [0.3, 0.5, 0.4]: t = 0.4 / (0.1 / √3) = 6.9282, 2 df: p = 0.020204."""
    n = len(values)
    if n < MIN_N:
        return None
    mean, sd = statistics.fmean(values), statistics.stdev(values)
    if sd == 0:
        return 0.0 if mean else 1.0
    return float(2 * special.stdtr(n - 1, -abs(mean) / (sd / math.sqrt(n))))  # t's cdf: sps.t.sf, faster


def power(n: np.ndarray, effect: float, level: float = LEVEL) -> np.ndarray:
    """Power of the two-sided one-sample t test with n values at standardised effect mean/sd: P(|T| >
    t_crit) where T follows the noncentral t with n − 1 degrees of freedom and noncentrality
    effect · √n (scipy.stats.nct). Hand-checked: effect 1.0, n=10 -> 0.8031 (G*Power's table)."""
    df = n - 1
    crit = sps.t.ppf((1 + level) / 2, df)
    nc = effect * np.sqrt(n)
    return sps.nct.sf(crit, df, nc) + sps.nct.cdf(-crit, df, nc)


def seeds_for_power(mean: float, sd: float, target: float = POWER, level: float = LEVEL) -> int | None:
    """The fewest pairs (at least MIN_N) at which a true difference of `mean`, with per-seed spread
    `sd`, would be clear with probability `target`; None beyond MAX_SEEDS or when mean is 0.

    Hand-checked (one-sample t tables, e.g. G*Power): mean/sd = 1.0 -> 10; 0.5 -> 34; 0.8 -> 15.
    """
    if mean == 0:
        return None
    if sd == 0:  # no spread: any MIN_N pairs show it
        return MIN_N
    effect = abs(mean) / sd
    for lo, hi in ((MIN_N, 200), (201, MAX_SEEDS)):  # most answers lie in the first block
        n = np.arange(lo, hi + 1)
        reached = np.nonzero(power(n, effect, level) >= target)[0]
        if reached.size:
            return int(n[reached[0]])
    return None


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

    @cached_property
    def ci(self) -> tuple[float, float] | None:
        return t_interval(self.diffs)

    @cached_property
    def pvalue(self) -> float | None:
        """The paired t test's two-sided p-value (None below MIN_N pairs)."""
        return t_pvalue(self.diffs)

    @property
    def clear(self) -> bool:
        """The 95% t interval excludes 0 (a two-sided t test at p < 0.05)."""
        ci = self.ci
        return ci is not None and (ci[0] > 0 or ci[1] < 0)

    @property
    def tellable(self) -> bool:
        """Enough pairs for a verdict (MIN_N)."""
        return self.n >= MIN_N

    def seeds_needed(self) -> int | None:
        """Seeds per arm that would make a difference of the observed size clear at POWER, from the
        observed spread of the differences; None with fewer than 2 of them or a mean of 0."""
        if self.n < 2 or not self.mean:
            return None
        return seeds_for_power(self.mean, statistics.stdev(self.diffs))

    def rough(self) -> str:
        """How rough the seed count is: the spread comes from n − 1 degrees of freedom, so the count is
        given again at both ends of the spread's 80% interval (chi-square: sd·√((n−1)/χ²)), for the same
        difference, which a small sweep also tends to overstate.

        Hand-computed: diffs [0.1, 0.3, -0.05] (mean 0.1167, sd 0.1756, 2 df): χ²_{0.9, 2} = 4.6052,
        χ²_{0.1, 2} = 0.21072, sd from 0.1157 to 0.5409: 10 to 171 seeds (observed: 20)."""
        if self.n < 2 or not self.mean:
            return ""
        df, sd = self.n - 1, statistics.stdev(self.diffs)
        ends = [
            seeds_for_power(self.mean, sd * math.sqrt(df / sps.chi2.ppf(q, df)))
            for q in ((1 + ROUGH) / 2, (1 - ROUGH) / 2)
        ]
        span = f"{ends[0]}-{ends[1]}" if ends[1] is not None else f"{ends[0]} to over {MAX_SEEDS:,}"
        return (
            f"rough: the spread comes from {self.n} pairs; over its {ROUGH:.0%} interval {span} seeds, "
            "and a small sweep tends to overstate the difference"
        )

    def power_line(self) -> str:
        """`about 7 seeds per arm would make a difference of this size clear at 80% power`, for a
        difference that is not clear (else "")."""
        if self.clear or self.n < 2 or all(d == 0 for d in self.diffs):
            return ""
        needed = self.seeds_needed()
        if needed is None:
            return (
                "the mean difference is 0: no number of seeds would make it clear"
                if not self.mean
                else f"more than {MAX_SEEDS:,} seeds per arm would be needed to make a difference this small "
                "clear"
            )
        return (
            f"about {needed} seeds per arm would make a difference of this size clear at {POWER:.0%} power "
            f"({self.rough()})"
        )

    def verdict(self) -> str:
        """One line: `b − a metric = d [lo, hi], n=3 pairs: b higher (95% t interval excludes 0)`."""
        head = f"{self.b} − {self.a} {self.metric}"
        if self.n == 0:
            return f"{head}: no seed ran in both arms, so no paired difference"
        value = f"{head} = {self.mean:+.4g}"
        ci = self.ci
        if ci is None:
            needed = self.seeds_needed()
            more = (
                f"about {max(needed, MIN_N)} seeds per arm would make a difference of this size clear at "
                f"{POWER:.0%} power ({self.rough()})"
                if needed
                else f"run at least {MIN_N} seeds per arm"
            )
            return (
                f"{value}, n={self.n} pair{'s' if self.n > 1 else ''}: not enough seeds to tell (a t "
                f"interval needs {MIN_N} pairs); {more}"
            )
        text = f"{value} [{ci[0]:+.4g}, {ci[1]:+.4g}], n={self.n} pairs: "
        if all(d == 0 for d in self.diffs):
            return text + "identical in every pair"
        if ci[0] > 0:
            return text + f"{self.b} higher (95% t interval excludes 0)"
        if ci[1] < 0:
            return text + f"{self.b} lower (95% t interval excludes 0)"
        return text + "no clear difference (95% t interval includes 0)"


def paired(
    a_label: str, a: dict[str, list[float]], b_label: str, b: dict[str, list[float]], metric: str
) -> Paired:
    """Seed-paired difference b - a. `a`, `b`: values per seed (a seed run twice, e.g. by two pooled
    launches, counts once, with its mean)."""
    seeds = [s for s in a if s in b and a[s] and b[s]]
    diffs = [statistics.fmean(b[s]) - statistics.fmean(a[s]) for s in seeds]
    return Paired(a_label, b_label, metric, seeds, diffs)
