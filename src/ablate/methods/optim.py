"""The optimizer and schedule from config (`conf/optimizer/*.yaml`), built by Trainer's own hooks.

Trainer builds its optimizer and schedule in `create_optimizer` / `create_scheduler`, at the moment
that is right for the setup: after DDP wrapping, on the sharded parameters under FSDP (where it
refuses ready-made ones through `optimizers=`), with the real number of optimizer steps, and before
a resume loads their state from the checkpoint. `ConfiguredOptimizer` overrides only those two hooks
to call the config's `_partial_`s instead of Trainer's `args.optim` / `lr_scheduler_type` defaults.
ablate's trainers subclass it; so does a user's trainer that subclasses one of them.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn
from transformers import Trainer

OptimizerFactory = Callable[[list[nn.Parameter]], torch.optim.Optimizer]  # the `optimizer` group's partial
SchedulerFactory = Callable[..., torch.optim.lr_scheduler.LRScheduler]  # f(optimizer, num_training_steps=N)


class ConfiguredOptimizer(Trainer):
    """A Trainer whose optimizer is `optimizer_factory(trainable_parameters)` and whose schedule is
    `scheduler_factory(optimizer, num_training_steps=N)`; either left None keeps Trainer's default."""

    def __init__(
        self,
        *args: Any,
        optimizer_factory: OptimizerFactory | None = None,
        scheduler_factory: SchedulerFactory | None = None,
        **kwargs: Any,
    ) -> None:
        self.optimizer_factory = optimizer_factory
        self.scheduler_factory = scheduler_factory
        super().__init__(*args, **kwargs)

    def create_optimizer(self, model: nn.Module | None = None) -> torch.optim.Optimizer:
        """`model`: the model Trainer prepared (FSDP1 passes the wrapped one); else `self.model`."""
        if self.optimizer is None and self.optimizer_factory is not None:
            opt_model = self.model if model is None else model
            # one group of every trainable parameter: the config's weight_decay applies to all of them
            self.optimizer = self.optimizer_factory([p for p in opt_model.parameters() if p.requires_grad])
        return super().create_optimizer(model)  # with the optimizer set: only Trainer's platform wrapping

    def create_scheduler(
        self, num_training_steps: int, optimizer: torch.optim.Optimizer | None = None
    ) -> torch.optim.lr_scheduler.LRScheduler:
        """`num_training_steps`: the optimizer steps Trainer will run (max_steps or from the epochs)."""
        if self.lr_scheduler is None and self.scheduler_factory is not None:
            self.lr_scheduler = self.scheduler_factory(optimizer or self.optimizer, num_training_steps=num_training_steps)
            self._created_lr_scheduler = True  # as Trainer's own: a second train() builds it again
        return super().create_scheduler(num_training_steps, optimizer)
