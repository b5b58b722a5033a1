"""Rollouts over several turns: generate, run the tool calls, append their results, generate again
(TRL 1.16's `_tool_call_loop`, the same token layout), around any generator (`GenerateFn`).

`ToolGenerator` wraps the generator GRPO would use anyway (the shared-prompt generator, `model.generate`,
vLLM), so every engine gets tools the same way:

    turn 1    prompt -> c1                          (all rows; c1 ends at the end-of-turn id)
    calls     rows whose c1 holds calls: run them; r1 = the template's tokens for the results
    turn 2    prompt + c1 + r1 -> c2                (those rows only, each its own prompt)
    ...       until no row calls a tool, or max_tool_calling_iterations turns of calls
    result    completion = c1 + r1 + c2 + ...,  tool_mask = 1 on c*, 0 on r*

As TRL: a row whose results would take the completion past `max_completion_length`, or the whole
sequence to the model's context length, leaves the loop with its completion as it is (those results
dropped); a continuation is cut so the completion fits `max_completion_length`; an engine's per-token
log-probs (vLLM) and the sampler's own (async GRPO's worker) are 0 on result tokens, which the loss
never reads (tool_mask). Counts per row: calls made and calls failed (`tools/call_frequency` = calls per
completion, `tools/failure_frequency` = failed / made, TRL's names and definitions).

Environments (`method.args.environment`, TRL's `environment_factory` contract): a class whose instances
each hold one rollout's state. `start(rows)` gives every row its own instance (a pool reused across rounds,
`reset(**row)` each time, as TRL: construct once, reset often); `reset` may return text, appended to the
prompt's last message (the prompt is then tokenized again for that row). The instance's public methods
(not `reset`, not `get_reward`) are that row's tools, beside `method.args.tools`; `get_reward()`, when the
class has one, scores the finished episode (a reward column named after the class, weight 1, as TRL), and
every reward function receives `environments=` (one instance per completion).
"""

from __future__ import annotations

import inspect
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ablate.errors import ConfigError
from ablate.rollouts.generation import Completions, GenerateFn, as_completions, stop_ids
from ablate.rollouts.tool_calls import ToolFormat, call, schema

ENV_CONTROL = ("reset", "get_reward")  # an environment's methods that are not tools (TRL's)


def environment_tools(env: Any) -> list[Callable[..., Any]]:
    """An environment instance's tools: its class's public functions but reset/get_reward, bound to it, by
    name (TRL's `inspect.getmembers(type(env), inspect.isfunction)`; on the class: properties not
    evaluated)."""
    return [
        getattr(env, name)
        for name, _ in inspect.getmembers(type(env), predicate=inspect.isfunction)
        if name not in ENV_CONTROL and not name.startswith("_")
    ]


