"""Statistics for `ablate compare`: bootstrap confidence intervals over seeds and seed-paired
differences between two arms, with a verdict in words; from MANY_SEEDS seeds per arm on, the
interquartile mean, the probability of improvement and performance profiles (Agarwal et al. 2021);
and paired per-example differences on a shared eval set (Miller 2024). docs/compare.md has every
formula.

Why a bootstrap: a sweep has a handful of seeds per arm and no reason to assume normal errors; the
percentile bootstrap (Efron & Tibshirani 1993, ch. 13) makes no such assumption. With very few
seeds it is still too optimistic (it can never be wider than the spread of the values seen), so
below MIN_N values no interval is given at all and the output says so instead.

Why paired: seed s of arm A and seed s of arm B share data order and sampling, so the per-seed
difference B_s - A_s cancels what the seed does to both; its interval is usually far narrower than
the two arms' intervals side by side. The same holds per eval example: both arms answer the same
question, so its difficulty cancels in the difference.

Fixed RNG seeds: the same runs always give the same intervals. The many-seed statistics resample
with numpy (vectorised: 10,000 resamples of a (runs, tasks) matrix at once); the rest is plain Python.
Not scipy.stats.bootstrap (issue 34 asked): it would replace only `bootstrap_ci`'s few lines, not the
stratified IQM or probability-of-improvement intervals, and scipy is no dependency of ablate today.
"""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import dataclass
from typing import Sequence

import numpy as np

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

    @property
    def clear(self) -> bool:
        """The 95% interval excludes 0."""
        ci = self.ci
        return ci is not None and (ci[0] > 0 or ci[1] < 0)

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


# ---------------------------------------------------------------------------------------------------
# Many seeds (Agarwal et al. 2021, "Deep RL at the Edge of the Statistical Precipice"; rliable's
# methods, reimplemented: the library is archived). Scores are a (runs, tasks) matrix; one metric of
# `ablate compare` is one task, so in compare the strata are just the arm's seeds.

MANY_SEEDS = 5  # from this many seeds in every arm: IQM, probability of improvement, performance profile
Z95 = 1.96  # the normal quantile of a 95% interval (Miller 2024 uses the same ±1.96 SE)
# Metric names holding one of these are lower-is-better (probability of improvement, profiles); the
# rest higher-is-better. A name rule, not a registry: ablate's losses, times and perplexities.
LOWER_IS_BETTER = ("loss", "perplexity", "runtime", "seconds", "time/", "timing/")
_CHUNK = 4_000_000  # resample x pair comparisons held in memory at once (booleans: ~4 MB)

Scores = Sequence[float] | Sequence[Sequence[float]] | np.ndarray


def higher_is_better(metric: str) -> bool:
    """False for losses, times and perplexities (LOWER_IS_BETTER), True otherwise."""
    return not any(part in metric.lower() for part in LOWER_IS_BETTER)


def _matrix(scores: Scores) -> np.ndarray:
    """(runs,) or (runs, tasks) -> float array (runs, tasks)."""
    x = np.asarray(scores, dtype=float)
    return x[:, None] if x.ndim == 1 else x


def _iqm_rows(flat: np.ndarray) -> np.ndarray:
    """IQM of each row of (R, N): sort, drop k = int(N/4) from each end, average the rest."""
    n = flat.shape[1]
    k = int(0.25 * n)
    return np.sort(flat, axis=1)[:, k:n - k].mean(axis=1)


def iqm(scores: Scores) -> float:
    """Interquartile mean over all runs x tasks: the mean of the scores left after dropping the
    k = int(N/4) lowest and the k highest of the N scores (scipy.stats.trim_mean(x, 0.25), as
    rliable's aggregate_iqm). For N divisible by 4 that is exactly the middle 50%; otherwise a bit
    more (N=5, 6, 7 drop one score at each end).

    Hand-computed:
      [1, 2, 3, 4, 5, 6, 7, 8]   N=8, k=2: mean(3, 4, 5, 6) = 4.5
      [1, 2, 3, 4, 100]          N=5, k=1: mean(2, 3, 4) = 3.0 (the outlier 100 is dropped; the mean is 22)
      [1, 1, 1, 2, 2, 2]         N=6, k=1 (ties): drop one 1 and one 2, mean(1, 1, 2, 2) = 1.5
      [[1, 10], [2, 20], [3, 30], [4, 40]]  (4 runs x 2 tasks) N=8, k=2: sorted 1 2 3 4 10 20 30 40,
                                 mean(3, 4, 10, 20) = 9.25
    """
    x = _matrix(scores)
    return float(_iqm_rows(x.reshape(1, -1))[0])


