"""ablate.analysis.many_seeds and per_example against the hand arithmetic in their docstrings (and
docs/compare.md): IQM, probability of improvement and its Mann-Whitney p-value, performance profiles,
paired per-example differences (Miller 2024); edge cases: ties, identical arms, n=5 exactly, the
lower-is-better direction. The vectorised code and scipy's test are checked against plain loops."""

from __future__ import annotations

import itertools
import statistics

import numpy as np
import pytest

from ablate.analysis import many_seeds as stats
from ablate.analysis import per_example


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
    kept = sorted(values)[k : len(values) - k]
    return sum(kept) / len(kept)


@pytest.mark.parametrize("n", range(1, 13))
def test_iqm_matches_a_plain_trimmed_mean_for_every_n(n: int) -> None:
    values = np.random.default_rng(n).normal(size=n).round(1).tolist()  # rounded: ties happen
    assert stats.iqm(values) == pytest.approx(_trim_mean_reference(values))


def test_probability_of_improvement_hand_values() -> None:
    assert stats.probability_of_improvement([3, 4, 5, 6, 7], [1, 2, 3, 4, 5]) == pytest.approx(
        0.82
    )  # 20.5 / 25
    assert stats.probability_of_improvement([1, 2, 3, 4, 5], [3, 4, 5, 6, 7]) == pytest.approx(
        0.18
    )  # 1 - 0.82
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


def _mann_whitney_reference(x: list[float], y: list[float]) -> float:
    """Two-sided permutation p-value of U, every split of the pooled values enumerated: the share of
    splits whose U is at least as far from n·m/2 as the observed one."""
    pooled, n = x + y, len(x)
    observed = abs(_poi_reference(x, y) - 0.5)
    far = total = 0
    for chosen in itertools.combinations(range(len(pooled)), n):
        xs = [pooled[i] for i in chosen]
        ys = [pooled[i] for i in range(len(pooled)) if i not in chosen]
        far += abs(_poi_reference(xs, ys) - 0.5) >= observed - 1e-12
        total += 1
    return far / total


@pytest.mark.parametrize(
    "x,y",
    [
        ([0.5, 0.6, 0.7, 0.8, 0.9, 1.0], [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]),  # ties
        ([1.0, 2.0, 2.0, 3.0, 3.0], [2.0, 3.0, 3.0, 4.0, 1.0]),  # many ties
        ([0.31, 0.72, 0.15, 0.94, 0.56], [0.12, 0.08, 0.44, 0.27, 0.63]),
    ],
)  # none: scipy's table
def test_mann_whitney_p_is_the_exact_permutation_p_value(x: list[float], y: list[float]) -> None:
    assert stats.mann_whitney_p(x, y) == pytest.approx(_mann_whitney_reference(x, y), abs=1e-9)


def test_probability_of_improvement_verdict() -> None:
    """5 vs 5 seeds, all of b above all of a: U = 25, p = 2 / C(10, 5) = 2 / 252 = 0.0079 (the smallest
    two-sided p-value at 5 vs 5: 5 seeds per arm can be clear)."""
    better = stats.improvement("a", [1, 2, 3, 4, 5], "b", [6, 7, 8, 9, 10], "rewards/margins")
    assert (better.p, better.clear) == (1.0, True) and better.pvalue == pytest.approx(2 / 252)
    assert better.verdict() == (
        "P(b better than a on rewards/margins) = 1.00, 5 vs 5 seeds, Mann-Whitney p = 0.0079: "
        "clear, b better (p < 0.05)"
    )
    same = stats.improvement("a", [1, 2, 3, 4, 5], "b", [1, 2, 3, 4, 5], "m")
    assert same.p == 0.5 and same.pvalue == 1.0 and not same.clear
    assert same.verdict().endswith("Mann-Whitney p = 1: not clear (p ≥ 0.05)")
    constant = stats.improvement("a", [1] * 5, "b", [1] * 5, "m")  # every value tied: no evidence either way
    assert constant.p == 0.5 and constant.pvalue == 1.0


