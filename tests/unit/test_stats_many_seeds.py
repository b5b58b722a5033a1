"""ablate.analysis.stats, many-seed and per-example statistics, against the hand arithmetic in their
docstrings (and docs/compare.md): IQM, its stratified bootstrap interval, probability of improvement,
performance profiles, paired per-example differences (Miller 2024); edge cases: ties, identical arms,
n=5 exactly, the lower-is-better direction. The vectorised code is checked against plain loops."""

from __future__ import annotations

import itertools
import statistics

import numpy as np
import pytest

from ablate.analysis import stats


def test_iqm_is_the_25_percent_trimmed_mean() -> None:
    assert stats.iqm([1, 2, 3, 4, 5, 6, 7, 8]) == 4.5  # N=8, k=2: mean(3, 4, 5, 6)
    assert stats.iqm([1, 2, 3, 4, 100]) == 3.0  # n=5 exactly, k=1: mean(2, 3, 4); the mean would be 22
    assert stats.iqm([100, 4, 2, 1, 3]) == 3.0  # order does not matter
    assert stats.iqm([1, 1, 1, 2, 2, 2]) == 1.5  # ties, N=6, k=1: mean(1, 1, 2, 2)
    assert stats.iqm([[1, 10], [2, 20], [3, 30], [4, 40]]) == 9.25  # 4 runs x 2 tasks: mean(3, 4, 10, 20)
    assert stats.iqm([0.7] * 5) == pytest.approx(0.7)  # identical runs


def _trim_mean_reference(values: list[float]) -> float:
    """scipy.stats.trim_mean(values, 0.25), written out."""
    k = int(0.25 * len(values))
    kept = sorted(values)[k:len(values) - k]
    return sum(kept) / len(kept)


@pytest.mark.parametrize("n", range(1, 13))
def test_iqm_matches_a_plain_trimmed_mean_for_every_n(n: int) -> None:
    values = np.random.default_rng(n).normal(size=n).round(1).tolist()  # rounded: ties happen
    assert stats.iqm(values) == pytest.approx(_trim_mean_reference(values))


def test_stratified_interval_of_constant_strata_is_a_point() -> None:
    """The iqm_ci docstring: task 0 all 1, task 1 all 3 (5 runs): every stratified resample has five
    of each, IQM = mean(1, 1, 1, 3, 3, 3) = 2; unstratified resampling of the 10 scores would vary."""
    scores = [[1.0, 3.0]] * 5
    assert stats.iqm_ci(scores) == (2.0, 2.0)
    flat = np.array(scores).ravel()
    rng = np.random.default_rng(0)
    unstratified = [stats.iqm(flat[rng.integers(0, 10, 10)]) for _ in range(200)]
    assert min(unstratified) < 2.0 < max(unstratified)  # the strata are what makes it a point


def test_stratified_resamples_draw_each_task_from_its_own_runs() -> None:
    """Plain-loop reference with the same index draws: resample r, run i, task t = scores[idx[r, i, t], t]."""
    scores = np.arange(12, dtype=float).reshape(6, 2) * np.array([1, 100])  # task 1 = 100x task 0
    got = stats.stratified_resamples(scores, 50, np.random.default_rng(3))
    idx = np.random.default_rng(3).integers(0, 6, size=(50, 6, 2))
    for r, i, t in itertools.product(range(50), range(6), range(2)):
        assert got[r, i, t] == scores[idx[r, i, t], t]


def test_iqm_interval_is_reproducible_brackets_the_estimate_and_needs_min_n() -> None:
    values = [0.1, 0.5, 0.2, 0.9, 0.4, 0.3]
    lo, hi = stats.iqm_ci(values)
    assert min(values) <= lo <= stats.iqm(values) <= hi <= max(values)
    assert stats.iqm_ci(values) == (lo, hi)  # fixed seed
    assert stats.iqm_ci([0.4] * 5) == pytest.approx((0.4, 0.4))  # identical runs: a point
    assert stats.iqm_ci([0.1, 0.2]) is None


