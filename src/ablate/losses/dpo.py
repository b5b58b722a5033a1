"""DPO-family losses as pure functions of per-sequence log-probs and token counts.

Every loss has the same inputs, per pair (shape (B,)): the summed completion log-probs of the policy
(`logp_c`, `logp_r`) and of the reference (`ref_c`, `ref_r`) for the chosen and rejected completion,
and their completion token counts (`n_c`, `n_r`; the reference scores the same tokens). `beta` comes
from `method.args.beta`; any other hyper-parameter is a keyword argument set in the loss's YAML
(`conf/method/dpo_loss/<name>.yaml`, `_partial_: true`). A loss returns `(per_pair_loss, metrics)`;
`metrics` holds only what is particular to the loss (usually nothing): the trainer always logs
TRL's `rewards/*` and `logps/*` from `reward_metrics`.

Whether a loss sums or averages over tokens is the loss's own choice: the log-probs are sums, and a
length-normalised loss divides by `n_c`/`n_r` itself (ipo, sigmoid_norm).

With the log-ratios `c = logp_c - ref_c`, `r = logp_r - ref_r` and the margin `delta = c - r`,
formulas and names as in TRL 1.16's DPOTrainer (`loss_type=...`):
- sigmoid       -(1-ls) logsig(b delta) - ls logsig(-b delta)   DPO, Rafailov et al. 2023 eq. 7;
                label smoothing `ls` as in cDPO (Mitchell 2023). TRL 1.16 has no `ls` here (ls = 0).
- hinge         relu(1 - b delta)                               SLiC, Zhao et al. 2023
- ipo           (c/n_c - r/n_r - 1/(2b))^2                      IPO, Azar et al. 2023 eq. 17, per-token
                means (the IPO authors' form; a sum makes the square grow with length, trl#1677)
- robust        (-(1-ls) logsig(b delta) + ls logsig(-b delta)) / (1 - 2 ls)   rDPO, Chowdhury et al. 2024
- exo_pair      KL(softmax(b [c, r]) || [1-ls, ls])             EXO, Ji et al. 2024 eq. 16
- nca_pair      -logsig(b c) - logsig(-b c)/2 - logsig(-b r)/2  NCA, Chen et al. 2024
- bco_pair      -logsig(b c) - logsig(-b r)                     BCO, Jung et al. 2024 (paired form)
- sppo_hard     (c - 1/(2b))^2 + (r + 1/(2b))^2                 SPPO, Wu et al. 2024 (hard P = 1/0)
- aot           sigmoid form on sorted(logp_c - logp_r) - sorted(ref_c - ref_r)   AOT, Melnyk et al. 2024
- aot_unpaired  sigmoid form on sorted(c) - sorted(r)          AOT (unpaired)
- apo_zero      (1 - sig(b c)) + sig(b r)                       APO, D'Oosterlinck et al. 2024 eq. 7
- apo_down      sig(b c) + (1 - sig(b delta))                   APO eq. 8
- discopop      (1-m) (-logsig(b delta)) + m exp(-b delta), m = sig(b delta / tau)
                                                                DiscoPOP, Chris Lu et al. 2024 eq. 5
- sigmoid_norm  -logsig(b (c/n_c - r/n_r))                      length-normalised DPO (as SimPO's length term)
- sft           -sum(logp_c) / sum(n_c) over the batch          NLL of the chosen tokens (RPO's term)
`weighted` sums several of them with weights (TRL's `loss_type=[...]`, `loss_weights=[...]`);
`conf/method/dpo_loss/mpo.yaml` is MPO's (Wang et al. 2024): 0.8 sigmoid + 0.2 bco_pair + 1.0 sft.

A new loss is one function with this signature plus one YAML naming it (`_target_`, `_partial_: true`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from ablate.schema import losses as L

Tensor = torch.Tensor
# (logp_c, logp_r, ref_c, ref_r, n_c, n_r, beta=..., **hyper) -> (per_pair_loss, metrics)
DPOLoss = Callable[..., tuple[Tensor, dict[str, Tensor]]]


def reward_metrics(
    logp_c: Tensor, logp_r: Tensor, ref_c: Tensor, ref_r: Tensor, beta: float
) -> dict[str, Tensor]:
    """TRL's DPO metrics, per pair (the trainer averages them): implicit rewards and log-probs."""
    return compared(beta, logp_c - ref_c, logp_r - ref_r, logp_c, logp_r)


