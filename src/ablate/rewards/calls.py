"""How GRPO calls the data's reward functions, and what it holds them to (TRL 1.16's contract). RLOO (GRPO's
trainer), distillation (rewards logged) and `ablate eval` make the same call
(ablate.rollouts.rewarding.reward_table).

A reward function is called as `f(prompts=..., completions=..., completion_ids=..., **dataset columns)`
(an `async def` one is awaited) and returns one reward per completion: a number, or None/NaN for a completion
it does not score (TRL's convention: left out of its group's statistics; the rewards of several functions are
summed over those that score, `nansum`). What a user's function gets wrong is one line naming it
(UserCodeError), its traceback in the run's log:

- before the run (ablate.config.code_checks): a signature that cannot take that call (`call_problem`);
- when the trainer is built: a required argument that is no column of the data (`column_problem`, `checked`);
- at each round (`score`): an exception; a scalar, a string or another type instead of a list; the wrong
  count; a value that is not a number; inf, or a number float32 cannot hold (it would make every advantage of
  its group NaN or 0: the run would learn nothing, silently); `sys.exit()` (it would end the run as a
  success).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ablate.errors import UserCodeError, log_file
from ablate.rewards import resolve

ARGUMENTS = ("prompts", "completions", "completion_ids")  # what GRPO passes besides the data's columns
CALL = "f(prompts=..., completions=..., completion_ids=..., **dataset columns)"
FLOAT32_MAX = 3.4028234663852886e38  # the largest float32: rewards are held as float32


def name_of(fn: Any) -> str:
    """`module.qualname` of a function, a partial of one, or a callable object's class."""
    fn = getattr(fn, "func", fn)
    obj = fn if inspect.isfunction(fn) or inspect.isclass(fn) or inspect.ismethod(fn) else type(fn)
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', repr(obj))}"


def _parameters(fn: Any) -> dict[str, inspect.Parameter] | None:
    try:
        return dict(inspect.signature(fn).parameters)
    except (TypeError, ValueError):  # a builtin without a signature: cannot tell
        return None


def call_problem(fn: Any) -> str | None:
    """Why `fn` cannot take GRPO's call (its three named arguments), or None when it can."""
    params = _parameters(fn)
    if params is None:
        return None
    var_kw = any(p.kind == p.VAR_KEYWORD for p in params.values())
    for name in ARGUMENTS:
        p = params.get(name)
        if p is None and not var_kw:
            return f"it takes no '{name}'"
        if p is not None and p.kind == p.POSITIONAL_ONLY:
            return f"its '{name}' is positional-only"
    only = [p.name for p in params.values() if p.kind == p.POSITIONAL_ONLY and p.default is p.empty]
    return f"it needs '{only[0]}' by position" if only else None


def column_problem(fn: Any, columns: Iterable[str]) -> str | None:
    """Why `fn` cannot take the data's `columns` too (a required argument that is none, or a column it
    does not take, without **kwargs), or None."""
    params, columns = _parameters(fn), list(columns)
    if params is None:
        return None
    for p in params.values():
        if (
            p.default is p.empty
            and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
            and p.name not in ARGUMENTS
            and p.name not in columns
        ):
            have = ", ".join(columns)
            return f"needs the column '{p.name}', which the data does not have (its columns: {have})"
    if not any(p.kind == p.VAR_KEYWORD for p in params.values()):
        extra = [c for c in columns if c not in params]
        if extra:
            return f"takes no '{extra[0]}', a column of the data it is given (add **kwargs)"
    return None


