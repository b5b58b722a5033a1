"""The optimizer and schedule from config (`conf/optimizer/*.yaml`): what the `optimizer` group's
partials are called with, and the one warning about their lr. The trainers' `create_optimizer` /
`create_scheduler` (ablate.methods.base.AblateTrainer) call them, at the moment Trainer builds its own.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

OptimizerFactory = Callable[[list[nn.Parameter]], torch.optim.Optimizer]  # the `optimizer` group's partial
SchedulerFactory = Callable[..., torch.optim.lr_scheduler.LRScheduler]  # f(optimizer, num_training_steps=N)

# A model this large was not built from scratch here: the tiny model (~0.2M parameters) trains from a random
# init at conf/optimizer/adamw.yaml's lr; a pretrained one fine-tuned in full at that lr forgets what it knew
# within a few steps.
PRETRAINED_PARAMS = 10_000_000
TOY_LR = 1e-3


def warn_if_toy_lr(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """One warning when every weight of a large model trains at a from-scratch lr (>= 1e-3): the
    optimizer's default is the tiny model's, and `model=local` (or a user's model file) keeps it.
    Adapters (+peft) train a small part at such rates on purpose: no warning."""
    import logging

    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    lr = max((g.get("lr", 0.0) for g in optimizer.param_groups), default=0.0)
    if total >= PRETRAINED_PARAMS and trainable == total and lr >= TOY_LR:
        logging.getLogger("ablate").warning(
            "lr %.3g on a %dM-parameter model trained in full: that is the tiny model's from-scratch lr; a "
            "pretrained model is usually fine-tuned at 1e-5..1e-4 (optimizer.optimizer.lr=2e-5, or "
            "optimizer/lr=pretrained)",
            lr,
            total // 1_000_000,
        )
