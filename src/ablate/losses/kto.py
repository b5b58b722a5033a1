"""KTO-family losses (Ethayarajh et al. 2024, arXiv:2402.01306) as pure functions of per-example log-probs.

Unpaired data: each example is one completion y for a prompt x, labelled desirable or undesirable. With
the log-ratio `l = log pi(y|x) - log pi_ref(y|x)` (summed over completion tokens) and a reference point
`z0` (below), per example, named as TRL 1.16's KTOTrainer (`loss_type=...`):

- kto                  desirable:   w_D (1 - sig(b (l - z0)))      KTO eq. 7-8 (the value v(x, y) is
                       undesirable: w_U (1 - sig(b (z0 - l)))      sig(...); the loss is lambda_y - v)
- apo_zero_unpaired    desirable:   1 - sig(b l)                   APO-zero, unpaired (D'Oosterlinck et
                       undesirable: sig(b l)                       al. 2024, arXiv:2408.06266, eq. 7); no z0

w_D, w_U are `desirable_weight` / `undesirable_weight` (lambda_D, lambda_U: counter unequal numbers of
desirable and undesirable examples, KTO eq. 8 gives their range); TRL applies them to both loss types.
The batch loss is the mean over its examples (TRL's `nanmean` of the concatenated losses).

The reference point `z0` (`kl_estimate`) estimates KL(pi || pi_ref) from the same batch as in the paper:
the log-ratios of *mismatched* pairs (x_i, y_j), j != i (the trainer builds them by rotating the batch's
completions by one, as TRL does), averaged over the batch, detached (no gradient flows through z0) and
clamped at 0 (a KL is never negative; the sample mean can be). A loss that does not use it says so
(`uses_kl = False`), and the trainer then skips the mismatched forward passes.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

Tensor = torch.Tensor
# (logps, ref_logps, desirable, kl, *, beta, desirable_weight, undesirable_weight) -> (per-example loss,
# metrics)
KTOLoss = Callable[..., tuple[Tensor, dict[str, Tensor]]]


def kl_estimate(kl_logps: Tensor, ref_kl_logps: Tensor) -> Tensor:
    """z0 = max(0, mean_i (log pi(y_j|x_i) - log pi_ref(y_j|x_i))) over the mismatched pairs, detached."""
    return (kl_logps - ref_kl_logps).detach().mean().clamp(min=0)


def _weights(desirable: Tensor, desirable_weight: float, undesirable_weight: float, like: Tensor) -> Tensor:
    return torch.where(
        desirable,
        torch.as_tensor(desirable_weight, dtype=like.dtype, device=like.device),
        torch.as_tensor(undesirable_weight, dtype=like.dtype, device=like.device),
    )


def kto(
    logps: Tensor,
    ref_logps: Tensor,
    desirable: Tensor,
    kl: Tensor,
    *,
    beta: float,
    desirable_weight: float = 1.0,
    undesirable_weight: float = 1.0,
) -> tuple[Tensor, dict[str, Tensor]]:
    """KTO: w (1 - sig(b s (l - z0))), s = +1 for a desirable example, -1 for an undesirable one."""
    sign = desirable.to(logps.dtype) * 2 - 1
    z = beta * sign * ((logps - ref_logps) - kl)
    return _weights(desirable, desirable_weight, undesirable_weight, logps) * (1 - torch.sigmoid(z)), {}


kto.uses_kl = True  # type: ignore[attr-defined]


def apo_zero_unpaired(
    logps: Tensor,
    ref_logps: Tensor,
    desirable: Tensor,
    kl: Tensor | None,
    *,
    beta: float,
    desirable_weight: float = 1.0,
    undesirable_weight: float = 1.0,
) -> tuple[Tensor, dict[str, Tensor]]:
    """APO-zero, unpaired: raise desirable completions' likelihood, lower undesirable ones' (no KL point)."""
    z = torch.sigmoid(beta * (logps - ref_logps))
    loss = torch.where(desirable, 1 - z, z)
    return _weights(desirable, desirable_weight, undesirable_weight, logps) * loss, {}


apo_zero_unpaired.uses_kl = False  # type: ignore[attr-defined]


def uses_kl(loss: KTOLoss) -> bool:
    """Whether `loss` (maybe a functools.partial) reads the KL reference point."""
    while hasattr(loss, "func"):
        loss = loss.func
    return bool(getattr(loss, "uses_kl", True))


@torch.no_grad()
def reward_metrics(logps: Tensor, ref_logps: Tensor, desirable: Tensor, beta: float) -> dict[str, Tensor]:
    """TRL's KTO metrics of one batch, each only when the batch has examples of that label: the implicit
    rewards b l and the log-probs, averaged over the desirable (`chosen`) and undesirable (`rejected`)
    examples, and `rewards/margins` when it has both."""
    rewards = beta * (logps - ref_logps)
    out: dict[str, Tensor] = {}
    for name, rows in (("chosen", desirable), ("rejected", ~desirable)):
        if rows.any():
            out[f"rewards/{name}"], out[f"logps/{name}"] = rewards[rows].mean(), logps[rows].mean()
    if desirable.any() and (~desirable).any():
        out["rewards/margins"] = out["rewards/chosen"] - out["rewards/rejected"]
    return out
