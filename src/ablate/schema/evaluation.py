"""The schemas of the evaluation nodes (conf/eval/, conf/judge/: ablate.evaluation). No torch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ablate.schema import BOOL, Rule, Schema, field, integer, nullable, number


def _tasks(v: Any, n: Any) -> bool:
    return isinstance(v, list) and bool(v) and all(isinstance(t, str) and t for t in v)


def _path(v: Any, n: Any) -> bool:
    return isinstance(v, str) and bool(v)


@dataclass
class HeldOutEval(Schema):
    node = "eval.heldout"
    targets = ("ablate.evaluation.heldout.HeldOut",)
    samples: int = field(
        check=integer(0), help="GRPO/RLOO/distill: sampled answers per prompt (0: one greedy)"
    )


@dataclass
class LmEvalEval(Schema):
    node = "eval.lm_eval"
    targets = ("ablate.evaluation.harness.LmEval",)
    tasks: list[str] = field(
        check=Rule(_tasks, "a non-empty list of task names: 'eval.lm_eval.tasks=[ablate_sort,gsm8k]'"),
        help="lm-eval task names: ablate's local ones or lm-eval's",
    )
    num_fewshot: int | None = field(check=nullable(integer(0), "each task's own"), help="examples per prompt")
    limit: int | None = field(
        check=nullable(integer(1), "every example"), help="the first N examples of each task"
    )
    batch_size: int = field(check=integer(1), help="requests per forward pass")
    chat_template: bool | None = field(
        check=nullable(BOOL, "as the run trained"), help="apply the tokenizer's chat template"
    )


@dataclass
class JudgeEval(Schema):
    node = "eval.judge"
    targets = ("ablate.evaluation.judged.Judged",)
    vs: str | None = field(check=nullable(Rule(_path, "a run dir or a model dir"), "the starting model"))
    samples: int = field(check=integer(0), help="answers per prompt and model (0: one greedy)")
    temperature: float = field(check=number(above=0), help="sampling temperature")
    max_new_tokens: int = field(check=integer(1), help="tokens per answer")
    limit: int | None = field(check=nullable(integer(1), "every prompt"), help="the first N prompts")


@dataclass
class RewardModelJudgeNode(Schema):
    node = "judge"
    targets = ("ablate.evaluation.judges.RewardModelJudge",)
    path: str = field(check=Rule(_path, "a method=reward run dir or a sequence classifier's dir"))
    batch_size: int = field(check=integer(1), help="answers per forward pass")
