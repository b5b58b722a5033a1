"""Learning-rate schedules selected by `conf/optimizer/*.yaml` (`_partial_`).

Each is called by the trainer's `create_scheduler` (ablate.methods.base) as
`schedule(optimizer, num_training_steps=N)` with the number of optimizer steps Trainer will run, which
only exists once it knows its dataloader; the optimizer itself is a `_partial_` of any `torch.optim`
class, called by `create_optimizer` with the model's trainable parameters. A schedule's own settings have no
default here: its config node (conf/optimizer/scheduler/) declares each, once.
"""

from __future__ import annotations

import math

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR, LRScheduler, StepLR


def constant(optimizer: Optimizer, num_training_steps: int, warmup_steps: int) -> LRScheduler:
    """Linear warm-up over `warmup_steps`, then the optimizer's lr."""
    return LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / (warmup_steps + 1)))


def cosine(
    optimizer: Optimizer, num_training_steps: int, warmup_ratio: float, min_ratio: float
) -> LRScheduler:
    """Linear warm-up over `warmup_ratio * N` steps, then cosine decay to `min_ratio * lr` at step N."""
    warmup = int(warmup_ratio * num_training_steps)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / (warmup + 1)
        progress = (step - warmup) / max(1, num_training_steps - warmup)
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    return LambdaLR(optimizer, factor)


def step(optimizer: Optimizer, num_training_steps: int, step_size: int, gamma: float) -> LRScheduler:
    """`torch.optim.lr_scheduler.StepLR`: lr *= gamma every `step_size` steps (the TRL docs' example)."""
    return StepLR(optimizer, step_size=step_size, gamma=gamma)
