"""Statistics for arms with many seeds (Agarwal et al. 2021, "Deep RL at the Edge of the Statistical
Precipice"; rliable's definitions, reimplemented: the library is archived): the interquartile mean, the
probability of improvement with an exact Mann-Whitney test, and performance profiles. Scores are a
(runs, tasks) matrix; one metric of `ablate compare` is one task.

How this departs from rliable, on measurement (A/A simulation, tests/unit/test_stats_calibration.py;
numbers in docs/compare.md): rliable's percentile bootstrap intervals miss their 95% at 5 to 10 seeds.
The probability of improvement's interval called two identical arms clear in 9-10% of comparisons at 5
seeds, so its verdict is the exact Mann-Whitney test of P(X > Y) = 1/2 instead (scipy.stats.mannwhitneyu:
P(X > Y) is its U statistic over n·m), whose false-alarm rate stayed at or under 5% at every n. The
IQM's interval missed the true IQM in 6-10% of draws (percentile bootstrap), 6-11% (scipy's BCa) and
1.5-7.5% (the trimmed-mean t interval, over 5% at 8 seeds), never within 5% at every n from 5 to 10, so
the IQM is given without one; the arm's mean has a calibrated interval beside it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats as sps

from ablate.analysis.stats import LEVEL

MANY_SEEDS = 5  # from this many seeds in every arm: IQM, probability of improvement, performance profile
# Metric names holding one of these are lower-is-better (probability of improvement, profiles); the
# rest higher-is-better. A name rule, not a registry: ablate's losses, times and perplexities.
LOWER_IS_BETTER = ("loss", "perplexity", "runtime", "seconds", "time/", "timing/")
# With ties the exact distribution of U is the permutation one: enumerated when the arms have at most this
# many ways to split their seeds (7 vs 7: 3,432), else drawn this many times with a fixed seed (scipy's
# default; its p-value is then within ±0.0044 (two standard errors) of the exact one at 0.05, in ~0.1 s)
PERMUTATIONS = 9_999

Scores = Sequence[float] | Sequence[Sequence[float]] | np.ndarray


def higher_is_better(metric: str) -> bool:
    """False for losses, times and perplexities (LOWER_IS_BETTER), True otherwise."""
    return not any(part in metric.lower() for part in LOWER_IS_BETTER)


def _matrix(scores: Scores) -> np.ndarray:
    """(runs,) or (runs, tasks) -> float array (runs, tasks)."""
    x = np.asarray(scores, dtype=float)
    return x[:, None] if x.ndim == 1 else x


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
    flat = np.sort(_matrix(scores).ravel())
    k = int(0.25 * flat.size)
    return float(flat[k : flat.size - k].mean())


def probability_of_improvement(x: Scores, y: Scores) -> float:
    """P(X > Y) (Agarwal et al. 2021, sec. 4.3): for each task, the Mann-Whitney U statistic of x
    over y divided by n*m, i.e. the fraction of the n*m run pairs where x's run scores higher, ties
    counting 1/2; averaged over tasks. x is (n, tasks), y is (m, tasks); n and m may differ.

    Hand-computed:
      x = [3, 4, 5, 6, 7], y = [1, 2, 3, 4, 5]: x=3 beats 1, 2 and ties 3 -> 2.5; x=4 -> 3.5;
        x=5 -> 4.5; x=6 -> 5; x=7 -> 5; U = 20.5, P = 20.5 / 25 = 0.82
      identical arms: every pair (i, j) has a mirror (j, i), so P = 0.5 exactly
      x = [[2, 0], [2, 0]], y = [[1, 1], [1, 1]] (2 tasks): task 0 P = 1, task 1 P = 0; mean 0.5
    """
    x, y = _matrix(x), _matrix(y)
    gt = (x[:, None, :] > y[None, :, :]).mean(axis=(0, 1))
    eq = (x[:, None, :] == y[None, :, :]).mean(axis=(0, 1))
    return float((gt + 0.5 * eq).mean())


def mann_whitney_p(x: Scores, y: Scores) -> float | np.ndarray:
    """Two-sided p-value of the Mann-Whitney test of P(X > Y) = 1/2, over the last axis (x (..., n),
    y (..., m): one p-value per row). Without ties, exact (scipy.stats.mannwhitneyu's U distribution);
    a row with ties gets the permutation distribution of its rank sum instead (scipy.stats.permutation_test
    on the midranks, which is U's up to a constant), since the exact U table assumes no ties: enumerated
    up to PERMUTATIONS splits, else that many drawn with a fixed seed. Assumes only that, with no
    difference, every split of the n + m seeds into the two arms is equally likely (independent seeds)."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    p = np.asarray(
        sps.mannwhitneyu(x, y, alternative="two-sided", method="exact", axis=-1).pvalue, dtype=float
    )
    pooled = np.sort(np.concatenate([x, y], axis=-1), axis=-1)
    tied = (np.diff(pooled, axis=-1) == 0).any(axis=-1)
    for row in zip(*np.nonzero(tied)) if p.ndim else ([()] if tied else []):
        ranks = sps.rankdata(np.concatenate([x[row], y[row]]))
        result = sps.permutation_test(
            (ranks[: x.shape[-1]], ranks[x.shape[-1] :]),
            _rank_sum,
            vectorized=True,
            permutation_type="independent",
            alternative="two-sided",
            n_resamples=PERMUTATIONS,
            rng=np.random.default_rng(0),
        )
        p[row] = min(1.0, float(result.pvalue))
    return float(p) if p.ndim == 0 else p


def _rank_sum(x: np.ndarray, y: np.ndarray, axis: int) -> np.ndarray:
    return np.sum(x, axis=axis)


@dataclass
class Improvement:
    """P(arm `b` better than arm `a`) on `metric` over their seeds, with the Mann-Whitney p-value."""

    a: str
    b: str
    metric: str
    n_a: int
    n_b: int
    p: float
    pvalue: float
    launch: str = ""

    @property
    def clear(self) -> bool:
        """The exact Mann-Whitney test rejects P = 0.5 (a coin flip) at p < 1 - LEVEL."""
        return self.pvalue < 1 - LEVEL

    def verdict(self) -> str:
        """`P(b better than a on m) = 0.94, 6 vs 6 seeds, Mann-Whitney p = 0.0087: clear, b better`."""
        text = (
            f"P({self.b} better than {self.a} on {self.metric}) = {self.p:.2f}, {self.n_b} vs {self.n_a} "
            f"seeds, Mann-Whitney p = {self.pvalue:.2g}: "
        )
        if not self.clear:
            return text + f"not clear (p ≥ {1 - LEVEL:.2g})"
        return text + f"clear, {self.b} {'better' if self.p > 0.5 else 'worse'} (p < {1 - LEVEL:.2g})"


def improvement(
    a_label: str, a: Sequence[float], b_label: str, b: Sequence[float], metric: str
) -> Improvement:
    """P(b better than a): P(B > A), or P(B < A) for a lower-is-better metric (scores negated); one
    score per seed in each arm."""
    sign = 1.0 if higher_is_better(metric) else -1.0
    xa, xb = sign * np.asarray(a, dtype=float), sign * np.asarray(b, dtype=float)
    return Improvement(
        a_label,
        b_label,
        metric,
        xa.size,
        xb.size,
        probability_of_improvement(xb, xa),
        float(mann_whitney_p(xb, xa)),
    )


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
