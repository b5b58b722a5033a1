"""GRPO's `method.args` (conf/method/grpo.yaml): TrainingArguments with GRPO's fields, defaults and
checks (ablate.schema.grpo.GRPOArgs), and its tools and environment resolved from config."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from transformers import TrainingArguments

from ablate.rewards import resolve
from ablate.rollouts.tool_calls import schema
from ablate.schema.grpo import GRPOArgs


@dataclass
class GRPOConfig(GRPOArgs, TrainingArguments):
    """`method.args`: TrainingArguments with GRPO's fields, defaults and checks
    (ablate.schema.grpo.GRPOArgs)."""

    # GRPO's KL (beta) is a loss term; RLOO's (RLOOConfig) a reward penalty
    kl_in_reward: ClassVar[bool] = False
    remove_unused_columns: bool = False  # reward functions receive every dataset column

    def __post_init__(self) -> None:
        super().__post_init__()
        # importable, callable, a schema: one line each, before the model
        for i, tool in enumerate(self.tool_functions()):
            schema(tool, f"method.args.tools[{i}]")
        # importable and callable (its methods' schemas: when the trainer makes one)
        self.environment_factory()

    def tool_functions(self) -> list[Callable[..., Any]]:
        """method.args.tools as functions."""
        return [resolve.function(t, f"method.args.tools[{i}]") for i, t in enumerate(self.tools or [])]

    def environment_factory(self) -> Callable[[], Any] | None:
        """method.args.environment as a factory of instances (its other keys bound as keyword arguments)."""
        return (
            None
            if self.environment is None
            else resolve.environment(self.environment, "method.args.environment")
        )
