"""The prompts a rollout trainer samples from (GRPO, RLOO, distillation, `ablate eval`): tokenised whole, as
TRL 1.16's trainers do (none of GRPOConfig, RLOOConfig, DistillationConfig has a prompt limit). With
`method.args.max_prompt_length` set, each longer prompt keeps its last N tokens (the part the completion
answers), and one warning line per split says how many were cut; the counts go to run.json (`prompts_cut`)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from datasets import Dataset
from transformers import PreTrainedTokenizerBase

from ablate.data.tokenize import prepare_prompts

log = logging.getLogger("ablate")


@dataclass(frozen=True)
class Cut:
    """What `max_prompt_length` did to one split's prompts."""

    rows: int  # prompts in the split
    cut: int  # of them, longer than max_prompt_length: their start dropped
    longest: int  # the longest prompt before any cut, in tokens


def prompt_rows(
    dataset: Dataset,
    tokenizer: PreTrainedTokenizerBase,
    max_prompt_length: int | None,
    name: str = "train",
    encode: Callable[[Any, int], list[int]] | None = None,
) -> tuple[Dataset, Cut]:
    """Prompt-only rows with `prompt_ids` added (ablate.data.tokenize.prepare_prompts: other columns stay for
    the rewards), each cut to its last `max_prompt_length` tokens when that is set, and what was cut."""
    dataset = prepare_prompts(dataset, tokenizer, None, name, encode=encode)
    lengths = dataset.map(
        lambda b: {"n": [len(ids) for ids in b["prompt_ids"]]},
        batched=True,
        remove_columns=dataset.column_names,
        desc=f"Measuring {name} prompts",
    )["n"]
    over = 0 if max_prompt_length is None else sum(n > max_prompt_length for n in lengths)
    if over:
        log.warning(
            "%d of %d %s prompts are longer than method.args.max_prompt_length=%d: cut to their last %d "
            "tokens (null keeps whole prompts, as TRL 1.16)",
            over,
            len(lengths),
            name,
            max_prompt_length,
            max_prompt_length,
        )
        dataset = dataset.map(
            lambda b: {"prompt_ids": [ids[-max_prompt_length:] for ids in b["prompt_ids"]]},
            batched=True,
            desc=f"Cutting {name} prompts",
        )
    return dataset, Cut(rows=len(lengths), cut=over, longest=max(lengths, default=0))


def cuts_record(max_prompt_length: int | None, cuts: dict[str, Cut]) -> dict[str, Any]:
    """run.json's `prompts_cut`: the limit and, per split, how many prompts it cut."""
    return {"max_prompt_length": max_prompt_length, **{split: asdict(c) for split, c in cuts.items()}}


def longest_row(
    cuts: dict[str, Cut], max_prompt_length: int | None, max_completion_length: int
) -> int | None:
    """The longest row (prompt + completion) a round of these prompts can hold (None: no prompts yet): a
    sliding window at least this long never cuts one (ablate.speed.plan), an engine's context (vLLM)."""
    if not cuts:
        return None
    longest = max(c.longest for c in cuts.values())
    return min(longest, max_prompt_length or longest) + max_completion_length