def compared(beta: float, c: Tensor, r: Tensor, logp_c: Tensor, logp_r: Tensor) -> dict[str, Tensor]:
    """TRL's preference metrics, per pair: `rewards/*` of beta times the rewards a loss compares (c, r),
    `logps/*` of the log-probs (the reference-free losses' too)."""
    chosen, rejected = beta * c.detach(), beta * r.detach()
    return {
        "rewards/chosen": chosen,
        "rewards/rejected": rejected,
        "rewards/accuracies": (chosen > rejected).float(),
        "rewards/margins": chosen - rejected,
        "logps/chosen": logp_c.detach(),
        "logps/rejected": logp_r.detach(),
    }


def smoothed(z: Tensor, label_smoothing: float) -> Tensor:
    """-(1-ls) logsig(z) - ls logsig(-z): the logistic loss with a flipped-label probability ls."""
    return -(1 - label_smoothing) * F.logsigmoid(z) - label_smoothing * F.logsigmoid(-z)


def per_token(x_c: Tensor, x_r: Tensor, n_c: Tensor, n_r: Tensor) -> tuple[Tensor, Tensor]:
    """x_c / n_c, x_r / n_r: summed log-probs (or log-ratios) as per-token means (0 tokens count as 1)."""
    return x_c / n_c.clamp(min=1), x_r / n_r.clamp(min=1)


def token_nll(logp: Tensor, n: Tensor) -> Tensor:
    """-sum(logp) / sum(n): the NLL as a token mean over the batch (TRL's mean-reduced CrossEntropyLoss)."""
    return -logp.sum() / n.sum().clamp(min=1)


def _margin(logp_c: Tensor, logp_r: Tensor, ref_c: Tensor, ref_r: Tensor) -> Tensor:
    """delta = (logp_c - ref_c) - (logp_r - ref_r): the chosen log-ratio's lead over the rejected one."""
    return (logp_c - ref_c) - (logp_r - ref_r)


def _sorted_gap(a: Tensor, b: Tensor) -> Tensor:
    """sorted(a) - sorted(b) across the batch: AOT's margin of two distributions, not of the pairs."""
    return torch.sort(a, dim=0)[0] - torch.sort(b, dim=0)[0]


def sigmoid(
    logp_c: Tensor,
    logp_r: Tensor,
    ref_c: Tensor,
    ref_r: Tensor,
    n_c: Tensor,
    n_r: Tensor,
    beta: float,
    label_smoothing: float = L.Sigmoid.label_smoothing,
) -> tuple[Tensor, dict[str, Tensor]]:
    """DPO: -log sigmoid(beta * delta); with label_smoothing > 0, cDPO's smoothed target."""
    return smoothed(beta * _margin(logp_c, logp_r, ref_c, ref_r), label_smoothing), {}


def hinge(
    logp_c: Tensor, logp_r: Tensor, ref_c: Tensor, ref_r: Tensor, n_c: Tensor, n_r: Tensor, beta: float
) -> tuple[Tensor, dict[str, Tensor]]:
    """SLiC: relu(1 - beta * delta). Zero gradient once beta * delta >= 1: separated pairs stop pulling."""
    return torch.relu(1 - beta * _margin(logp_c, logp_r, ref_c, ref_r)), {}


def ipo(
    logp_c: Tensor, logp_r: Tensor, ref_c: Tensor, ref_r: Tensor, n_c: Tensor, n_r: Tensor, beta: float
) -> tuple[Tensor, dict[str, Tensor]]:
    """IPO (eq. 17, beta = tau): the per-token-mean margin regressed onto 1/(2 beta)."""
    c, r = per_token(logp_c - ref_c, logp_r - ref_r, n_c, n_r)
    return (c - r - 1 / (2 * beta)) ** 2, {}


