"""The judges of `eval=judge` (the config group `judge`): what scores each answer, as reward functions (TRL's
call: prompts, completions, the data's columns -> one score each), so that every judge is scored the way
GRPO's rewards are (ablate.rollouts.rewarding)."""

from __future__ import annotations

from typing import Any

from ablate.errors import ConfigError
from ablate.schema.evaluation import RewardModelJudgeNode


class RewardModelJudge:
    """`judge=reward_model judge.path=DIR`: a learned reward model (an `ablate train method=reward` run dir or
    its model/, or any Hugging Face sequence classifier with one label) scores prompt + answer
    (ablate.rewards.RewardModel: as TRL scores a reward model)."""

    name = "reward_model"

    def __init__(self, path: str, batch_size: int = RewardModelJudgeNode.batch_size) -> None:
        from ablate.rewards.reward_model import RewardModel

        self.model = RewardModel(path, batch_size=batch_size)  # the path is checked at once (one line)

    def funcs(self, data: Any, method_args: Any) -> tuple[dict[str, Any], list[float] | None]:
        return {self.name: self.model}, None


class RewardFuncsJudge:
    """`judge=reward_funcs`: the data's reward functions (data.reward_funcs, weighted by the method's
    reward_weights where it has them): a verifiable task's own check of an answer."""

    name = "reward_funcs"

    def funcs(self, data: Any, method_args: Any) -> tuple[dict[str, Any], list[float] | None]:
        found = data.reward_funcs or {}
        if not found:
            raise ConfigError(
                "judge=reward_funcs scores answers with the data's reward functions, and this data has "
                "none (data.reward_funcs): give data=... with reward functions, or judge=reward_model "
                "judge.path=DIR"
            )
        weights = method_args.get("reward_weights") if method_args is not None else None
        return dict(found), list(weights) if weights else None
