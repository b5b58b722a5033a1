"""The rewards of generated completions (GRPO and RLOO's rounds, distillation's logged rewards, `ablate
eval`): which functions score a run, and a round's table of their values (TRL 1.16's call).

- `gather`: the data's reward functions in any form `data.reward_funcs` takes (the short form's dotted paths,
  `[myrew.short]`; named `_target_` nodes; what Hydra built of them: functions, a reward model), entries set
  to null dropped, with their weights (`method.args.reward_weights`); an environment that scores its episodes
  adds its `get_reward()` as one more column, weight 1 (TRL's).
- `ready`: once the trainer is built: each function against the data's columns (and `environments`, which
  every reward function receives when there is an environment), reward models moved to the trainer's device.
- `check_advantages`: NaN/inf advantages stop the round in one line.
- `reward_table` / `table`: one round's (N, F) rewards. Each completion is its text, or its messages
  (prompt-style data, and every completion with tool calls: turns and tool results).

Python functions, reward models and environments all go through ablate.rewards.calls: one line naming the one
that raised or returned the wrong thing, None/NaN for a completion it does not score.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from ablate.errors import ConfigError, UserCodeError
from ablate.rewards import calls, resolve
from ablate.rollouts.generation import Completions
from ablate.rollouts.turns import Toolbox, environment_reward
from ablate.schema import refusal
from ablate.schema.grpo import reward_weights_problem

RewardFunc = Callable[..., list[float | None]]


def reward_table(
    reward_funcs: dict[str, RewardFunc],
    tokenizer: PreTrainedTokenizerBase,
    rows: list[dict[str, Any]],
    completion_ids: list[list[int]],
    warned: set[str] | None = None,
    messages: list[list[dict[str, Any]]] | None = None,
    environments: list[Any] | None = None,
) -> torch.Tensor:
    """(N, F) rewards of N completions, one column per function, None -> NaN: TRL's call (prompts,
    completions as text or as an assistant message, completion_ids, and every other dataset column), what
    the functions return held to its contract by ablate.rewards.calls (a user's mistake: one line). With
    tools (GRPO), each completion is its `messages` (turns and tool results) and `environments` are passed
    too, one instance per row (TRL's)."""
    texts = tokenizer.batch_decode(completion_ids, skip_special_tokens=True)
    prompts = [r["prompt"] for r in rows]
    completions = messages or [
        t if isinstance(p, str) else [{"role": "assistant", "content": t}] for p, t in zip(prompts, texts)
    ]
    columns = {k: [r[k] for r in rows] for k in rows[0] if k not in ("prompt", "prompt_ids")}
    if environments is not None:
        columns["environments"] = environments
    kwargs = dict(prompts=prompts, completions=completions, completion_ids=completion_ids, **columns)
    return calls.table(reward_funcs, kwargs, len(rows), set() if warned is None else warned)


def gather(
    reward_funcs: Any, weights: list[float] | None, toolbox: Toolbox | None
) -> tuple[dict[str, RewardFunc], list[float]]:
    """The run's reward functions by name and their weights (see the module docstring)."""
    funcs = calls.usable(reward_funcs)  # any form; data.reward_funcs.NAME=null drops one
    env = toolbox.reward_name if toolbox is not None else None
    if not funcs and env is None:
        raise ConfigError(
            f"GRPO needs reward functions: {resolve.SHORT_FORM}, or a task that has them "
            "(e.g. data=tiny_repeat); docs/methods.md"
        )
    problem = reward_weights_problem(weights, list(funcs))  # the config's check, on the functions handed over
    if problem is not None:
        raise ConfigError(refusal(*problem))
    weights = list(weights or [1.0] * len(funcs))
    if env is not None:
        funcs[env], weights = environment_reward(type(toolbox.pool[0])), weights + [1.0]
    return funcs, weights


def ready(funcs: dict[str, RewardFunc], dataset: Any, toolbox: Toolbox | None, device: Any) -> None:
    """Each function can take the data's columns (one line naming it, before the first round); a reward
    model scores on `device` (ablate.rewards.RewardModel.to)."""
    columns = [c for c in getattr(dataset, "column_names", None) or [] if c not in ("prompt", "prompt_ids")]
    if toolbox is not None and toolbox.environment is not None:
        columns.append("environments")
    for name, fn in funcs.items():
        if (problem := calls.column_problem(fn, columns)) is not None:
            raise UserCodeError(f"reward function '{name}' ({calls.name_of(fn)}) {problem}")
        if callable(getattr(fn, "to", None)):
            fn.to(device)


def table(
    funcs: dict[str, RewardFunc],
    rows: list[dict[str, Any]],
    out: Completions,
    tokenizer: Any,
    environments: list[Any] | None,
    warned: set[str],
) -> torch.Tensor:
    """(N, F) rewards of one round, NaN where a function does not score a completion (left out of its group's
    statistics): `reward_table`'s call, with each
    completion's messages when it has tool turns; `environments`: this round's, one per row, or None."""
    return reward_table(
        funcs, tokenizer, rows, out.ids, warned, messages=out.messages, environments=environments
    )


def check_advantages(advantages: torch.Tensor, aggregation: Any, step: int) -> None:
    """NaN/inf advantages (an aggregation of the user's, or rewards beyond what any dtype's arithmetic holds)
    as one line naming the step and the function that made them, before a loss is computed from them."""
    if not torch.isfinite(advantages).all():
        raise FloatingPointError(
            f"the advantages are NaN/inf at step {step}, made by method.grpo_reward_aggregation "
            f"({calls.name_of(aggregation)}) from this round's rewards: check its arithmetic "
            "and the rewards' scale"
        )
