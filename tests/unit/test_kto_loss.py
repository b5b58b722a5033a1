"""KTO-family losses against hand-computed values (arithmetic in each docstring).

Four examples used throughout, beta = 0.5 (sig = sigmoid):
    logps = [-1, -3, -5, -2], ref_logps = [-3, -3, -3, -3]   l = logps - ref = [2, 0, -2, 1]
    desirable = [T, T, F, F], KL reference point z0 = 1 (example 3 sits exactly on it: zero margin)
    sig(0.5) = 0.6224593, sig(1) = 0.7310586, sig(1.5) = 0.8175745
"""

import functools

import pytest
import torch

from ablate.losses import kto


def t(*xs: float) -> torch.Tensor:
    return torch.tensor(xs, dtype=torch.float64)


def examples() -> tuple[torch.Tensor, ...]:
    return t(-1, -3, -5, -2), t(-3, -3, -3, -3), torch.tensor([True, True, False, False]), t(1.0)[0]


def close(x: torch.Tensor, *expected: float) -> None:
    torch.testing.assert_close(x, t(*expected), rtol=0, atol=1e-6)


def test_kto():
    """desirable 1 - sig(b (l - z0)): [1 - sig(0.5), 1 - sig(-0.5)] = [0.3775407, 0.6224593];
    undesirable 1 - sig(b (z0 - l)): [1 - sig(1.5), 1 - sig(0)] = [0.1824255, 0.5] (on the reference point)."""
    close(kto.kto(*examples(), beta=0.5)[0], 0.3775407, 0.6224593, 0.1824255, 0.5)


def test_kto_weights():
    """w_D = 2, w_U = 0.5: [0.7550814, 1.2449186, 0.0912128, 0.25]."""
    close(
        kto.kto(*examples(), beta=0.5, desirable_weight=2.0, undesirable_weight=0.5)[0],
        0.7550814,
        1.2449186,
        0.0912128,
        0.25,
    )


def test_kto_without_reference_point():
    """z0 = 0: desirable 1 - sig(b l) = [1 - sig(1), 0.5] = [0.2689414, 0.5]; undesirable 1 - sig(-b l)
    = [1 - sig(1), 1 - sig(-0.5)] = [0.2689414, 0.6224593]."""
    logps, ref, desirable, _ = examples()
    close(kto.kto(logps, ref, desirable, t(0.0)[0], beta=0.5)[0], 0.2689414, 0.5, 0.2689414, 0.6224593)


def test_apo_zero_unpaired():
    """No z0: desirable 1 - sig(b l) = [0.2689414, 0.5], undesirable sig(b l) = [sig(-1), sig(0.5)]
    = [0.2689414, 0.6224593]; the reference point given is not read."""
    close(kto.apo_zero_unpaired(*examples(), beta=0.5)[0], 0.2689414, 0.5, 0.2689414, 0.6224593)
    logps, ref, desirable, _ = examples()
    close(
        kto.apo_zero_unpaired(logps, ref, desirable, None, beta=0.5)[0], 0.2689414, 0.5, 0.2689414, 0.6224593
    )


def test_kl_estimate():
    """mean([0.5, -1.5, 3, 2]) = 1; a negative mean (-1.5) clamps to 0; no gradient flows through it."""
    kl_logps = t(-2.5, -4.5, 0, -1).requires_grad_()
    z0 = kto.kl_estimate(kl_logps, t(-3, -3, -3, -3))
    torch.testing.assert_close(z0, t(1.0)[0])
    assert not z0.requires_grad
    torch.testing.assert_close(kto.kl_estimate(t(-4, -5), t(-3, -3)), t(0.0)[0])


def test_gradient_sign():
    """d/dl of the desirable loss is -b sig'(.) < 0 (raise l), of the undesirable one > 0 (lower l)."""
    logps, ref, desirable, z0 = examples()
    logps = logps.clone().requires_grad_()
    kto.kto(logps, ref, desirable, z0, beta=0.5)[0].sum().backward()
    assert (logps.grad[:2] < 0).all() and (logps.grad[2:] > 0).all()


def test_uses_kl():
    assert kto.uses_kl(kto.kto) and kto.uses_kl(functools.partial(kto.kto))
    assert not kto.uses_kl(functools.partial(kto.apo_zero_unpaired))


@pytest.mark.parametrize(
    "desirable,names",
    [
        (
            [True, True, False, False],
            {"rewards/chosen", "rewards/rejected", "rewards/margins", "logps/chosen", "logps/rejected"},
        ),
        ([True, True, True, True], {"rewards/chosen", "logps/chosen"}),
    ],
)
def test_reward_metrics(desirable, names):
    """rewards b l = [1, 0, -1, 0.5]: chosen mean 0.5, rejected mean -0.25, margin 0.75; logps/chosen
    mean(-1, -3) = -2, logps/rejected mean(-5, -2) = -3.5. A batch of one label logs only its own."""
    logps, ref, _, _ = examples()
    m = kto.reward_metrics(logps, ref, torch.tensor(desirable), beta=0.5)
    assert set(m) == names
    if "rewards/margins" in m:
        close(
            torch.stack(
                [
                    m[k]
                    for k in (
                        "rewards/chosen",
                        "rewards/rejected",
                        "rewards/margins",
                        "logps/chosen",
                        "logps/rejected",
                    )
                ]
            ),
            0.5,
            -0.25,
            0.75,
            -2,
            -3.5,
        )
