"""RLOO's pieces against hand-computed values (arithmetic in each docstring).

One group of G = 4 completions, one reward function (weight 1): r = [1, 0, 0.5, 0.5], mean 0.5.
The leave-one-out baseline of i is the mean of the other three, so A_i = r_i - (sum - r_i)/3
= 4/3 (r_i - mean): [1 - 1/3, 0 - 2/3, 0.5 - 0.5, 0.5 - 0.5] = [0.6666667, -0.6666667, 0, 0]
(completions 2 and 3 sit exactly on their baseline: zero advantage). Advantages of a group sum to 0.
"""

import functools

import pytest
import torch

from ablate.losses import rloo
from ablate.losses.grpo import LossInputs


def t(*xs: float) -> torch.Tensor:
    return torch.tensor(xs, dtype=torch.float64)


def close(x: torch.Tensor, *expected: float) -> None:
    torch.testing.assert_close(x.double().reshape(-1), t(*expected), rtol=0, atol=1e-6)


def group() -> tuple[torch.Tensor, torch.Tensor]:
    return t(1, 0, 0.5, 0.5).unsqueeze(1), t(1.0)


def test_leave_one_out():
    adv, m = rloo.leave_one_out(*group(), 4, beta=0.0, normalize_advantages=False, reward_clip_range=None)
    close(adv, 2 / 3, -2 / 3, 0, 0)
    assert abs(adv.sum()) < 1e-12
    close(torch.stack([m["reward"], m["reward_std"], m["frac_reward_zero_std"]]), 0.5, 0.4082483, 0)
    assert "kl" not in m


def test_kl_penalty():
    """beta = 0.5, token_kl = [[0.2, 0.2], [0, 0], [-0.1, 9 (masked)], [0.3, 0]]: per completion [0.4, 0, -0.1, 0.3];
    r' = r - 0.5 kl = [0.8, 0, 0.55, 0.35], mean 0.425; A = 4/3 (r' - 0.425) = [0.5, -0.5666667, 0.1666667, -0.1].
    kl metric: the token mean (0.2 + 0.2 + 0 + 0 - 0.1 + 0.3 + 0) / 7 = 0.0857143. The logged reward is the
    unpenalised one (0.5)."""
    kl = t(0.2, 0.2, 0, 0, -0.1, 9, 0.3, 0).view(4, 2)
    mask = torch.tensor([[1, 1], [1, 1], [1, 0], [1, 1]])
    adv, m = rloo.leave_one_out(
        *group(), 4, token_kl=kl, mask=mask, beta=0.5, normalize_advantages=False, reward_clip_range=None
    )
    close(adv, 0.5, -0.5666667, 0.1666667, -0.1)
    close(torch.stack([m["kl"], m["reward"]]), 0.0857143, 0.5)
    adv0, m0 = rloo.leave_one_out(
        *group(), 4, token_kl=kl, mask=mask, beta=0.0, normalize_advantages=False, reward_clip_range=None
    )  # beta 0: no penalty, no metric
    close(adv0, 2 / 3, -2 / 3, 0, 0)
    assert "kl" not in m0


def test_reward_clip_range():
    """[0, 0.6]: r = [0.6, 0, 0.5, 0.5], mean 0.4; A = 4/3 (r - 0.4) = [0.2666667, -0.5333333, 0.1333333, 0.1333333]."""
    close(
        rloo.leave_one_out(*group(), 4, reward_clip_range=(0.0, 0.6), beta=0.0, normalize_advantages=False)[
            0
        ],
        0.2666667,
        -0.5333333,
        0.1333333,
        0.1333333,
    )


def test_normalize_advantages():
    """A = [2/3, -2/3, 0, 0]: mean 0, unbiased std sqrt((4/9 + 4/9) / 3) = 0.5443311;
    A / (0.5443311 + 1e-4) = [1.2245199, -1.2245199, 0, 0]."""
    close(
        rloo.leave_one_out(*group(), 4, normalize_advantages=True, beta=0.0, reward_clip_range=None)[0],
        1.2245199,
        -1.2245199,
        0,
        0,
    )


