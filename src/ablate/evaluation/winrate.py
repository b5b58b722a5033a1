"""A judged pairwise comparison's numbers from per-completion scores: the win rate (ties count half), the
mean score difference, and the length-controlled win rate of AlpacaEval 2 (Dubois, Galambosi, Liang &
Hashimoto 2024, "Length-Controlled AlpacaEval: A Simple Way to Debias Automatic Evaluators").

Length control, as AlpacaEval 2 does it for one pair of models: a logistic regression of the win on the
length difference, P(win_i) = σ(θ + φ · tanh(Δℓ_i / sd(Δℓ))), Δℓ_i = policy length − baseline length in
tokens, fitted by maximum likelihood (ties are y = ½: a fractional target), then read at equal length,
LC = σ(θ). A judge that prefers longer answers gives the longer model a win rate above its LC win rate.
Departures: AlpacaEval 2 also fits an instruction-difficulty term shared across many models; with one pair
of models and one baseline there is nothing to share it with, so it is left out. The tanh bounds the
length term as AlpacaEval's does. A tiny ridge (RIDGE) keeps the fit finite when every answer wins.
"""

from __future__ import annotations

import math

import numpy as np

RIDGE = 1e-4  # L2 penalty on (θ, φ): finite estimates under perfect separation, nothing otherwise


def wins(policy: list[float], baseline: list[float]) -> list[float]:
    """1 where the policy's score is higher, 0 where lower, ½ on a tie."""
    return [1.0 if p > b else 0.0 if p < b else 0.5 for p, b in zip(policy, baseline)]


def length_controlled(win: list[float], length_diff: list[float], steps: int = 50) -> float:
    """σ(θ) of the logistic regression win ~ θ + φ · tanh(Δℓ / sd(Δℓ)), by Newton's method.

    Hand-checked: every length equal (Δℓ = 0): the length term is 0 and σ(θ) is the win rate, wins
    [1, 0, 1, 1] -> 0.75 (the ridge moves it by < 1e-4). Wins exactly where the policy was longer (wins
    [1, 1, 0, 0], Δℓ [5, 5, -5, -5]): by symmetry θ = 0, LC = 0.5, while a length-blind reading would
    credit the policy for being long."""
    y = np.asarray(win, dtype=float)
    d = np.asarray(length_diff, dtype=float)
    sd = d.std(ddof=1) if d.size > 1 else 0.0
    x = np.tanh(d / sd) if sd > 0 else np.zeros_like(d)
    design = np.stack([np.ones_like(x), x], axis=1)
    w = np.zeros(2)
    for _ in range(steps):
        p = 1 / (1 + np.exp(-(design @ w)))
        grad = design.T @ (y - p) - RIDGE * w
        hess = design.T @ (design * (p * (1 - p))[:, None]) + RIDGE * np.eye(2)
        step = np.linalg.solve(hess, grad)
        w = w + step
        if np.abs(step).max() < 1e-10:
            break
    return 1 / (1 + math.exp(-w[0]))


def summary(
    policy: list[float], baseline: list[float], policy_len: list[int], baseline_len: list[int]
) -> dict[str, float]:
    """judge/win_rate, judge/lc_win_rate, judge/score_diff (mean policy − baseline), the mean scores and
    lengths, over completions paired by prompt and sample."""
    won = wins(policy, baseline)
    diff = [p - b for p, b in zip(policy, baseline)]
    return {
        "judge/win_rate": float(np.mean(won)),
        "judge/lc_win_rate": length_controlled(won, [a - b for a, b in zip(policy_len, baseline_len)]),
        "judge/score_diff": float(np.mean(diff)),
        "judge/score": float(np.mean(policy)),
        "judge/baseline_score": float(np.mean(baseline)),
        "judge/length": float(np.mean(policy_len)),
        "judge/baseline_length": float(np.mean(baseline_len)),
    }