@dataclass
class Toolbox:
    """What a round's rollouts may call: `tools` (functions), an environment factory, and the format."""

    format: ToolFormat
    tools: list[Callable[..., Any]] = field(default_factory=list)
    environment: Callable[[], Any] | None = None  # a class or factory: one instance per rollout
    max_iterations: int | None = None  # turns of calls per rollout; None: until no call (TRL's default)
    timeout: float | None = None  # seconds per call; None: no limit
    # tokens of a result kept (ToolFormat.cut); None: no cut. Past the completion budget a result can never
    # fit (the rollout ends, TRL's), so a cut there changes nothing but the time spent tokenizing it
    max_result_tokens: int | None = None
    warned: bool = False  # a cut result said once
    # environment instances, reused across rounds (reset each time)
    pool: list[Any] = field(default_factory=list)
    schemas: list[dict[str, Any]] = field(default_factory=list)  # what the prompts offer

    def __post_init__(self) -> None:
        tools = list(self.tools)
        if self.environment is not None:
            probe = self.environment()
            if not callable(getattr(probe, "reset", None)):
                raise ConfigError(
                    f"method.args.environment: {type(probe).__name__} has no reset method (TRL's "
                    f"environment contract: reset(**row) -> str | None, its public methods the tools)"
                )
            self.pool.append(probe)
            tools += environment_tools(probe)
        names = [t.__name__ for t in tools]
        if len(set(names)) != len(names):
            raise ConfigError(
                f"method.args.tools: two tools named {next(n for n in names if names.count(n) > 1)}"
            )
        self.schemas = [schema(t, "method.args.tools") for t in tools]

    @property
    def reward_name(self) -> str | None:
        """The environment's reward column (its class name), when it scores episodes (`get_reward`)."""
        probe = self.pool[0] if self.pool else None
        return (
            type(probe).__name__
            if probe is not None and callable(getattr(probe, "get_reward", None))
            else None
        )

    def cut(self, name: str, content: str) -> tuple[str, bool]:
        """Tool `name`'s result cut to `max_result_tokens` (ToolFormat.cut), and whether it was; the first cut
        said once."""
        if self.max_result_tokens is None:
            return content, False
        kept, cut = self.format.cut(content, self.max_result_tokens)
        if cut and not self.warned:
            self.warned = True
            logging.getLogger("ablate").warning(
                "tool %s returned %d characters: cut to its first %d tokens (method.args."
                "max_tool_result_length; null: max_completion_length), as every result that long will be "
                "(tools/truncated_frequency counts them; said once)",
                name,
                len(content),
                self.max_result_tokens,
            )
        return kept, cut

    def prompt_ids(self, prompt: Any, index: int = 0) -> list[int]:
        return self.format.prompt_ids(prompt, self.schemas, index)


def build_toolbox(args: Any, tokenizer: PreTrainedTokenizerBase) -> Toolbox | None:
    """GRPO's tools from its arguments (`tool_functions()`, `environment_factory()`: GRPOConfig), or None
    when it has none."""
    tools, environment = args.tool_functions(), args.environment_factory()
    if not tools and environment is None:
        return None
    box = Toolbox(
        ToolFormat(tokenizer, args.tool_call_format),
        tools,
        environment,
        args.max_tool_calling_iterations,
        args.tool_timeout,
        args.max_tool_result_length or args.max_completion_length,
    )
    why = "the chat template's own" if box.format.native else "the chat template renders no tool calls"
    logging.getLogger("ablate").info(
        "GRPO tools: %s%s; tool_call_format=%s (%s)",
        ", ".join(s["function"]["name"] for s in box.schemas),
        f" (one {getattr(environment, '__name__', 'environment')} per rollout)"
        if environment is not None
        else "",
        box.format.kind,
        why,
    )
    return box


def turns_of(out: Completions) -> dict[str, Any]:
    """What a round with tool calls adds to its completions (for the async worker to send back), or {}."""
    if out.tool_mask is None:
        return {}
    return {
        "tool_mask": out.tool_mask,
        "messages": out.messages,
        "tool_calls": out.tool_calls,
        "tool_failures": out.tool_failures,
        "tool_truncated": out.tool_truncated,
    }


def environment_reward(cls: type) -> Callable[..., list[Any]]:
    """The reward function of environment class `cls`: each finished episode's `get_reward()` (TRL's, weight
    1), named `cls.get_reward` so that a mistake in it is one line naming the user's method
    (ablate.rewards.calls)."""

    def get_reward(environments: list[Any], **_: Any) -> list[Any]:
        return [env.get_reward() for env in environments]

    get_reward.__module__, get_reward.__qualname__ = cls.__module__, f"{cls.__qualname__}.get_reward"
    return get_reward


