"""The engine/trainer mismatch corrections (ablate.losses.is_correction) against hand-computed numbers."""

from __future__ import annotations

import math

import pytest
import torch

from ablate.losses import grpo, is_correction

NAN = float("nan")
E = math.e


def _batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """3 completions of up to 3 tokens; trainer log-probs = engine log-probs + d, with d:
    row 0: (0.5, 0.6 | 9.0 on padding)   mask (1, 1, 0): sum 1.1 -> e^1.1 = 3.004166
    row 1: (0.5, 0.5, 0.0)               mask (1, 1, 1): sum 1.0 -> e     = 2.718282
    row 2: (-1.0, NaN, -0.5)             mask (1, 1, 1): NaN (the engine gave no log-prob) counts 0,
                                                          sum -1.5 -> e^-1.5 = 0.223130
    """
    d = torch.tensor([[0.5, 0.6, 9.0], [0.5, 0.5, 0.0], [-1.0, 0.0, -0.5]])
    sampling = torch.full((3, 3), -1.0)
    sampling[2, 1] = NAN
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [1.0, 1.0, 1.0]])
    return sampling + torch.nan_to_num(d), sampling, mask


def _metric(m: dict, name: str) -> float:
    return m[f"sampling/importance_sampling_ratio/{name}"].item()


def test_sequence_mask_is_trls_default():
    """sequence_mask, clip_max 3: row 0's 3.004 > 3 -> 0; rows 1, 2 kept: (0, e, e^-1.5), shape (3, 1).
    Over completions: min 0, max e = 2.718282, mean (0 + 2.718282 + 0.223130) / 3 = 0.980471, masked 1/3.
    |logps - sampling| over completion tokens, NaN left out: 0.5 0.6 | 0.5 0.5 0 | 1.0 0.5 -> 7 values,
    sum 3.6, mean 0.514286, max 1.0 (the padding's 9.0 is not a completion token)."""
    logps, sampling, mask = _batch()
    w, m = is_correction.importance_sampling_correction(logps, sampling, mask)  # TRL's defaults
    torch.testing.assert_close(w, torch.tensor([[0.0], [E], [E**-1.5]]))
    assert (_metric(m, "min"), _metric(m, "max")) == pytest.approx((0.0, E))
    assert _metric(m, "mean") == pytest.approx((E + E**-1.5) / 3)
    assert _metric(m, "masked_fraction") == pytest.approx(1 / 3)
    assert m["sampling/sampling_logp_difference/mean"].item() == pytest.approx(3.6 / 7)
    assert m["sampling/sampling_logp_difference/max"].item() == pytest.approx(1.0)


def test_sequence_truncate_clamps_both_bounds():
    """sequence_truncate, clip_min 0.5, clip_max 3: (min(3.004, 3), e, max(0.223, 0.5)) = (3, e, 0.5);
    mean (3 + 2.718282 + 0.5) / 3 = 2.072761; 2 of 3 were outside the bounds."""
    logps, sampling, mask = _batch()
    w, m = is_correction.importance_sampling_correction(
        logps, sampling, mask, mode="sequence_truncate", clip_min=0.5, clip_max=3.0
    )
    torch.testing.assert_close(w, torch.tensor([[3.0], [E], [0.5]]))
    assert _metric(m, "mean") == pytest.approx((3 + E + 0.5) / 3)
    assert _metric(m, "masked_fraction") == pytest.approx(2 / 3)


def test_token_modes():
    """Per token: e^d on completion tokens, 1 on padding (d * mask = 0) and where the engine gave NaN:
    row 0 (e^.5, e^.6, 1), row 1 (e^.5, e^.5, 1), row 2 (e^-1, 1, e^-.5).
    token_mask, clip_min 0.5: e^-1 = 0.367879 < 0.5 -> 0. Over the 8 completion tokens: min 0,
    max e^.6 = 1.822119, mean (3 e^.5 + e^.6 + 1 + 0 + 1 + e^-.5) / 8 = 9.374818 / 8 = 1.171852, masked 1/8.
    token_truncate, clip_max 1.7: e^.6 -> 1.7, the rest unchanged; 1 of 8 outside."""
    logps, sampling, mask = _batch()
    h = math.exp(0.5)
    w, m = is_correction.importance_sampling_correction(
        logps, sampling, mask, mode="token_mask", clip_min=0.5
    )
    torch.testing.assert_close(w, torch.tensor([[h, E**0.6, 1.0], [h, h, 1.0], [0.0, 1.0, E**-0.5]]))
    assert (_metric(m, "min"), _metric(m, "max")) == pytest.approx((0.0, E**0.6))
    assert _metric(m, "mean") == pytest.approx((3 * h + E**0.6 + 2 + E**-0.5) / 8)
    assert _metric(m, "masked_fraction") == pytest.approx(1 / 8)
    w, m = is_correction.importance_sampling_correction(
        logps, sampling, mask, mode="token_truncate", clip_max=1.7
    )
    torch.testing.assert_close(w, torch.tensor([[h, 1.7, 1.0], [h, h, 1.0], [E**-1, 1.0, E**-0.5]]))
    assert _metric(m, "masked_fraction") == pytest.approx(1 / 8)