def robust(
    logp_c: Tensor,
    logp_r: Tensor,
    ref_c: Tensor,
    ref_r: Tensor,
    n_c: Tensor,
    n_r: Tensor,
    beta: float,
    label_smoothing: float = L.Robust.label_smoothing,
) -> tuple[Tensor, dict[str, Tensor]]:
    """rDPO: unbiased under labels flipped with probability label_smoothing (in [0, 0.5))."""
    z = beta * _margin(logp_c, logp_r, ref_c, ref_r)
    ls = label_smoothing
    return (-(1 - ls) * F.logsigmoid(z) + ls * F.logsigmoid(-z)) / (1 - 2 * ls), {}


def exo_pair(
    logp_c: Tensor,
    logp_r: Tensor,
    ref_c: Tensor,
    ref_r: Tensor,
    n_c: Tensor,
    n_r: Tensor,
    beta: float,
    label_smoothing: float = L.ExoPair.label_smoothing,
) -> tuple[Tensor, dict[str, Tensor]]:
    """EXO (eq. 16, K = 2): KL from the policy's pair distribution to the smoothed label [1-ls, ls], ls>0."""
    z = beta * _margin(logp_c, logp_r, ref_c, ref_r)
    eps = torch.tensor(label_smoothing, dtype=z.dtype, device=z.device)
    loss = torch.sigmoid(z) * (F.logsigmoid(z) - torch.log1p(-eps)) + torch.sigmoid(-z) * (
        F.logsigmoid(-z) - torch.log(eps)
    )
    return loss, {}


def nca_pair(
    logp_c: Tensor, logp_r: Tensor, ref_c: Tensor, ref_r: Tensor, n_c: Tensor, n_r: Tensor, beta: float
) -> tuple[Tensor, dict[str, Tensor]]:
    """NCA: absolute rewards, chosen pushed up against both; the rejected one pushed down."""
    c, r = beta * (logp_c - ref_c), beta * (logp_r - ref_r)
    return -F.logsigmoid(c) - 0.5 * F.logsigmoid(-c) - 0.5 * F.logsigmoid(-r), {}


def bco_pair(
    logp_c: Tensor, logp_r: Tensor, ref_c: Tensor, ref_r: Tensor, n_c: Tensor, n_r: Tensor, beta: float
) -> tuple[Tensor, dict[str, Tensor]]:
    """BCO (paired, no reward shift): chosen classified as good, rejected as bad, independently."""
    return -F.logsigmoid(beta * (logp_c - ref_c)) - F.logsigmoid(-beta * (logp_r - ref_r)), {}


def sppo_hard(
    logp_c: Tensor, logp_r: Tensor, ref_c: Tensor, ref_r: Tensor, n_c: Tensor, n_r: Tensor, beta: float
) -> tuple[Tensor, dict[str, Tensor]]:
    """SPPO with hard win probabilities: chosen log-ratio -> +1/(2 beta), rejected -> -1/(2 beta)."""
    return ((logp_c - ref_c) - 0.5 / beta) ** 2 + ((logp_r - ref_r) + 0.5 / beta) ** 2, {}


def aot(
    logp_c: Tensor,
    logp_r: Tensor,
    ref_c: Tensor,
    ref_r: Tensor,
    n_c: Tensor,
    n_r: Tensor,
    beta: float,
    label_smoothing: float = L.AOT.label_smoothing,
) -> tuple[Tensor, dict[str, Tensor]]:
    """AOT (paired): sorted policy margins against sorted reference margins, across the batch."""
    return smoothed(beta * _sorted_gap(logp_c - logp_r, ref_c - ref_r), label_smoothing), {}


def aot_unpaired(
    logp_c: Tensor,
    logp_r: Tensor,
    ref_c: Tensor,
    ref_r: Tensor,
    n_c: Tensor,
    n_r: Tensor,
    beta: float,
    label_smoothing: float = L.AOTUnpaired.label_smoothing,
) -> tuple[Tensor, dict[str, Tensor]]:
    """AOT (unpaired): sorted chosen log-ratios against sorted rejected log-ratios."""
    return smoothed(beta * _sorted_gap(logp_c - ref_c, logp_r - ref_r), label_smoothing), {}