class ToolGenerator:
    """A `GenerateFn` running tool calls between turns of the generator it wraps (see the module docstring).
    `start(rows)` readies a round (environments reset) and returns its prompt ids."""

    def __init__(
        self,
        inner: GenerateFn,
        toolbox: Toolbox,
        tokenizer: PreTrainedTokenizerBase,
        max_completion_length: int,
    ) -> None:
        self.inner = inner
        self.toolbox = toolbox
        self.tokenizer = tokenizer
        self.max_completion_length = max_completion_length
        self.environments: list[Any] | None = None  # this round's, one per row (None: no environment)
        self.malformed: list[str | None] = []  # the last round's: why each row's last call could not be read
        if hasattr(inner, "sample"):
            self.sample = self._sample

    def __getattr__(self, name: str) -> Any:  # the engine's own attributes (vLLM's pushes, close ...)
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def start(self, rows: list[dict[str, Any]]) -> list[list[int]]:
        """Ready a round: one environment per row (reset with the row's columns, its text appended to the
        prompt's last message), and the rows' prompt ids (tokenized again where the environment added
        text)."""
        box = self.toolbox
        if box.environment is None:
            self.environments = None
            return [r["prompt_ids"] for r in rows]
        while len(box.pool) < len(rows):
            box.pool.append(box.environment())
        self.environments = box.pool[: len(rows)]
        out = []
        for i, (row, env) in enumerate(zip(rows, self.environments)):
            observation = env.reset(**{k: v for k, v in row.items() if k != "prompt_ids"})
            if observation is None:
                out.append(row["prompt_ids"])
                continue
            prompt = list(row["prompt"])
            prompt[-1] = {**prompt[-1], "content": prompt[-1]["content"] + observation}  # TRL: appended as is
            out.append(box.prompt_ids(prompt, i))
        return out

    def __call__(self, model: PreTrainedModel, prompt_ids: list[list[int]]) -> Completions:
        return self._turns(model, prompt_ids, lambda ids: as_completions(self.inner(model, ids)))

    def _sample(
        self, model: PreTrainedModel, prompt_ids: list[list[int]], policy_logps: bool = False
    ) -> Completions:
        return self._turns(
            model, prompt_ids, lambda ids: self.inner.sample(model, ids, policy_logps=policy_logps)
        )

    def _row_tools(self, i: int) -> dict[str, Callable[..., Any]]:
        tools = list(self.toolbox.tools)
        if self.environments is not None:
            tools += environment_tools(self.environments[i])
        return {t.__name__: t for t in tools}

    def _turns(
        self,
        model: PreTrainedModel,
        prompt_ids: list[list[int]],
        generate: Callable[[list[list[int]]], Completions],
    ) -> Completions:
        first = generate(prompt_ids)
        rollouts = [
            Rollout(
                list(p),
                list(c),
                engine=None if first.logps is None else list(first.logps[i]),
                policy=None if first.policy_logps is None else list(first.policy_logps[i]),
            )
            for i, (p, c) in enumerate(zip(prompt_ids, first.ids))
        ]
        box, stops = self.toolbox, stop_ids(self.tokenizer, model)
        # vLLM's, TRL's ceiling
        limit = min(
            getattr(getattr(model, "config", None), "max_position_embeddings", None) or sys.maxsize,
            getattr(self.inner, "engine_args", {}).get("max_model_len") or sys.maxsize,
        )
        pending = [i for i, r in enumerate(rollouts) if r.read(box, r.ids, r.prompt)]
        turns = 0
        while pending and turns < (box.max_iterations if box.max_iterations is not None else sys.maxsize):
            extended = {}
            for i in pending:
                r = rollouts[i]
                results = r.run(self._row_tools(i), box)
                suffix = box.format.suffix_ids(results, stops)
                whole = r.prompt + r.ids + suffix
                if len(whole) - len(r.prompt) > self.max_completion_length or len(whole) >= limit:
                    # TRL: the results are dropped, the rollout ends
                    del r.messages[len(r.messages) - len(results) :]
                    continue
                extended[i] = whole
            pending = list(extended)
            if not pending:
                break
            more = generate([extended[i] for i in pending])
            for j, i in enumerate(pending):
                r, whole = rollouts[i], extended[i]
                room = self.max_completion_length - (len(whole) - len(r.prompt))  # TRL: cut to the budget
                r.extend(
                    suffix=whole[len(r.prompt) + len(r.ids) :],
                    new=list(more.ids[j])[:room],
                    engine=None if more.logps is None else list(more.logps[j])[:room],
                    policy=None if more.policy_logps is None else list(more.policy_logps[j])[:room],
                )
            pending = [
                i
                for i in pending
                if rollouts[i].new_turn and rollouts[i].read(box, rollouts[i].new_turn, extended[i])
            ]
            turns += 1
        self.malformed = [
            r.malformed for r in rollouts
        ]  # the last turns' unreadable calls (`ablate generate`)
        return Completions(
            ids=[r.ids for r in rollouts],
            logps=[r.engine for r in rollouts] if first.logps is not None else None,
            policy_logps=[r.policy for r in rollouts] if first.policy_logps is not None else None,
            tool_mask=[r.mask for r in rollouts],
            messages=[r.messages for r in rollouts],
            tool_calls=[r.calls for r in rollouts],
            tool_failures=[r.failures for r in rollouts],
            tool_truncated=[r.truncated for r in rollouts],
        )


