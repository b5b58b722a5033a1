"""The optimizer and schedule from config (`conf/optimizer/*.yaml`), built by Trainer's own hooks.

Trainer builds its optimizer and schedule in `create_optimizer` / `create_scheduler`, at the moment
that is right for the setup: after DDP wrapping, on the sharded parameters under FSDP (where it
refuses ready-made ones through `optimizers=`), with the real number of optimizer steps, and before
a resume loads their state from the checkpoint. `ConfiguredOptimizer` overrides only those two hooks
to call the config's `_partial_`s instead of Trainer's `args.optim` / `lr_scheduler_type` defaults.
ablate's trainers subclass it; so does a user's trainer that subclasses one of them. Its bases:
`ShardOnCPU` makes distributed=fsdp shard on CPU ranks too (ablate.methods.fsdp), `TiedHeadResume`
keeps a resume of a tied-embedding model quiet.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn
from transformers import Trainer

from ablate.methods.fsdp import ShardOnCPU

OptimizerFactory = Callable[[list[nn.Parameter]], torch.optim.Optimizer]  # the `optimizer` group's partial
SchedulerFactory = Callable[..., torch.optim.lr_scheduler.LRScheduler]  # f(optimizer, num_training_steps=N)


class TiedHeadResume(Trainer):
    """Resuming a model whose lm_head is tied to its input embedding (the tiny model, SmolLM2) loads a
    checkpoint without `lm_head.weight` (safetensors stores a shared tensor once), and Trainer warns
    "There were missing keys in the checkpoint model loaded: ['lm_head.weight']" though nothing is
    missing. Keys tied to a loaded one are tied again here, not reported; any other key still is."""

    def _issue_warnings_after_load(self, load_result: Any) -> None:
        model = self.accelerator.unwrap_model(self.model)
        tied = getattr(model, "all_tied_weights_keys", None) or {}
        missing = [k for k in load_result.missing_keys if k not in tied]
        if len(missing) < len(load_result.missing_keys):
            model.tie_weights()
        super()._issue_warnings_after_load(type(load_result)(missing, load_result.unexpected_keys))


class ConfiguredOptimizer(ShardOnCPU, TiedHeadResume):
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
            warn_if_toy_lr(opt_model, self.optimizer)
        return super().create_optimizer(model)  # with the optimizer set: only Trainer's platform wrapping

    def create_scheduler(
        self, num_training_steps: int, optimizer: torch.optim.Optimizer | None = None
    ) -> torch.optim.lr_scheduler.LRScheduler:
        """`num_training_steps`: the optimizer steps Trainer will run (max_steps or from the epochs)."""
        if self.lr_scheduler is None and self.scheduler_factory is not None:
            self.lr_scheduler = self.scheduler_factory(optimizer or self.optimizer, num_training_steps=num_training_steps)
            self._created_lr_scheduler = True  # as Trainer's own: a second train() builds it again
        return super().create_scheduler(num_training_steps, optimizer)


# A model this large was not built from scratch here: the tiny model (~0.2M parameters) trains from a random
# init at 3e-3; a pretrained one fine-tuned in full at that lr forgets what it knew within a few steps.
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
            "optimizer/lr=pretrained)", lr, total // 1_000_000)