def test_iqm_interval_matches_the_exact_bootstrap_distribution_at_n5() -> None:
    """n=5: all 5^5 = 3125 equally likely resamples enumerated; the Monte Carlo percentiles (10,000
    resamples, fixed seed) sit within 0.2 of the exact ones (the distribution has steps of 1/3)."""
    values = [1.0, 2.0, 3.0, 4.0, 5.0]
    exact = sorted(stats.iqm([values[i] for i in idx]) for idx in itertools.product(range(5), repeat=5))
    lo, hi = np.quantile(exact, [0.025, 0.975])
    got = stats.iqm_ci(values)
    assert got[0] == pytest.approx(lo, abs=0.2) and got[1] == pytest.approx(hi, abs=0.2)


def test_probability_of_improvement_hand_values() -> None:
    assert stats.probability_of_improvement([3, 4, 5, 6, 7], [1, 2, 3, 4, 5]) == pytest.approx(0.82)  # 20.5 / 25
    assert stats.probability_of_improvement([1, 2, 3, 4, 5], [3, 4, 5, 6, 7]) == pytest.approx(0.18)  # 1 - 0.82
    assert stats.probability_of_improvement([1, 2, 2, 9, 5], [1, 2, 2, 9, 5]) == 0.5  # identical arms (ties)
    assert stats.probability_of_improvement([2] * 5, [1] * 6) == 1.0  # n != m
    assert stats.probability_of_improvement([1] * 5, [1] * 6) == 0.5  # every pair a tie
    assert stats.probability_of_improvement([[2, 0], [2, 0]], [[1, 1], [1, 1]]) == 0.5  # task mean of 1 and 0


def _poi_reference(x: list[float], y: list[float]) -> float:
    """The Mann-Whitney U of x over y (ties 1/2) divided by n*m, as a double loop."""
    u = sum(1.0 if a > b else 0.5 if a == b else 0.0 for a in x for b in y)
    return u / (len(x) * len(y))


@pytest.mark.parametrize("seed", range(5))
def test_probability_of_improvement_matches_a_double_loop(seed: int) -> None:
    rng = np.random.default_rng(seed)
    x, y = rng.integers(0, 4, size=(7, 3)).astype(float), rng.integers(0, 4, size=(5, 3)).astype(float)
    expected = statistics.fmean(_poi_reference(x[:, t].tolist(), y[:, t].tolist()) for t in range(3))
    assert stats.probability_of_improvement(x, y) == pytest.approx(expected)


def test_probability_of_improvement_interval_and_verdict() -> None:
    assert stats.poi_ci([2] * 5, [1] * 5) == (1.0, 1.0)  # every resample: every pair x > y
    assert stats.poi_ci([1] * 5, [1] * 5) == (0.5, 0.5)  # identical constant arms
    assert stats.poi_ci([1, 2], [1, 2, 3]) is None
    lo, hi = stats.poi_ci([3, 4, 5, 6, 7], [1, 2, 3, 4, 5])
    assert 0.0 <= lo <= 0.82 <= hi <= 1.0 and stats.poi_ci([3, 4, 5, 6, 7], [1, 2, 3, 4, 5]) == (lo, hi)

    better = stats.improvement("a", [1] * 5, "b", [2] * 5, "rewards/margins")
    assert (better.p, better.ci, better.clear) == (1.0, (1.0, 1.0), True)
    assert better.verdict() == ("P(b better than a on rewards/margins) = 1.00 [1.00, 1.00], 5 vs 5 seeds: "
                                "clear, b better (95% interval above 0.5)")
    same = stats.improvement("a", [1, 2, 3, 4, 5], "b", [1, 2, 3, 4, 5], "m")
    assert same.p == 0.5 and not same.clear and same.verdict().endswith("not clear (95% interval includes 0.5)")