def test_no_completion_tokens_and_equal_numbers():
    """No completion token: the token-mode metrics are 0 (TRL's empty case); sequence modes give each
    completion exp(0) = 1. Engine and trainer equal: every ratio is 1, nothing is masked."""
    logps, sampling, _ = _batch()
    zero = torch.zeros(3, 3)
    w, m = is_correction.importance_sampling_correction(logps, sampling, zero, mode="token_mask")
    assert all(v.item() == 0.0 for v in m.values())
    w, m = is_correction.importance_sampling_correction(logps, sampling, zero)
    torch.testing.assert_close(w, torch.ones(3, 1))
    same = torch.full((3, 3), -2.0)
    for mode in is_correction.MODES:
        w, m = is_correction.importance_sampling_correction(same, same, torch.ones(3, 3), mode=mode)
        assert torch.equal(w, torch.ones_like(w)) and _metric(m, "masked_fraction") == 0.0, mode
    with pytest.raises(KeyError):  # not a mode: the config's schema refuses it (tests/unit/test_schema.py)
        is_correction.importance_sampling_correction(same, same, torch.ones(3, 3), mode="sequence")


def test_off_policy_mask():
    """threshold 0.5; sampling - current log-probs per token, mean over completion tokens:
    row 0: (0.4, 0.8) -> 0.6 > 0.5 and A = -1 < 0 -> dropped
    row 1: (0.4, 0.8) -> 0.6 but A = +1          -> kept
    row 2: (0.4, 0.4) -> 0.4 <= 0.5, A = -1      -> kept
    row 3: (0.4, 9.0 on padding) -> 0.4, A = -1  -> kept (padding is no evidence)
    row 4: (0.4, NaN) -> (0.4 + 0) / 2 = 0.2     -> kept (an unscored token is no evidence)
    row 5: no completion token -> 0              -> kept"""
    cur = torch.zeros(6, 2, requires_grad=True)
    gap = torch.tensor([[0.4, 0.8], [0.4, 0.8], [0.4, 0.4], [0.4, 9.0], [0.4, NAN], [0.4, 0.4]])
    mask = torch.tensor([[1.0, 1.0]] * 3 + [[1.0, 0.0], [1.0, 1.0], [0.0, 0.0]])
    adv = torch.tensor([[-1.0], [1.0], [-1.0], [-1.0], [-1.0], [-1.0]])
    keep = is_correction.off_policy_mask(adv, cur, cur.detach() + gap, mask, 0.5)
    assert keep.tolist() == [[0.0], [1.0], [1.0], [1.0], [1.0], [1.0]]
    assert not keep.requires_grad


def test_policy_weight_multiplies_the_policy_term_not_the_kl():
    """On-policy (ratio 1), A = 2, weight 0.5, beta 0.1, ref = logps - 1:
    policy term -A * 1 * 0.5 = -1; k3 KL e^-1 - (-1) - 1 = e^-1 = 0.367879, times the ratio 1 (bias
    correction), added unweighted: -1 + 0.1 * 0.367879 = -0.963212 per token (weighted KL would be -0.981606)."""
    logps = torch.full((1, 2), -1.0)
    inputs = grpo.LossInputs(
        logps, logps, torch.tensor([2.0]), torch.ones(1, 2), logps - 1, policy_weight=torch.full((1, 1), 0.5)
    )
    loss, _ = grpo.clip(
        inputs,
        epsilon=0.2,
        epsilon_high=0.2,
        beta=0.1,
        bias_correction_kl=True,
        importance_sampling_level="token",
        delta=None,
    )
    torch.testing.assert_close(loss, torch.full((1, 2), -1 + 0.1 * E**-1))
    unweighted, _ = grpo.clip(
        grpo.LossInputs(logps, logps, torch.tensor([2.0]), torch.ones(1, 2), logps - 1),
        epsilon=0.2,
        epsilon_high=0.2,
        beta=0.1,
        importance_sampling_level="token",
        delta=None,
        bias_correction_kl=False,
    )
    torch.testing.assert_close(unweighted, torch.full((1, 2), -2 + 0.1 * E**-1))
