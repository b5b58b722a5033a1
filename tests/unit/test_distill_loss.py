"""The generalised JSD of on-policy distillation against hand-computed values (arithmetic in each docstring).

A two-token vocabulary: student logits [0, 0] -> p_s = [0.5, 0.5]; teacher logits [ln 3, 0] -> p_t = [0.75, 0.25].
    KL(p_t || p_s) = 0.75 ln 1.5 + 0.25 ln 0.5 = 0.3040988 - 0.1732868 = 0.1308120   (forward, beta = 0)
    KL(p_s || p_t) = 0.5 ln (2/3) + 0.5 ln 2   = -0.2027326 + 0.3465736 = 0.1438410  (reverse, beta = 1)
"""

import math

import pytest
import torch

from ablate.losses import distill

S, T = [0.0, 0.0], [math.log(3), 0.0]


def t(*rows: list[float]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


def close(x: torch.Tensor, *expected: float) -> None:
    torch.testing.assert_close(
        x.double().reshape(-1), torch.tensor(expected, dtype=torch.float64), rtol=0, atol=1e-6
    )


@pytest.mark.parametrize("beta,expected", [(0.0, 0.1308120), (1.0, 0.1438410)])
def test_kl_endpoints(beta, expected):
    close(distill.generalized_jsd(t(S), t(T), beta), expected)


def test_jsd():
    """beta = 0.5: m = [0.625, 0.375]; KL(p_t || m) = 0.75 ln 1.2 + 0.25 ln (2/3) = 0.0353749,
    KL(p_s || m) = 0.5 ln 0.8 + 0.5 ln (4/3) = 0.0322693; 0.5 (0.0353749 + 0.0322693) = 0.0338221."""
    close(distill.generalized_jsd(t(S), t(T), 0.5), 0.0338221)


def test_mixture_weight():
    """beta = 0.25: m = 0.75 p_s + 0.25 p_t = [0.5625, 0.4375]; 0.25 KL(p_t || m) + 0.75 KL(p_s || m) = 0.0248700.
    The mixture weights p_t by beta (TRL's): the divergence moves from the student's side to the teacher's."""
    close(distill.generalized_jsd(t(S), t(T), 0.25), 0.0248700)


def test_temperature():
    """T = 2: teacher logits [ln 3 / 2, 0] -> p_t = [sqrt3 / (sqrt3 + 1), 1 / (sqrt3 + 1)] = [0.6339746, 0.3660254];
    KL(p_t || uniform) = 0.6339746 ln 1.2679492 + 0.3660254 ln 0.7320508 = 0.0363408 (softer: less to learn)."""
    close(distill.generalized_jsd(t(S), t(T), 0.0, temperature=2.0), 0.0363408)


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_same_distribution_is_zero(beta):
    """A student that is the teacher (logits shifted by a constant: the same softmax) costs nothing."""
    close(distill.generalized_jsd(t(T), t([math.log(3) + 5, 5.0]), beta), 0.0)


def test_masked_token_mean_and_entropy():
    """Two sequences of two positions; positions (0, 1) and (1, 1) masked (padding). Loss = sum over the two
    scored positions / 2: the first is the forward-KL example (0.1308120), the second identical
    distributions (0): 0.0654060. num_items = 4 (a window's count) halves it: 0.0327030.
    entropy: the student's mean over scored positions: [ln 2 = 0.6931472, H(0.75, 0.25) = 0.5623351] -> 0.6277411."""
    student = t([S, S], [T, S]).view(2, 2, 2)
    teacher = t([T, T], [T, T]).view(2, 2, 2)
    mask = torch.tensor([[1, 0], [1, 0]])
    loss, m = distill.distillation(student, teacher, mask, beta=0.0)
    close(loss, 0.0654060)
    close(m["entropy"], 0.6277411)
    close(distill.distillation(student, teacher, mask, beta=0.0, num_items=4)[0], 0.0327030)


def test_student_gradient_moves_towards_the_teacher():
    """Reverse KL at p_s = uniform: dKL/dz_v = p_s,v (log p_s,v - log p_t,v - KL) = 0.5 (ln(2/3) - 0.1438410)
    = -0.2746531 for the teacher's likely token, +0.2746531 for the other (a softmax gradient sums to 0)."""
    student = t(S).requires_grad_()
    loss, _ = distill.distillation(student.view(1, 1, 2), t(T).view(1, 1, 2), torch.ones(1, 1), beta=1.0)
    loss.backward()
    close(student.grad, -0.2746531, 0.2746531)