def test_lower_is_better_metrics_flip_the_direction() -> None:
    assert not stats.higher_is_better("loss") and not stats.higher_is_better("eval_loss")
    assert not stats.higher_is_better("generation_seconds") and not stats.higher_is_better("time/generation")
    assert stats.higher_is_better("rewards/margins") and stats.higher_is_better("reward")
    worse = stats.improvement("a", [1] * 5, "b", [2] * 6, "loss")  # b's loss is higher: b is worse
    assert worse.p == 0.0 and worse.ci == (0.0, 0.0) and worse.clear
    assert worse.verdict().endswith("6 vs 5 seeds: clear, b worse (95% interval below 0.5)")


def test_performance_profile_hand_values() -> None:
    assert stats.performance_profile([1, 2, 3, 4, 5], [0, 2.5, 5]) == pytest.approx([1.0, 0.6, 0.0])
    assert stats.performance_profile([1, 2, 3, 4, 5], [1, 3.5], higher=False) == pytest.approx([0.0, 0.6])
    assert stats.performance_profile([2, 2, 2, 2, 2], [2]) == [0.0]  # ties at tau are not above it
    assert stats.performance_profile([[1, 10], [2, 20]], [5]) == [0.5]  # over runs x tasks
    grid = stats.tau_grid([[1, 5], [3, 9]], points=5)
    assert grid == pytest.approx([1, 3, 5, 7, 9])


def _examples(values: list[float]) -> dict[str, list[float]]:
    return {f"q{i}": [v] for i, v in enumerate(values)}


def test_paired_per_example_difference_hand_values() -> None:
    """The paired_examples docstring's arithmetic (Miller 2024's paired standard error)."""
    d = stats.paired_examples("a", _examples([0.2, 0.4, 0.6, 0.8]), "b", _examples([0.3, 0.6, 0.6, 1.0]), "m")
    assert d.diffs == pytest.approx([0.1, 0.2, 0.0, 0.2]) and d.mean == pytest.approx(0.125)
    assert d.se == pytest.approx((0.0275 / 3) ** 0.5 / 2) == pytest.approx(0.047871, abs=1e-6)
    assert d.ci == pytest.approx((0.125 - 1.96 * 0.0478714, 0.125 + 1.96 * 0.0478714), abs=1e-6)
    assert d.se_unpaired == pytest.approx(((0.2 / 3 + 0.2475 / 3) / 4) ** 0.5) == pytest.approx(0.193111, abs=1e-6)
    assert d.clear and d.verdict() == ("b − a eval m = +0.125 [+0.03117, +0.2188] (SE 0.048 paired, 0.19 unpaired), "
                                       "n=4 examples: clear, b higher (95% interval excludes 0)")


def test_paired_per_example_edge_cases() -> None:
    # seeds: an example's score in an arm is the mean of its runs (0.0 and 1.0 -> 0.5)
    two_seeds = stats.paired_examples("a", {"q": [0.0, 1.0], "r": [1.0]}, "b", {"q": [1.0], "r": [1.0], "s": [0.0]}, "m")
    assert two_seeds.ids == ["q", "r"] and two_seeds.diffs == [0.5, 0.0]  # only shared examples pair
    same = stats.paired_examples("a", _examples([0.0, 1.0, 1.0]), "b", _examples([0.0, 1.0, 1.0]), "m")
    assert same.verdict().endswith("identical on every example") and not same.clear
    shift = stats.paired_examples("a", _examples([0.1, 0.5, 0.9]), "b", _examples([0.0, 0.4, 0.8]), "m")
    assert shift.se == pytest.approx(0.0, abs=1e-12) and shift.clear and "clear, b lower" in shift.verdict()
    mixed = stats.paired_examples("a", _examples([0, 1, 0, 1]), "b", _examples([1, 0, 0, 1]), "m")
    assert mixed.mean == 0.0 and mixed.verdict().endswith("not clear (95% interval includes 0)")
    assert "no example scored in both arms" in stats.paired_examples("a", {"q": [1.0]}, "b", {"r": [1.0]}, "m").verdict()
    assert "n=1 example: too few" in stats.paired_examples("a", {"q": [1.0]}, "b", {"q": [0.0]}, "m").verdict()
