"""Evaluation of a policy by what it generates (`ablate eval` on a GRPO, RLOO or distillation run): the mean
reward of its completions of held-out prompts, scored by the run's own reward functions.

Each prompt gets one greedy completion (the default: deterministic, the policy's mode) or `samples`
sampled ones (the run's temperature, top-k and top-p: what training sampled), generated in batches of
prompts by the trainers' generator (`SharedPromptGenerator`: each prompt prefilled once). The rewards are
TRL's reward-function call, as GRPO's trainer makes it (`reward_table`), weighted by the run's
`reward_weights`. Metrics (the trainers' names, `eval_`-prefixed): `reward`, `reward_std`,
`rewards/<func>/mean`, `completions/mean_length`, `completions/clipped_ratio`; and per prompt, the mean of
its completions' rewards (`ablate compare` pairs them across runs).
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from datasets import Dataset
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ablate.data.tokenize import prepare_prompts
from ablate.rewards import calls as rewards
from ablate.rollouts.generation import SamplingArgs, SharedPromptGenerator, as_completions, stop_ids

RewardFunc = Callable[..., list[float | None]]


def reward_table(reward_funcs: dict[str, RewardFunc], tokenizer: PreTrainedTokenizerBase,
                 rows: list[dict[str, Any]], completion_ids: list[list[int]],
                 warned: set[str] | None = None) -> torch.Tensor:
    """(N, F) rewards of N completions, one column per function, None -> NaN: TRL's call (prompts,
    completions as text or as an assistant message, completion_ids, and every other dataset column), what
    the functions return held to its contract by ablate.rewards.calls (a user's mistake: one line)."""
    texts = tokenizer.batch_decode(completion_ids, skip_special_tokens=True)
    prompts = [r["prompt"] for r in rows]
    completions = [t if isinstance(p, str) else [{"role": "assistant", "content": t}] for p, t in zip(prompts, texts)]
    columns = {k: [r[k] for r in rows] for k in rows[0] if k not in ("prompt", "prompt_ids")}
    kwargs = dict(prompts=prompts, completions=completions, completion_ids=completion_ids, **columns)
    return rewards.table(reward_funcs, kwargs, len(rows), set() if warned is None else warned)


@torch.no_grad()
def reward_eval(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, dataset: Dataset,
                reward_funcs: dict[str, RewardFunc], args: Any, samples: int = 0,
                batch_size: int = 16) -> tuple[dict[str, float], list[dict[str, float]]]:
    """(metrics, one row per prompt) of `model`'s completions of `dataset`'s prompts. `args`: the run's
    method arguments (max_prompt_length, the sampling fields, reward_weights); `samples` 0: one greedy
    completion per prompt, else that many sampled ones."""
    reward_funcs = rewards.checked(reward_funcs, dataset)  # data.reward_funcs.NAME=null drops one
    prompts = prepare_prompts(dataset, tokenizer, getattr(args, "max_prompt_length", None), "eval")
    sampling: SamplingArgs = args
    generate = SharedPromptGenerator(sampling, tokenizer, do_sample=samples > 0)
    weights = torch.tensor(getattr(args, "reward_weights", None) or [1.0] * len(reward_funcs))
    stops, n = set(stop_ids(tokenizer, model)), max(samples, 1)
    was_training = model.training
    model.eval()
    tables, lengths, clipped, warned = [], [], [], set()
    for start in range(0, len(prompts), batch_size):
        rows = [prompts[i] for i in range(start, min(start + batch_size, len(prompts))) for _ in range(n)]
        ids = as_completions(generate(model, [r["prompt_ids"] for r in rows])).ids
        tables.append(reward_table(reward_funcs, tokenizer, rows, ids, warned))
        lengths += [len(c) for c in ids]
        clipped += [not c or c[-1] not in stops for c in ids]
    model.train(was_training)
    table = torch.cat(tables)
    total = (table * weights).nansum(dim=1).masked_fill(torch.isnan(table).all(dim=1), torch.nan)
    metrics = {"reward": torch.nanmean(total).item(), "reward_std": _std(total),
               **{f"rewards/{f}/mean": torch.nanmean(table[:, i]).item() for i, f in enumerate(reward_funcs)},
               "completions/mean_length": sum(lengths) / len(lengths),
               "completions/clipped_ratio": sum(clipped) / len(clipped)}
    per_prompt = total.view(-1, n)
    examples = [{"reward": torch.nanmean(r).item(),
                 **{f"rewards/{f}/mean": torch.nanmean(table[i * n:(i + 1) * n, j]).item() for j, f in enumerate(reward_funcs)}}
                for i, r in enumerate(per_prompt)]
    return {f"eval_{k}": v for k, v in metrics.items()}, examples


def _std(x: torch.Tensor) -> float:
    x = x[~torch.isnan(x)]
    return x.std().item() if x.numel() > 1 else 0.0