def stratified_resamples(scores: Scores, resamples: int, rng: np.random.Generator) -> np.ndarray:
    """(resamples, runs, tasks): in each resample, each task's column is `runs` draws with
    replacement from that task's own runs (rliable's StratifiedBootstrap: tasks are the strata, so
    every resample keeps every task, and a task's runs never stand in for another's)."""
    x = _matrix(scores)
    runs, tasks = x.shape
    idx = rng.integers(0, runs, size=(resamples, runs, tasks))
    return x[idx, np.arange(tasks)]


def _percentiles(values: np.ndarray, level: float) -> tuple[float, float]:
    lo, hi = np.quantile(values, [(1 - level) / 2, (1 + level) / 2])  # numpy's linear interpolation
    return float(lo), float(hi)


def iqm_ci(scores: Scores, level: float = LEVEL, resamples: int = RESAMPLES,
           seed: int = 0) -> tuple[float, float] | None:
    """Percentile interval of the IQM over stratified bootstrap resamples; None below MIN_N runs.

    Hand-computed (why stratified): 5 runs x 2 tasks, task 0 scores all 1, task 1 all 3. Every
    stratified resample holds five 1s and five 3s again, so its IQM is always mean(1, 1, 1, 3, 3, 3)
    = 2 (N=10, k=2) and the interval is [2, 2]; resampling the 10 scores without strata would mix
    the tasks' counts and widen it.
    """
    x = _matrix(scores)
    if x.shape[0] < MIN_N:
        return None
    rng = np.random.default_rng(seed)
    resampled = stratified_resamples(x, resamples, rng)
    return _percentiles(_iqm_rows(resampled.reshape(resamples, -1)), level)


