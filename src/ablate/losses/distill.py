"""On-policy distillation losses (GKD, Agarwal et al. 2024, arXiv:2306.13649) as pure functions of the
student's and the teacher's logits at the completion tokens the student sampled.

Per token, with p_s = softmax(z_s / T) and p_t = softmax(z_t / T) over the vocabulary (T the temperature),
the generalised Jensen-Shannon divergence of GKD (eq. 2), as TRL 1.16's DistillationTrainer defines it:

    beta = 0:      KL(p_t || p_s) = sum_v p_t (log p_t - log p_s)          forward KL (mode covering)
    beta = 1:      KL(p_s || p_t) = sum_v p_s (log p_s - log p_t)          reverse KL (mode seeking)
    0 < beta < 1:  beta KL(p_t || m) + (1 - beta) KL(p_s || m),  m = (1 - beta) p_s + beta p_t

(beta = 0.5 is the symmetric JSD). The endpoints are taken exactly, as TRL does: the mixture form vanishes
at beta = 0 (m = p_s), so forward KL is not its limit but its derivative's. Gradients flow to the student
only (the teacher's logits are constants). The loss is the sum over the completion tokens divided by
`num_items` (the token count the trainer normalises by: a token mean over its accumulation window).
Metric: `entropy`, the student's mean entropy at T over the same tokens (TRL's).
"""

from __future__ import annotations

import math

import torch

Tensor = torch.Tensor


def generalized_jsd(
    student_logits: Tensor, teacher_logits: Tensor, beta: float, temperature: float = 1.0
) -> Tensor:
    """Per-position divergence (...,) of the student's next-token distribution from the teacher's, over
    the last (vocabulary) axis, in float32."""
    log_ps = torch.log_softmax(student_logits.float() / temperature, dim=-1)
    log_pt = torch.log_softmax(teacher_logits.float() / temperature, dim=-1)
    if beta == 0.0:
        return (log_pt.exp() * (log_pt - log_ps)).sum(-1)
    if beta == 1.0:
        return (log_ps.exp() * (log_ps - log_pt)).sum(-1)
    log_m = torch.logaddexp(log_ps + math.log(1 - beta), log_pt + math.log(beta))
    return (beta * log_pt.exp() * (log_pt - log_m) + (1 - beta) * log_ps.exp() * (log_ps - log_m)).sum(-1)


def distillation(
    student_logits: Tensor,
    teacher_logits: Tensor,
    mask: Tensor,
    *,
    beta: float,
    temperature: float = 1.0,
    num_items: float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """sum over masked positions of `generalized_jsd` / num_items (None: the masked count); student_logits and
    teacher_logits (B, T, V), mask (B, T)."""
    mask = mask.float()
    per_token = generalized_jsd(student_logits, teacher_logits, beta, temperature)
    n = mask.sum() if num_items is None else torch.as_tensor(num_items, dtype=mask.dtype, device=mask.device)
    with torch.no_grad():
        log_ps = torch.log_softmax(student_logits.float() / temperature, dim=-1)
        entropy = -(log_ps.exp() * log_ps).sum(-1)
    metrics = {"entropy": (entropy * mask).sum() / mask.sum().clamp(min=1.0)}
    return (per_token * mask).sum() / n.clamp(min=1.0), metrics
