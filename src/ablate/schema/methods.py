"""`method.args` of the methods added after DPO, SFT and GRPO: a reward model, KTO, on-policy
distillation and RLOO. TRL 1.16's names and defaults, each field with its check, as in ablate.schema.args."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from ablate.schema import BOOL, Problem, Rule, choice, field, is_int, is_num, nullable, number, redefault
from ablate.schema.args import LENGTH, TrainArgs
from ablate.schema.grpo import GRPOArgs, SamplingArgs


@dataclass
class RewardArgs(TrainArgs):
    targets = ("ablate.methods.reward.RewardConfig",)
    max_length: int | None = field(
        1024, LENGTH, "Drop pairs whose chosen or rejected sequence is longer (TRL's filter)."
    )
    center_rewards_coefficient: float | None = field(
        None,
        nullable(number(at_least=0), "off"),
        "Weight of the mean-zero penalty (r_c + r_r)^2 (Eisenstein et al. 2023); null = off.",
    )


@dataclass
class KTOArgs(TrainArgs):
    targets = ("ablate.methods.kto.KTOConfig",)
    beta: float = field(0.1, number(above=0), "Scales the implicit reward b * log(pi/ref).")
    desirable_weight: float = field(
        1.0,
        number(above=0, why=" (a weight of its examples' losses)"),
        "Weight of desirable examples' losses.",
    )
    undesirable_weight: float = field(
        1.0,
        number(above=0, why=" (a weight of its examples' losses)"),
        "Weight of undesirable examples' losses.",
    )
    max_length: int | None = field(
        1024, LENGTH, "Keep the first N tokens of prompt+completion; drop examples whose prompt fills it."
    )
    precompute_ref_log_probs: bool = field(
        True, BOOL, "Score the data with the initial policy once, before training."
    )
    # TRL's: the KL pairs are fixed within each batch of the data's order
    train_sampling_strategy: str = field(
        "sequential",
        choice("sequential", words="sequential (the KL pairs are fixed in the data's order, as in TRL)"),
        "The data's order (KTO's KL pairs depend on it).",
    )

    def relations(self, cfg: Mapping[str, Any]) -> Iterator[Problem]:
        loss = str(((cfg.get("method") or {}).get("kto_loss") or {}).get("_target_", ""))
        problem = kl_batch_problem(self.per_device_train_batch_size, not loss.endswith("apo_zero_unpaired"))
        if problem is not None:
            yield problem


def kl_batch_problem(batch: Any, uses_kl: bool) -> Problem | None:
    """KTO's KL estimate pairs each example with another's completion within a batch: a batch of two at least.
    Checked against the config's loss (method/kto_loss) when the config is, and by the trainer against its
    own."""
    if not uses_kl or not is_int(batch) or batch >= 2:
        return None
    return (
        "method.args.per_device_train_batch_size",
        batch,
        "an integer >= 2 (KTO's KL estimate pairs each "
        "example with another's output; method/kto_loss=apo_zero_unpaired needs none)",
    )


@dataclass
class DistillArgs(SamplingArgs):
    targets = ("ablate.methods.distill.DistillConfig",)
    per_device_train_batch_size: int = redefault(
        TrainArgs, "per_device_train_batch_size", 16, "Prompts (one completion each) per micro-batch."
    )
    include_num_input_tokens_seen: str = redefault(
        TrainArgs,
        "include_num_input_tokens_seen",
        "no",
        "Trainer cannot count prompt rows' tokens; the trainer counts its own.",
    )
    beta: float = field(
        1.0,
        Rule(lambda v, n: is_num(v) and 0 <= v <= 1, "a number in [0, 1] (0 = forward KL, 1 = reverse KL)"),
        "Generalised JSD: 0 = forward KL, 1 = reverse KL (TRL's default).",
    )


def _clip_range(v: Any, n: Any) -> bool:
    return v is None or (isinstance(v, list) and len(v) == 2 and all(map(is_num, v)) and v[0] <= v[1])


@dataclass
class RLOOArgs(GRPOArgs):
    """GRPO's arguments (the same rollouts) with RLOO's: its KL is a reward penalty, its ratio one per
    completion."""

    targets = ("ablate.methods.rloo_config.RLOOConfig",)
    beta: float = field(
        0.05,
        number(at_least=0, why=" (0 = no KL penalty)"),
        "Weight of the KL penalty in the reward; 0 = no reference model.",
    )
    normalize_advantages: bool = field(
        False, BOOL, "Normalise the advantages over the generation batch (mean 0, std 1)."
    )
    reward_clip_range: list[float] | None = field(
        None,
        Rule(_clip_range, "null or [min, max] with min <= max"),
        "Clip the rewards into [min, max] before the KL penalty; null = off.",
    )
    importance_sampling_level: str = field(
        "token",
        choice("token", words="token (GRPO's option: RLOO's ratio is always one per completion)"),
        "GRPO's; RLOO's ratio is exp of the completion's summed token log-ratios.",
    )
    vllm_importance_sampling_correction: bool = field(
        False,
        Rule(lambda v, n: v is False, "false (TRL's RLOO has no engine correction)"),
        "GRPO's; TRL's RLOO has none.",
    )