def _poi_rows(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """P(X > Y) of each resample: x (R, n, T), y (R, m, T) -> (R,)."""
    gt = (x[:, :, None, :] > y[:, None, :, :]).mean(axis=(1, 2))
    eq = (x[:, :, None, :] == y[:, None, :, :]).mean(axis=(1, 2))
    return (gt + 0.5 * eq).mean(axis=1)


def probability_of_improvement(x: Scores, y: Scores) -> float:
    """P(X > Y) (Agarwal et al. 2021, sec. 4.3): for each task, the Mann-Whitney U statistic of x
    over y divided by n*m, i.e. the fraction of the n*m run pairs where x's run scores higher, ties
    counting 1/2; averaged over tasks. x is (n, tasks), y is (m, tasks); n and m may differ.

    Hand-computed:
      x = [3, 4, 5, 6, 7], y = [1, 2, 3, 4, 5]: x=3 beats 1, 2 and ties 3 -> 2.5; x=4 -> 3.5;
        x=5 -> 4.5; x=6 -> 5; x=7 -> 5; U = 20.5, P = 20.5 / 25 = 0.82
      identical arms: every pair (i, j) has a mirror (j, i), so P = 0.5 exactly (rliable
        special-cases it; the formula gives it anyway)
      x = [[2, 0], [2, 0]], y = [[1, 1], [1, 1]] (2 tasks): task 0 P = 1, task 1 P = 0; mean 0.5
    """
    return float(_poi_rows(_matrix(x)[None], _matrix(y)[None])[0])


def poi_ci(x: Scores, y: Scores, level: float = LEVEL, resamples: int = RESAMPLES,
           seed: int = 0) -> tuple[float, float] | None:
    """Percentile interval of P(X > Y): x and y each resampled on their own, stratified by task
    (rliable's StratifiedIndependentBootstrap: the arms' runs are not paired). None below MIN_N runs
    in either arm. Hand-computed: x = [2]*5, y = [1]*5 -> every resample P = 1, interval [1, 1]."""
    x, y = _matrix(x), _matrix(y)
    if min(x.shape[0], y.shape[0]) < MIN_N:
        return None
    rng = np.random.default_rng(seed)
    chunk = max(1, _CHUNK // (x.shape[0] * y.shape[0] * x.shape[1]))
    values = np.concatenate([_poi_rows(stratified_resamples(x, r, rng), stratified_resamples(y, r, rng))
                             for r in [min(chunk, resamples - s) for s in range(0, resamples, chunk)]])
    return _percentiles(values, level)


@dataclass
class Improvement:
    """P(arm `b` better than arm `a`) on `metric` over their seeds, with its interval."""

    a: str
    b: str
    metric: str
    n_a: int
    n_b: int
    p: float
    ci: tuple[float, float] | None
    launch: str = ""

    @property
    def clear(self) -> bool:
        """The 95% interval excludes 0.5 (a coin flip)."""
        return self.ci is not None and (self.ci[0] > 0.5 or self.ci[1] < 0.5)

    def verdict(self) -> str:
        """`P(b better than a on m) = 0.82 [0.6, 0.98], 6 vs 6 seeds: clear, b better (...)`."""
        text = f"P({self.b} better than {self.a} on {self.metric}) = {self.p:.2f}"
        if self.ci is None:
            return text + f", {self.n_b} vs {self.n_a} seeds: too few seeds for an interval"
        text += f" [{self.ci[0]:.2f}, {self.ci[1]:.2f}], {self.n_b} vs {self.n_a} seeds: "
        if self.ci[0] > 0.5:
            return text + f"clear, {self.b} better (95% interval above 0.5)"
        if self.ci[1] < 0.5:
            return text + f"clear, {self.b} worse (95% interval below 0.5)"
        return text + "not clear (95% interval includes 0.5)"


def improvement(a_label: str, a: Scores, b_label: str, b: Scores, metric: str) -> Improvement:
    """P(b better than a): P(B > A), or P(B < A) for a lower-is-better metric (scores negated)."""
    sign = 1.0 if higher_is_better(metric) else -1.0
    xa, xb = sign * _matrix(a), sign * _matrix(b)
    return Improvement(a_label, b_label, metric, xa.shape[0], xb.shape[0],
                       probability_of_improvement(xb, xa), poi_ci(xb, xa))


def tau_grid(arms: list[Scores], points: int = 101) -> list[float]:
    """`points` thresholds evenly from the lowest to the highest score of any arm."""
    flat = np.concatenate([_matrix(a).ravel() for a in arms])
    return np.linspace(flat.min(), flat.max(), points).tolist()


def performance_profile(scores: Scores, taus: Sequence[float], higher: bool = True) -> list[float]:
    """Score distribution (Agarwal et al. 2021, sec. 4.2; rliable's run_score_deviation): for each
    threshold tau, the fraction of all runs x tasks scores above tau (below it when lower is better).

    Hand-computed: scores [1, 2, 3, 4, 5], taus [0, 2.5, 5]: above 0: 5/5 = 1.0; above 2.5: 3, 4,
    5 -> 0.6; above 5: none (strictly above) -> 0.0. Lower is better, taus [1, 3.5]: below 1: 0.0;
    below 3.5: 1, 2, 3 -> 0.6.
    """
    x = _matrix(scores).ravel()[None, :]
    t = np.asarray(taus, dtype=float)[:, None]
    return ((x > t) if higher else (x < t)).mean(axis=1).tolist()


# ---------------------------------------------------------------------------------------------------
# Per-example paired differences on a shared eval set (Miller 2024, "Adding Error Bars to Evals",
# on paired analysis). Each example's score in an arm is its mean over that arm's runs (Miller's advice
# on resampling: averaging several answers per question shrinks the within-question variance).


@dataclass
class ExamplePaired:
    """Arm `b` minus arm `a` on `metric`, one difference per eval example both arms scored."""

    a: str
    b: str
    metric: str
    ids: list[str]
    a_scores: list[float]
    b_scores: list[float]
    launch: str = ""

    @property
    def n(self) -> int:
        return len(self.ids)

    @property
    def diffs(self) -> list[float]:
        return [y - x for x, y in zip(self.a_scores, self.b_scores)]

    @property
    def mean(self) -> float | None:
        return statistics.fmean(self.diffs) if self.ids else None

    @property
    def se(self) -> float | None:
        """Paired standard error sd(d_i) / sqrt(n), sd with n-1 (Miller 2024, paired analysis: Var(s_A -
        s_B) = Var(s_A) + Var(s_B) - 2 Cov(s_A, s_B); the covariance is what pairing removes)."""
        return statistics.stdev(self.diffs) / math.sqrt(self.n) if self.n > 1 else None

    @property
    def se_unpaired(self) -> float | None:
        """What the standard error would be ignoring the pairing: sqrt((Var(a) + Var(b)) / n)."""
        if self.n < 2:
            return None
        return math.sqrt((statistics.variance(self.a_scores) + statistics.variance(self.b_scores)) / self.n)

    @property
    def ci(self) -> tuple[float, float] | None:
        """mean ± 1.96 SE (the central limit theorem over examples: evals have hundreds of them)."""
        if self.se is None or self.mean is None:
            return None
        return self.mean - Z95 * self.se, self.mean + Z95 * self.se

    @property
    def clear(self) -> bool:
        ci = self.ci
        return ci is not None and (ci[0] > 0 or ci[1] < 0)

    def verdict(self) -> str:
        """`b − a eval m = +0.125 [+0.03117, +0.2188] (SE 0.048 paired, 0.19 unpaired), n=4 examples: clear, ...`."""
        head = f"{self.b} − {self.a} eval {self.metric}"
        if self.n == 0:
            return f"{head}: no example scored in both arms, so no paired difference"
        ci, se, se_u = self.ci, self.se, self.se_unpaired
        if ci is None or se is None or se_u is None:
            return f"{head} = {self.mean:+.4g}, n=1 example: too few for a standard error"
        text = (f"{head} = {self.mean:+.4g} [{ci[0]:+.4g}, {ci[1]:+.4g}] (SE {se:.2g} paired, {se_u:.2g} "
                f"unpaired), n={self.n} examples: ")
        if all(d == 0 for d in self.diffs):
            return text + "identical on every example"
        if ci[0] > 0:
            return text + f"clear, {self.b} higher (95% interval excludes 0)"
        if ci[1] < 0:
            return text + f"clear, {self.b} lower (95% interval excludes 0)"
        return text + "not clear (95% interval includes 0)"


def paired_examples(a_label: str, a: dict[str, list[float]], b_label: str, b: dict[str, list[float]],
                    metric: str) -> ExamplePaired:
    """Per-example difference b - a. `a`, `b`: scores per example id, one per run of the arm (each
    example's score is their mean); examples are paired by id, in `a`'s order.

    Hand-computed (docs/compare.md): a = [0.2, 0.4, 0.6, 0.8], b = [0.3, 0.6, 0.6, 1.0]: d = [0.1, 0.2,
    0.0, 0.2], mean 0.125; squared deviations 0.000625 + 0.005625 + 0.015625 + 0.005625 = 0.0275,
    sd = sqrt(0.0275 / 3) = 0.095743, SE = 0.095743 / 2 = 0.047871, interval 0.125 ± 1.96 * 0.047871
    = [0.03117, 0.21883] (clear). Unpaired: Var(a) = 0.2 / 3, Var(b) = 0.2475 / 3, SE =
    sqrt(0.1491667 / 4) = 0.193111, which would put 0 inside the interval.
    """
    ids = [i for i in a if i in b and a[i] and b[i]]
    return ExamplePaired(a_label, b_label, metric, ids, [statistics.fmean(a[i]) for i in ids],
                         [statistics.fmean(b[i]) for i in ids])


def in_words(paired: list[Paired], better: list[Improvement], examples: list[ExamplePaired]) -> list[str]:
    """One line per difference, the clear ones first: `clear: b higher than a on m (seed-paired)` when
    its 95% interval excludes "no difference" (0, or 0.5 for a probability of improvement), else
    `not clear: b vs a on m (...)`."""
    clear: list[str] = []
    unclear: list[str] = []
    for what, items in (("seed-paired", paired), ("probability of improvement", better), ("per example", examples)):
        for d in items:
            where = f"[{d.launch}] " if d.launch else ""
            metric = f"eval {d.metric}" if isinstance(d, ExamplePaired) else d.metric
            if not d.clear:
                unclear.append(f"not clear: {where}{d.b} vs {d.a} on {metric} ({what})")
                continue
            if isinstance(d, Improvement):
                how = "better" if d.p > 0.5 else "worse"
            else:
                how = "higher" if (d.mean or 0.0) > 0 else "lower"
            clear.append(f"clear: {where}{d.b} {how} than {d.a} on {metric} ({what})")
    return clear + unclear