def test_lower_is_better_metrics_flip_the_direction() -> None:
    assert not stats.higher_is_better("loss") and not stats.higher_is_better("eval_loss")
    assert not stats.higher_is_better("generation_seconds") and not stats.higher_is_better("time/generation")
    assert stats.higher_is_better("rewards/margins") and stats.higher_is_better("reward")
    worse = stats.improvement(
        "a", [1, 2, 3, 4, 5], "b", [6, 7, 8, 9, 10, 11], "loss"
    )  # b's loss is higher: b is worse
    assert worse.p == 0.0 and worse.clear  # p = 2 / C(11, 5) = 2 / 462
    assert worse.verdict() == (
        "P(b better than a on loss) = 0.00, 6 vs 5 seeds, Mann-Whitney p = 0.0043: clear, b worse (p < 0.05)"
    )


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
    d = per_example.paired_examples(
        "a", _examples([0.2, 0.4, 0.6, 0.8]), "b", _examples([0.3, 0.6, 0.6, 1.0]), "m"
    )
    assert d.diffs == pytest.approx([0.1, 0.2, 0.0, 0.2]) and d.mean == pytest.approx(0.125)
    assert d.se == pytest.approx((0.0275 / 3) ** 0.5 / 2) == pytest.approx(0.047871, abs=1e-6)
    assert d.ci == pytest.approx((0.125 - 3.182446 * 0.0478714, 0.125 + 3.182446 * 0.0478714), abs=1e-6)
    assert (
        d.se_unpaired
        == pytest.approx(((0.2 / 3 + 0.2475 / 3) / 4) ** 0.5)
        == pytest.approx(0.193111, abs=1e-6)
    )
    assert not d.clear and d.verdict() == (
        "b − a eval m = +0.125 [-0.02735, +0.2773] (SE 0.048 paired, 0.19 unpaired), "
        "n=4 examples: not clear (95% interval includes 0)"
    )
    # the same differences over 16 examples (each four times): t_{0.975, 15} = 2.13145, SE 0.0236 -> clear
    many = per_example.paired_examples(
        "a", _examples([0.2, 0.4, 0.6, 0.8] * 4), "b", _examples([0.3, 0.6, 0.6, 1.0] * 4), "m"
    )
    se = (0.0275 * 4 / 15) ** 0.5 / 4
    assert many.ci == pytest.approx((0.125 - 2.131450 * se, 0.125 + 2.131450 * se), abs=1e-6) and many.clear


def test_paired_per_example_edge_cases() -> None:
    # seeds: an example's score in an arm is the mean of its runs (0.0 and 1.0 -> 0.5)
    two_seeds = per_example.paired_examples(
        "a", {"q": [0.0, 1.0], "r": [1.0]}, "b", {"q": [1.0], "r": [1.0], "s": [0.0]}, "m"
    )
    assert two_seeds.ids == ["q", "r"] and two_seeds.diffs == [0.5, 0.0]  # only shared examples pair
    same = per_example.paired_examples("a", _examples([0.0, 1.0, 1.0]), "b", _examples([0.0, 1.0, 1.0]), "m")
    assert same.verdict().endswith("identical on every example") and not same.clear
    shift = per_example.paired_examples("a", _examples([0.1, 0.5, 0.9]), "b", _examples([0.0, 0.4, 0.8]), "m")
    assert shift.se == pytest.approx(0.0, abs=1e-12) and shift.clear and "clear, b lower" in shift.verdict()
    mixed = per_example.paired_examples("a", _examples([0, 1, 0, 1]), "b", _examples([1, 0, 0, 1]), "m")
    assert mixed.mean == 0.0 and mixed.verdict().endswith("not clear (95% interval includes 0)")
    assert (
        "no example scored in both arms"
        in per_example.paired_examples("a", {"q": [1.0]}, "b", {"r": [1.0]}, "m").verdict()
    )
    assert (
        "n=1 example: too few"
        in per_example.paired_examples("a", {"q": [1.0]}, "b", {"q": [0.0]}, "m").verdict()
    )
