"""Bradley-Terry reward loss against hand-computed values (arithmetic in each docstring).

Three pairs used throughout (sp(x) = log(1 + e^x) = -logsig(-x)):
    r_c = [2, 0, -1], r_r = [0, 0, 0.5]   d = r_c - r_r = [2, 0, -1.5]   (pair 1: zero margin, a tie)
    sp(-2) = 0.1269280, sp(0) = log 2 = 0.6931472, sp(1.5) = 1.7014133, sp(-1.5) = 0.2014133, sp(0.5) = 0.9740770
"""

import math

import torch

from ablate.losses import reward

LOG2 = math.log(2)


def t(*xs: float) -> torch.Tensor:
    return torch.tensor(xs, dtype=torch.float64)


def close(x: torch.Tensor, *expected: float) -> None:
    torch.testing.assert_close(x, t(*expected), rtol=0, atol=1e-6)


def test_bradley_terry():
    """-logsig(d) = sp(-d) = [sp(-2), sp(0), sp(1.5)] = [0.1269280, 0.6931472, 1.7014133]; a tie costs log 2."""
    close(reward.bradley_terry(t(2, 0, -1), t(0, 0, 0.5))[0], 0.1269280, LOG2, 1.7014133)


def test_margin():
    """m = [0.5, 0, -3]: -logsig(d - m) = sp(m - d) = [sp(-1.5), sp(0), sp(-1.5)] = [0.2014133, 0.6931472,
    0.2014133]: the first pair must now win by 0.5, the third is excused by a negative margin."""
    close(reward.bradley_terry(t(2, 0, -1), t(0, 0, 0.5), t(0.5, 0, -3))[0], 0.2014133, LOG2, 0.2014133)


def test_center_rewards():
    """lambda = 0.01: + 0.01 (r_c + r_r)^2 = + 0.01 [4, 0, 0.25] = [0.04, 0, 0.0025]
    -> [0.1669280, 0.6931472, 1.7039133]; the tie at zero mean pays nothing extra."""
    close(
        reward.bradley_terry(t(2, 0, -1), t(0, 0, 0.5), center_rewards_coefficient=0.01)[0],
        0.1669280,
        LOG2,
        1.7039133,
    )


def test_zero_coefficient_is_off():
    """center_rewards_coefficient=0 equals None (the term is multiplied away)."""
    a = reward.bradley_terry(t(2, 0, -1), t(0, 0, 0.5), center_rewards_coefficient=0.0)[0]
    b = reward.bradley_terry(t(2, 0, -1), t(0, 0, 0.5))[0]
    torch.testing.assert_close(a, b)


def test_gradient_pushes_chosen_up():
    """d loss / d r_c = -sig(-d) = -[0.1192029, 0.5, 0.8175745]; d / d r_r is its negative."""
    r_c, r_r = t(2, 0, -1).requires_grad_(), t(0, 0, 0.5).requires_grad_()
    reward.bradley_terry(r_c, r_r)[0].sum().backward()
    close(r_c.grad, -0.1192029, -0.5, -0.8175745)
    close(r_r.grad, 0.1192029, 0.5, 0.8175745)


def test_metrics():
    """accuracy: r_c > r_r = [1, 0, 0] -> 1/3 (a tie is not a win); margin mean(d) = 0.5/3 = 0.1666667;
    over the 6 rewards [2, 0, -1, 0, 0, 0.5]: mean 1.5/6 = 0.25, min -1, max 2."""
    m = reward.reward_metrics(t(2, 0, -1), t(0, 0, 0.5))
    close(
        torch.stack([m["accuracy"], m["margin"], m["mean_reward"], m["min_reward"], m["max_reward"]]),
        1 / 3,
        0.5 / 3,
        0.25,
        -1,
        2,
    )
