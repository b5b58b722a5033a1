"""Evaluation of a policy by what it generates (`ablate eval` on a GRPO, RLOO or distillation run): the mean
reward of its completions of held-out prompts, scored by the run's own reward functions.

Each prompt gets one greedy completion (the default: deterministic, the policy's mode) or `samples`
sampled ones (the run's temperature, top-k and top-p: what training sampled), generated in batches of
prompts by the trainers' generator (`SharedPromptGenerator`: each prompt prefilled once; with GRPO's tools,
over several turns whose calls run, ablate.rollouts.turns). The rewards are TRL's reward-function call, as
GRPO's trainer makes it (ablate.rollouts.rewarding), weighted by the run's `reward_weights`. Metrics (the
trainers' names, `eval_`-prefixed): `reward`, `reward_std`, `rewards/<func>/mean`, TRL's `completions/*`
(lengths, `clipped_ratio`, the lengths of those ending with EOS; with tools, `tools/call_frequency` and
`tools/failure_frequency`); and per prompt, the mean of its completions' rewards (`ablate compare` pairs them
across runs).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from datasets import Dataset
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ablate.rollouts import rewarding
from ablate.rollouts.generation import SamplingArgs, SharedPromptGenerator, as_completions, stop_ids
from ablate.rollouts.prompts import prompt_rows
from ablate.rollouts.stats import completion_metrics
from ablate.rollouts.turns import ToolGenerator, build_toolbox, tool_metrics

RewardFunc = Callable[..., list[float | None]]


@dataclass
class Scored:
    """Completions of a dataset's prompts, `n` per prompt (prompt-major), scored by every reward function."""

    n: int
    table: torch.Tensor  # (prompts * n, functions) rewards, NaN where a function does not score one
    total: torch.Tensor  # (prompts * n,) the weighted sum (NaN where no function scored it)
    names: list[str]  # the reward functions, in the table's column order
    lengths: list[int]  # completion tokens (tool results left out)
    clipped: list[bool]  # ended without an end-of-text token (cut at max_completion_length)
    texts: list[str]  # the completions, decoded
    prompts: list[str]  # each completion's prompt, decoded
    tool_calls: list[Any] = field(default_factory=list)  # tool calls made, per completion
    failures: list[Any] = field(default_factory=list)  # failed tool calls, per completion
    truncated: list[Any] = field(default_factory=list)  # results cut (max_tool_result_length), per completion


@torch.no_grad()
def scored_completions(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    dataset: Dataset,
    reward_funcs: dict[str, RewardFunc],
    args: Any,
    samples: int = 0,
    batch_size: int = 16,
) -> Scored:
    """`model`'s completions of `dataset`'s prompts, scored by `reward_funcs`. `args`: the run's method
    arguments (max_prompt_length, the sampling fields, reward_weights; GRPO's tools and environment: its
    completions are then generated as in training, the calls run, and scored by their messages); `samples`
    0: one greedy completion per prompt, else that many sampled ones."""
    box = build_toolbox(args, tokenizer) if callable(getattr(args, "tool_functions", None)) else None
    # null ones dropped
    reward_funcs, weights = rewarding.gather(reward_funcs, getattr(args, "reward_weights", None), box)
    rewarding.ready(reward_funcs, dataset, box, model.device)  # each held to the data's columns
    prompts, _ = prompt_rows(
        dataset,
        tokenizer,
        getattr(args, "max_prompt_length", None),
        "eval",
        encode=box.prompt_ids if box is not None else None,
    )
    sampling: SamplingArgs = args
    generate: Any = SharedPromptGenerator(sampling, tokenizer, do_sample=samples > 0)
    if box is not None:  # tool calls between turns, as GRPO's rollouts
        generate = ToolGenerator(generate, box, tokenizer, args.max_completion_length)
    stops, n = set(stop_ids(tokenizer, model)), max(samples, 1)
    was_training = model.training
    model.eval()
    tables, lengths, clipped, warned, tool_calls, failures, texts, asked, cut = (
        [],
        [],
        [],
        set(),
        [],
        [],
        [],
        [],
        [],
    )
    for start in range(0, len(prompts), batch_size):
        rows = [prompts[i] for i in range(start, min(start + batch_size, len(prompts))) for _ in range(n)]
        out = as_completions(
            generate(model, generate.start(rows) if box is not None else [r["prompt_ids"] for r in rows])
        )
        tables.append(
            rewarding.table(
                reward_funcs, rows, out, tokenizer, getattr(generate, "environments", None), warned
            )
        )
        lengths += [sum(m) for m in out.tool_mask] if out.tool_mask is not None else [len(c) for c in out.ids]
        clipped += [not c or c[-1] not in stops for c in out.ids]
        tool_calls += out.tool_calls or []
        failures += out.tool_failures or []
        cut += out.tool_truncated or []
        texts += tokenizer.batch_decode(out.ids, skip_special_tokens=True)
        asked += tokenizer.batch_decode([r["prompt_ids"] for r in rows], skip_special_tokens=True)
    model.train(was_training)
    table = torch.cat(tables)
    total = (
        (table * torch.tensor(weights)).nansum(dim=1).masked_fill(torch.isnan(table).all(dim=1), torch.nan)
    )
    return Scored(
        n, table, total, list(reward_funcs), lengths, clipped, texts, asked, tool_calls, failures, cut
    )


def reward_eval(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    dataset: Dataset,
    reward_funcs: dict[str, RewardFunc],
    args: Any,
    samples: int = 0,
    batch_size: int = 16,
) -> tuple[dict[str, float], list[dict[str, float]]]:
    """(metrics, one row per prompt) of `model`'s completions of `dataset`'s prompts (scored_completions)."""
    s = scored_completions(model, tokenizer, dataset, reward_funcs, args, samples, batch_size)
    box = callable(getattr(args, "tool_functions", None))
    metrics = {
        "reward": torch.nanmean(s.total).item(),
        "reward_std": _std(s.total),
        **{f"rewards/{f}/mean": torch.nanmean(s.table[:, i]).item() for i, f in enumerate(s.names)},
        **completion_metrics(s.lengths, s.clipped),
        **(
            {k: v.item() for k, v in tool_metrics(s.tool_calls, s.failures, s.truncated).items()}
            if box
            else {}
        ),
    }
    per_prompt = s.total.view(-1, s.n)
    n = s.n
    examples = [
        {
            "reward": torch.nanmean(r).item(),
            **{
                f"rewards/{f}/mean": torch.nanmean(s.table[i * n : (i + 1) * n, j]).item()
                for j, f in enumerate(s.names)
            },
        }
        for i, r in enumerate(per_prompt)
    ]
    return {f"eval_{k}": v for k, v in metrics.items()}, examples


def _std(x: torch.Tensor) -> float:
    x = x[~torch.isnan(x)]
    return x.std().item() if x.numel() > 1 else 0.0