@dataclass
class Rollout:
    """One row's conversation as it grows: its completion ids (every turn and result), which of them the model
    wrote (`mask`), the messages read back, the calls waiting to run, the counts."""

    prompt: list[int]
    ids: list[int]
    engine: list[float] | None = None  # the engine's log-probs of `ids` (0 on results)
    policy: list[float] | None = None  # the sampler's own log-probs of `ids` (0 on results)
    mask: list[int] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)
    waiting: list[tuple[str, Any, str | None]] = field(default_factory=list)
    new_turn: list[int] = field(default_factory=list)  # the last turn's ids
    calls: int = 0
    failures: int = 0
    truncated: int = 0  # results cut to Toolbox.max_result_tokens
    malformed: str | None = None  # why the last turn's call could not be read (ToolFormat.read), if so

    def __post_init__(self) -> None:
        self.mask = [1] * len(self.ids)

    def read(self, box: Toolbox, turn: list[int], prefix: list[int]) -> bool:
        """Read the assistant turn `turn` (generated after `prefix`); whether it calls tools."""
        parsed = box.format.read(turn, prefix, box.schemas)
        self.messages.append(parsed.message)
        self.waiting = parsed.calls
        self.malformed = parsed.malformed
        return bool(parsed.calls)

    def run(self, tools: dict[str, Callable[..., Any]], box: Toolbox) -> list[dict[str, Any]]:
        """Run the waiting calls (TRL: each call counted, each error a failure); their `tool` messages, each
        result cut to `box.max_result_tokens` (counted, said once)."""
        results = []
        for name, arguments, error in self.waiting:
            result, failed = call(tools, name, arguments, error, box.timeout)
            self.calls += 1
            self.failures += failed
            content = result if isinstance(result, list) else str(result)
            if isinstance(content, str):
                content, cut = box.cut(name, content)
                self.truncated += cut
            results.append({"role": "tool", "name": name, "content": content})
        self.messages += results
        self.waiting = []
        return results

    def extend(
        self, suffix: list[int], new: list[int], engine: list[float] | None, policy: list[float] | None
    ) -> None:
        """Append the results' ids (mask 0) and the next turn (mask 1)."""
        self.ids += suffix + new
        self.mask += [0] * len(suffix) + [1] * len(new)
        if self.engine is not None and engine is not None:
            self.engine += [0.0] * len(suffix) + engine
        if self.policy is not None and policy is not None:
            self.policy += [0.0] * len(suffix) + policy
        self.new_turn = new


def tool_metrics(
    calls: list[int], failures: list[int], truncated: list[int] | None = None
) -> dict[str, torch.Tensor]:
    """TRL's: calls per completion, and the failed share of the calls made (0 when none was made); ablate's:
    the share of the results cut to method.args.max_tool_result_length."""
    made = sum(calls)
    return {
        "tools/call_frequency": torch.tensor(made / max(len(calls), 1)),
        "tools/failure_frequency": torch.tensor(sum(failures) / made if made else 0.0),
        "tools/truncated_frequency": torch.tensor(sum(truncated or []) / made if made else 0.0),
    }
