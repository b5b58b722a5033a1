"""RLOO's arguments (`method.args`, conf/method/rloo.yaml): GRPO's (the same rollouts: generation, async,
vLLM, steps_per_generation) plus TRL 1.16's RLOOConfig names and defaults for what RLOO adds, each with
its check in ablate.schema.grpo.RLOOArgs. The trainer is GRPO's (ablate.methods.grpo.GRPOTrainer) with
RLOO's estimator, objective and aggregation (ablate.losses.rloo); `kl_in_reward` tells it where RLOO's KL
goes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ablate.methods.grpo_config import GRPOConfig
from ablate.schema.grpo import RLOOArgs


@dataclass
class RLOOConfig(RLOOArgs, GRPOConfig):
    kl_in_reward: ClassVar[bool] = (
        True  # beta * KL(pi_old || ref) is a reward penalty (RLOO), not a loss term (GRPO)
    )