def score(name: str, fn: Callable[..., Any], n: int, kwargs: dict[str, Any], log: str) -> list[float]:
    """`fn(**kwargs)`'s rewards for `n` completions as floats (NaN: not scored), or UserCodeError:
    one line naming the function and what is wrong (`log`: where its traceback goes)."""
    who = f"reward function '{name}' ({name_of(fn)})"
    try:
        values = fn(**kwargs)
        if inspect.isawaitable(values):  # an `async def` reward function (TRL awaits them too)
            import asyncio

            values = asyncio.run(_awaited(values))
    except SystemExit as e:  # sys.exit(0) would end the run as a success, mid-round
        raise UserCodeError(
            f"{who} called sys.exit({e.code!r}): a reward function returns its rewards, one per "
            f"completion (traceback: {log})"
        ) from e
    except Exception as e:  # the user's code: any error is theirs, one line, the traceback logged
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise UserCodeError(
            f"{who} raised {type(e).__name__}{': ' + first if first else ''} (traceback: {log})"
        ) from e
    if isinstance(values, (str, bytes, dict)) or not isinstance(values, Sequence) and not _array(values):
        shown = repr(values) if len(repr(values)) <= 40 else repr(values)[:37] + "..."
        raise UserCodeError(
            f"{who} returned {_a(type(values).__name__)} ({shown}), not a list of one reward per completion"
        )
    values = list(values)
    if len(values) != n:
        raise UserCodeError(
            f"{who} returned {len(values)} rewards for {n} completions (one per completion, in order)"
        )
    return [_reward(who, i, v) for i, v in enumerate(values)]


async def _awaited(values: Any) -> Any:
    return await values


def _array(values: Any) -> bool:
    """A numpy array or torch tensor of one dimension (a sequence in all but its type)."""
    return hasattr(values, "tolist") and getattr(values, "ndim", 0) == 1


def _a(noun: str) -> str:
    return f"an {noun}" if noun[:1] in "aeiou" else f"a {noun}"


def _reward(who: str, i: int, v: Any) -> float:
    if v is None:
        return math.nan
    if isinstance(v, (str, bytes)) or not _number(v):
        raise UserCodeError(
            f"{who} returned {v!r} ({type(v).__name__}) for completion {i}: a reward is a number, "
            "or None for a completion it does not score"
        )
    x = float(v)
    if math.isinf(x):
        raise UserCodeError(
            f"{who} returned {x} for completion {i}: rewards must be finite (None or NaN: not scored)"
        )
    if abs(x) > FLOAT32_MAX:  # the round's reward table is float32 (TRL's): it would hold inf
        raise UserCodeError(
            f"{who} returned {x:.3g} for completion {i}: beyond float32's range ({FLOAT32_MAX:.2g}), "
            "which holds the rewards; scale them down"
        )
    return x


def _number(v: Any) -> bool:
    try:
        float(v)
    except (TypeError, ValueError):
        return False
    return not isinstance(v, (list, tuple, dict))


def table(funcs: dict[str, Callable[..., Any]], kwargs: dict[str, Any], n: int, warned: set[str]) -> Any:
    """The (n, F) reward table of one round, NaN where a function does not score a completion. A round
    that no function scores at all trains on nothing (every advantage 0): said once per run (`warned`)."""
    import torch

    log = log_file()
    out = torch.empty(n, len(funcs))
    for i, (name, fn) in enumerate(funcs.items()):
        out[:, i] = torch.tensor(score(name, fn, n, kwargs, log), dtype=torch.float32)
    if n and torch.isnan(out).all() and "unscored" not in warned:
        warned.add("unscored")
        import logging

        logging.getLogger("ablate").warning(
            "no reward function scored any of this round's %d completions (all None or NaN): the round "
            "trains on nothing (every advantage is 0); said once",
            n,
        )
    return out


def checked(funcs: dict[str, Any] | None, dataset: Any) -> dict[str, Any]:
    """The usable functions of `funcs`, each held to `dataset`'s columns (`column_problem`): known when a
    trainer or an eval is built, before the first round."""
    funcs = usable(funcs)
    columns = [c for c in getattr(dataset, "column_names", None) or [] if c not in ("prompt", "prompt_ids")]
    for name, fn in funcs.items():
        if (problem := column_problem(fn, columns)) is not None:
            raise UserCodeError(f"reward function '{name}' ({name_of(fn)}) {problem}")
    return funcs


def usable(funcs: Any) -> dict[str, Any]:
    """The reward functions a config lists, by name, in any form `data.reward_funcs` takes (the short form's
    dotted paths too, `[myrew.short]`: ablate.rewards.resolve), without the ones set to null
    (`data.reward_funcs.NAME=null` removes one, as `callbacks.NAME=null` does)."""
    if funcs is None or isinstance(funcs, str):
        return resolve.reward_funcs(funcs)
    if isinstance(funcs, (list, tuple)) or type(funcs).__name__ == "ListConfig":
        return resolve.reward_funcs([f for f in funcs if f is not None])
    return resolve.reward_funcs({k: f for k, f in funcs.items() if f is not None})
