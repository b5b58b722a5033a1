"""RLOO's arguments (`method.args`, conf/method/rloo.yaml): GRPO's (the same rollouts: generation, async,
vLLM, steps_per_generation) plus TRL 1.16's RLOOConfig names and defaults for what RLOO adds, checked on
creation (one line per refusal). The trainer is GRPO's (ablate.methods.grpo.GRPOTrainer) with RLOO's
estimator, objective and aggregation (ablate.losses.rloo); `kl_in_reward` tells it where RLOO's KL goes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from ablate.errors import ConfigError
from ablate.methods.grpo_config import GRPOConfig


@dataclass
class RLOOConfig(GRPOConfig):
    kl_in_reward: ClassVar[bool] = True  # beta * KL(pi_old || ref) is a reward penalty (RLOO), not a loss term (GRPO)
    beta: float = field(default=0.05, metadata={"help": "Weight of the KL penalty in the reward; 0 = no reference model."})
    normalize_advantages: bool = field(
        default=False, metadata={"help": "Normalise the advantages over the generation batch (mean 0, std 1)."})
    reward_clip_range: list[float] | None = field(
        default=None, metadata={"help": "Clip the rewards into [min, max] before the KL penalty; None = off."})
    vllm_importance_sampling_correction: bool = False  # TRL's RLOO has no engine correction

    def __post_init__(self) -> None:
        super().__post_init__()
        clip = self.reward_clip_range
        checks = [
            (self.beta >= 0, f"beta must be >= 0 (0 = no KL penalty), got {self.beta}"),
            (clip is None or (len(clip) == 2 and clip[0] <= clip[1]),
             f"reward_clip_range must be [min, max] with min <= max (or null), got {clip}"),
            (self.importance_sampling_level == "token", "importance_sampling_level is GRPO's: RLOO's ratio is always one "
             "per completion, exp of its summed token log-ratios"),
            (not self.vllm_importance_sampling_correction, "vllm_importance_sampling_correction is GRPO's (TRL's RLOO "
             "has no engine correction)"),
        ]
        for ok, msg in checks:
            if not ok:
                raise ConfigError(f"method.args: {msg}")