def apo_zero(
    logp_c: Tensor, logp_r: Tensor, ref_c: Tensor, ref_r: Tensor, n_c: Tensor, n_r: Tensor, beta: float
) -> tuple[Tensor, dict[str, Tensor]]:
    """APO-zero (eq. 7): chosen better than the model's own outputs: raise chosen, lower rejected."""
    return (1 - torch.sigmoid(beta * (logp_c - ref_c))) + torch.sigmoid(beta * (logp_r - ref_r)), {}


def apo_down(
    logp_c: Tensor, logp_r: Tensor, ref_c: Tensor, ref_r: Tensor, n_c: Tensor, n_r: Tensor, beta: float
) -> tuple[Tensor, dict[str, Tensor]]:
    """APO-down (eq. 8): chosen worse than the model's own outputs: lower both, rejected more."""
    c, r = logp_c - ref_c, logp_r - ref_r
    return torch.sigmoid(beta * c) + (1 - torch.sigmoid(beta * (c - r))), {}


def discopop(
    logp_c: Tensor,
    logp_r: Tensor,
    ref_c: Tensor,
    ref_r: Tensor,
    n_c: Tensor,
    n_r: Tensor,
    beta: float,
    tau: float = L.DiscoPOP.tau,
) -> tuple[Tensor, dict[str, Tensor]]:
    """DiscoPOP (eq. 5): logistic loss blended into exp(-z) as the margin z grows (temperature tau)."""
    z = beta * _margin(logp_c, logp_r, ref_c, ref_r)
    m = torch.sigmoid(z / tau)
    return -F.logsigmoid(z) * (1 - m) + torch.exp(-z) * m, {}


def sigmoid_norm(
    logp_c: Tensor, logp_r: Tensor, ref_c: Tensor, ref_r: Tensor, n_c: Tensor, n_r: Tensor, beta: float
) -> tuple[Tensor, dict[str, Tensor]]:
    """DPO on per-token-mean log-ratios: -log sigmoid(beta * (c/n_c - r/n_r))."""
    c, r = per_token(logp_c - ref_c, logp_r - ref_r, n_c, n_r)
    return -F.logsigmoid(beta * (c - r)), {}


def sft(
    logp_c: Tensor, logp_r: Tensor, ref_c: Tensor, ref_r: Tensor, n_c: Tensor, n_r: Tensor, beta: float
) -> tuple[Tensor, dict[str, Tensor]]:
    """NLL of the chosen completions, a mean over every chosen token of the batch (TRL's), given to
    each pair so that its batch mean is that token mean."""
    return token_nll(logp_c, n_c).expand_as(logp_c), {}


def weighted(
    logp_c: Tensor,
    logp_r: Tensor,
    ref_c: Tensor,
    ref_r: Tensor,
    n_c: Tensor,
    n_r: Tensor,
    beta: float,
    losses: Sequence[DPOLoss],
    weights: Sequence[float] | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """sum_i weights[i] * losses[i] (TRL's `loss_type=[...]` + `loss_weights`); weights default to 1.

    Logs each term's batch mean as `loss/<function name>` (unweighted).
    """
    weights = [1.0] * len(losses) if weights is None else list(weights)
    if len(weights) != len(losses):
        raise ValueError(f"weighted: {len(weights)} weights for {len(losses)} losses")
    total = torch.zeros_like(logp_c)
    metrics: dict[str, Tensor] = {}
    for fn, w in zip(losses, weights):
        loss, extra = fn(logp_c, logp_r, ref_c, ref_r, n_c, n_r, beta=beta)
        total = total + w * loss
        metrics[f"loss/{name(fn)}"] = loss.detach().mean()
        metrics.update(extra)
    return total, metrics


def name(fn: Callable[..., object]) -> str:
    """The function behind a (possibly partial) loss, for metric names and messages."""
    while hasattr(fn, "func"):
        fn = fn.func  # functools.partial
    return getattr(fn, "__name__", type(fn).__name__)
