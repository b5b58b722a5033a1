"""The structured configs of the evaluation nodes (conf/eval/, conf/judge/: ablate.evaluation), each field's
default declared here, once; the evaluations' keyword defaults are these. No torch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ablate.schema import BOOL, MISSING, Rule, Schema, field, integer, nullable, number


def _tasks(v: Any, n: Any) -> bool:
    return isinstance(v, list) and bool(v) and all(isinstance(t, str) and t for t in v)


def _path(v: Any, n: Any) -> bool:
    return isinstance(v, str) and bool(v)


@dataclass
class HeldOutEval(Schema):
    node = "eval.heldout"
    targets = ("ablate.evaluation.heldout.HeldOut",)
    samples: int = field(0, integer(0), "GRPO/RLOO/distill: sampled answers per prompt (0: one greedy).")


@dataclass
class LmEvalEval(Schema):
    node = "eval.lm_eval"
    targets = ("ablate.evaluation.harness.LmEval",)
    tasks: list[str] = field(
        check=Rule(_tasks, "a non-empty list of task names: 'eval.lm_eval.tasks=[ablate_sort,gsm8k]'"),
        help="lm-eval task names: ablate's local ones (evaluation/tasks/) or lm-eval's (gsm8k: the hub).",
        factory=lambda: ["ablate_sort", "ablate_sort_choice"],
    )
    num_fewshot: int | None = field(
        None,
        nullable(integer(0), "each task's own"),
        "Examples shown in each prompt (null: each task's own).",
    )
    limit: int | None = field(
        None, nullable(integer(1), "every example"), "Only the first N examples of each task (null: all)."
    )
    batch_size: int = field(16, integer(1), "Requests per forward pass.")
    chat_template: bool | None = field(
        None,
        nullable(BOOL, "as the run trained"),
        "Apply the tokenizer's chat template as lm-eval does (null: when the run trained on chat rows).",
    )


@dataclass
class JudgeEval(Schema):
    node = "eval.judge"
    targets = ("ablate.evaluation.judged.Judged",)
    vs: str | None = field(
        None,
        nullable(Rule(_path, "a run dir or a model dir"), "the starting model"),
        "The baseline: a run dir or a save_pretrained dir (null: the run's starting model).",
    )
    samples: int = field(
        0, integer(0), "Answers per prompt and model (0: one greedy; N: N sampled, one seed for both)."
    )
    temperature: float = field(1.0, number(above=0), "Sampling temperature (samples > 0).")
    max_new_tokens: int = field(64, integer(1), "Tokens per answer.")
    limit: int | None = field(
        None, nullable(integer(1), "every prompt"), "Only the first N held-out prompts (null: all)."
    )


@dataclass
class RewardModelJudgeNode(Schema):
    node = "judge"
    targets = ("ablate.evaluation.judges.RewardModelJudge",)
    path: str = field(
        MISSING,
        Rule(_path, "a method=reward run dir or a sequence classifier's dir"),
        "The reward model: a method=reward run dir, or a sequence classifier's dir.",
    )
    batch_size: int = field(16, integer(1), "Answers per forward pass.")