def test_unscorable_completions():
    """r = [1, NaN, 0, 0.5]: the NaN row leaves its siblings' baselines (mean of the other two scorable) and
    gets A = 0: [1 - 0.25, 0, 0 - 0.75, 0.5 - 0.5] = [0.75, 0, -0.75, 0]. A group with one scorable completion
    has no baseline: A = 0 for all. frac_reward_zero_std: the equal-reward group [2, 2, 2, 2] counts."""
    rewards = t(1, torch.nan, 0, 0.5, torch.nan, torch.nan, 3, torch.nan, 2, 2, 2, 2).unsqueeze(1)
    adv, m = rloo.leave_one_out(
        rewards, t(1.0), 4, beta=0.0, normalize_advantages=False, reward_clip_range=None
    )
    close(adv, 0.75, 0, -0.75, 0, 0, 0, 0, 0, 0, 0, 0, 0)
    close(m["frac_reward_zero_std"], 1 / 3)


def test_sequence_clip():
    """log-ratios [[0.1, 0.2], [-0.5, 0.3 (masked)]] sum to [0.3, -0.5]: rho = [e^0.3, e^-0.5] = [1.3498588,
    0.6065307]; A = [1, -1], eps 0.2: -min(rho A, clip(rho) A) = [-min(1.35, 1.2), -min(-0.61, -0.8)] = [-1.2, 0.8]:
    both clipped (high with A > 0, low with A < 0). One loss per completion, (2, 1); the mean over them -0.2."""
    logps = t(-1.0, -2.0, -3.0, -1.0).view(2, 2).requires_grad_()
    old = logps.detach() - t(0.1, 0.2, -0.5, 0.3).view(2, 2)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]], dtype=torch.float64)
    loss, m = rloo.sequence_clip(
        LossInputs(logps, old, t(1, -1), mask),
        epsilon=0.2,
        epsilon_high=0.2,
        beta=1.0,
        importance_sampling_level="token",
        delta=None,
        bias_correction_kl=False,
    )
    assert loss.shape == (2, 1)
    close(loss.squeeze(1), -1.2, 0.8)
    close(
        torch.stack([m["clip_ratio/low_mean"], m["clip_ratio/high_mean"], m["clip_ratio/region_mean"]]),
        0.5,
        0.5,
        1,
    )
    close(rloo.sequences(loss, mask, num_items=3.0, max_completion_length=2), -0.2)


def test_sequence_clip_gradient_sums_tokens():
    """Unclipped (rho = 1, A = 2): loss = -rho A, d/d logp_t = -A rho = -2 on every unmasked token of the
    completion (a sum over tokens, not a mean), 0 on the masked one."""
    logps = t(-1.0, -2.0, -3.0).view(1, 3).requires_grad_()
    mask = torch.tensor([[1.0, 1.0, 0.0]], dtype=torch.float64)
    loss, _ = rloo.sequence_clip(
        LossInputs(logps, logps.detach(), t(2.0), mask),
        epsilon=0.2,
        epsilon_high=0.2,
        beta=0.0,
        importance_sampling_level="token",
        delta=None,
        bias_correction_kl=False,
    )
    loss.sum().backward()
    close(logps.grad.squeeze(0), -2, -2, 0)


def test_sequences_refuses_per_token_losses():
    with pytest.raises(ValueError, match="one loss per completion"):
        rloo.sequences(torch.zeros(2, 3), torch.ones(2, 3), num_items=6.0, max_completion_length=3)


def test_config_settings_reach_the_estimator():
    """conf/method/rloo.yaml hands the estimator RLOO's settings as its partial's keywords."""
    fn = functools.partial(rloo.leave_one_out, beta=0.0, normalize_advantages=True, reward_clip_range=None)
    close(fn(*group(), 4)[0], 1.2245199, -1.2245199, 0, 0)
