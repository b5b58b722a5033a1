"""DPO losses (Rafailov et al. 2023, eq. 7) as pure functions of per-sequence log-probs.

Every loss takes the summed completion log-probs of the policy and the reference, for the chosen and
rejected completions, and `beta`, and returns `(per_sequence_loss, metrics)`. With
    delta = (logp_c - ref_c) - (logp_r - ref_r)      (the implicit reward margin divided by beta)
- sigmoid: -log sigmoid(beta * delta)                (DPO, eq. 7)
- hinge:   relu(1 - beta * delta)                    (SLiC, Zhao et al. 2023, arXiv:2305.10425)
The metrics and their names are TRL's: `rewards/chosen = beta * (logp_c - ref_c)`, etc.

A new loss is one function here with this signature, one YAML under conf/method/ that sets
`loss_type: <function name>`, and one hand-computed test.
"""

from __future__ import annotations

import importlib
from typing import Callable

import torch
import torch.nn.functional as F

DPOLoss = Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]]


def _delta(logp_c: torch.Tensor, logp_r: torch.Tensor, ref_c: torch.Tensor, ref_r: torch.Tensor) -> torch.Tensor:
    return (logp_c - ref_c) - (logp_r - ref_r)


def reward_metrics(
    logp_c: torch.Tensor, logp_r: torch.Tensor, ref_c: torch.Tensor, ref_r: torch.Tensor, beta: float
) -> dict[str, torch.Tensor]:
    """TRL's DPO metrics, per sequence (the trainer averages them): implicit rewards and log-probs."""
    chosen = beta * (logp_c - ref_c).detach()
    rejected = beta * (logp_r - ref_r).detach()
    return {
        "rewards/chosen": chosen,
        "rewards/rejected": rejected,
        "rewards/accuracies": (chosen > rejected).float(),
        "rewards/margins": chosen - rejected,
        "logps/chosen": logp_c.detach(),
        "logps/rejected": logp_r.detach(),
    }


def sigmoid(
    logp_c: torch.Tensor, logp_r: torch.Tensor, ref_c: torch.Tensor, ref_r: torch.Tensor, beta: float
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """DPO's sigmoid loss: -log sigmoid(beta * delta), per sequence."""
    loss = -F.logsigmoid(beta * _delta(logp_c, logp_r, ref_c, ref_r))
    return loss, reward_metrics(logp_c, logp_r, ref_c, ref_r, beta)


def hinge(
    logp_c: torch.Tensor, logp_r: torch.Tensor, ref_c: torch.Tensor, ref_r: torch.Tensor, beta: float
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """SLiC's hinge loss on the DPO margin: relu(1 - beta * delta), per sequence.

    Zero gradient once beta * delta >= 1: pairs already separated by the margin stop pulling.
    """
    loss = torch.relu(1 - beta * _delta(logp_c, logp_r, ref_c, ref_r))
    return loss, reward_metrics(logp_c, logp_r, ref_c, ref_r, beta)


def resolve(loss_type: str) -> DPOLoss:
    """`loss_type` names a function in this module (`sigmoid`) or any importable one (`pkg.mod.fn`)."""
    if "." in loss_type:
        module, _, name = loss_type.rpartition(".")
        try:
            return getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as e:
            raise ValueError(f"loss_type '{loss_type}' could not be imported: {e}") from e
    if loss_type not in available():
        raise ValueError(f"unknown DPO loss_type '{loss_type}'; available: {', '.join(available())}")
    return globals()[loss_type]


def available() -> list[str]:
    """Names of the losses defined in this module."""
    skip = {"resolve", "reward_metrics", "available"}
    return sorted(
        n for n, f in globals().items()
        if callable(f) and not n.startswith("_") and n not in skip and getattr(f, "__module__", None) == __name__
    )
