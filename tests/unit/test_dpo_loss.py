"""DPO losses against hand-computed values."""

import math

import pytest
import torch

from ablate.losses import dpo


def t(*xs: float) -> torch.Tensor:
    return torch.tensor(xs, dtype=torch.float64)


def test_sigmoid_hand_computed():
    """beta = 0.5, three pairs:
    pair 1: logp_c=-1, logp_r=-3, ref_c=-2, ref_r=-2 -> delta = (-1+2) - (-3+2) = 1 - (-1) = 2
            beta*delta = 1 -> loss = -log(sigmoid(1)) = log(1 + e^-1) = 0.3132617
    pair 2: logp_c=-2, logp_r=-2, ref_c=-2, ref_r=-2 -> delta = 0 (zero margin) -> loss = log 2 = 0.6931472
    pair 3: logp_c=-4, logp_r=-1, ref_c=-2, ref_r=-2 -> delta = -2 - 1 = -3
            beta*delta = -1.5 -> loss = log(1 + e^1.5) = 1.7014132
    rewards: chosen = 0.5*(logp_c - ref_c) = [0.5, 0, -1], rejected = 0.5*(logp_r - ref_r) = [-0.5, 0, 0.5]
    margins = [1, 0, -1.5]; accuracies (chosen > rejected, strict) = [1, 0, 0]
    """
    loss, m = dpo.sigmoid(t(-1, -2, -4), t(-3, -2, -1), t(-2, -2, -2), t(-2, -2, -2), beta=0.5)
    assert torch.allclose(loss, t(math.log(1 + math.exp(-1)), math.log(2), math.log(1 + math.exp(1.5))))
    assert torch.allclose(m["rewards/chosen"], t(0.5, 0, -1))
    assert torch.allclose(m["rewards/rejected"], t(-0.5, 0, 0.5))
    assert torch.allclose(m["rewards/margins"], t(1, 0, -1.5))
    assert m["rewards/accuracies"].tolist() == [1.0, 0.0, 0.0]
    assert m["logps/chosen"].tolist() == [-1, -2, -4]
    assert m["logps/rejected"].tolist() == [-3, -2, -1]


def test_hinge_hand_computed():
    """Same pairs, beta = 0.5: beta*delta = [1, 0, -1.5]
    hinge = relu(1 - beta*delta) = [relu(0), relu(1), relu(2.5)] = [0, 1, 2.5]
    pair 1 sits exactly on the margin: zero loss (and zero gradient beyond it).
    """
    loss, m = dpo.hinge(t(-1, -2, -4), t(-3, -2, -1), t(-2, -2, -2), t(-2, -2, -2), beta=0.5)
    assert torch.allclose(loss, t(0, 1, 2.5))
    assert torch.allclose(m["rewards/margins"], t(1, 0, -1.5))


def test_hinge_gradient_vanishes_past_margin():
    """beta=1, delta=2 -> 1 - 2 < 0 -> relu = 0 -> d/dlogp_c = 0; delta=0.5 -> d/dlogp_c = -beta = -1."""
    logp_c = t(0.0, -1.5).requires_grad_()
    loss, _ = dpo.hinge(logp_c, t(-2, -2), t(0, 0), t(0, 0), beta=1.0)
    loss.sum().backward()
    assert logp_c.grad.tolist() == [0.0, -1.0]


def test_sigmoid_gradient_at_zero_margin():
    """d/d(logp_c) of -logsigmoid(beta*delta) = -beta*sigmoid(-beta*delta) = -0.1 * 0.5 = -0.05 at delta=0."""
    logp_c = t(-2.0).requires_grad_()
    loss, _ = dpo.sigmoid(logp_c, t(-2), t(-2), t(-2), beta=0.1)
    loss.sum().backward()
    assert logp_c.grad.item() == pytest.approx(-0.05)


def test_resolve_names_and_dotted_paths():
    assert dpo.resolve("sigmoid") is dpo.sigmoid
    assert dpo.resolve("hinge") is dpo.hinge
    assert dpo.resolve("ablate.losses.dpo.hinge") is dpo.hinge
    assert dpo.available() == ["hinge", "sigmoid"]
    with pytest.raises(ValueError, match="available: hinge, sigmoid"):
        dpo.resolve("ipo")
    with pytest.raises(ValueError, match="reward_metrics"):
        dpo.resolve("reward_metrics")
