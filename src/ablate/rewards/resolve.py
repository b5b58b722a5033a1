"""User functions named by a dotted path: GRPO's reward functions in their short form
(`data.reward_funcs=[myrew.short]`), tools (`method.args.tools=[calc.add]`) and environments.

`locate("myrew.short", key)` imports the module part from the import path as Python would and, failing
that, from the current directory (where the user runs `ablate`, next to their data): a `myrew.py` there
needs no PYTHONPATH. The directory is appended to `sys.path`, last, so an installed package of the same
name still wins. A name that cannot be found is one line naming the key, the form and where it looked.

No torch import here.
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ablate.errors import ConfigError
from ablate.schema import grpo as grpo_schema

RewardFunc = Callable[..., list]
SHORT_FORM = grpo_schema.SHORT_FORM  # the short form, as the config's refusals spell it


def in_cwd(top: str) -> Path | None:
    """`top.py` or the package `top/` in the current directory, if there is one."""
    here = Path.cwd()
    return next((p for p in (here / f"{top}.py", here / top / "__init__.py") if p.is_file()), None)


def import_module(name: str) -> Any:
    """`importlib.import_module`, looking in the current directory when the import path has no such module."""
    top = name.split(".")[0]
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name != top or in_cwd(top) is None:
            raise
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.append(cwd)  # last: installed packages keep their names
    importlib.invalidate_caches()
    return importlib.import_module(name)


def locate(path: str, key: str) -> Any:
    """The object a dotted path names (`pkg.mod.fn`, `mod.Class`): the longest importable module prefix, then
    attributes. ConfigError (one line) when it cannot be found."""
    parts = str(path).strip().split(".")
    if len(parts) < 2 or not all(p.isidentifier() for p in parts):
        raise ConfigError(
            f"{key}={path}: not a dotted path MODULE.NAME (e.g. "
            "myrew.short for the function short in myrew.py)"
        )
    module, error, n = None, None, 0
    for n in range(len(parts) - 1, 0, -1):
        name = ".".join(parts[:n])
        try:
            module = import_module(name)
            break
        except ModuleNotFoundError as e:  # a shorter prefix may be the module (pkg.mod.Class.method)
            error = e
            if e.name != name and not name.startswith(f"{e.name}."):  # the module imports something missing
                raise ConfigError(f"{key}={path}: importing {name} failed: {e}") from e
        except Exception as e:  # the user's module raised on import (a typo in it): one line
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            raise ConfigError(f"{key}={path}: importing {name} failed: {type(e).__name__}: {first}") from e
    if module is None:
        top = parts[0]
        raise ConfigError(
            f"{key}={path}: no module '{top}' on the import path or in the current directory "
            f"({os.getcwd()}); put {top}.py there (or pip install it)"
        ) from error
    obj = module
    for i, attr in enumerate(parts[n:], start=n):
        if not hasattr(obj, attr):
            raise ConfigError(f"{key}={path}: {'.'.join(parts[:i])} has no '{attr}'")
        obj = getattr(obj, attr)
    return obj


def function(value: Any, key: str) -> Callable[..., Any]:
    """A callable from config: a dotted path, a `{_target_: path, ...}` node (its other keys bound, as
    `_partial_: true` would), or a callable already (a Hydra-instantiated one, a function passed in code)."""
    if callable(value):
        return value
    if isinstance(value, str):
        obj = locate(value, key)
    elif _is_mapping(value) and "_target_" in value:
        target = locate(str(value["_target_"]), f"{key}._target_")
        kwargs = {k: v for k, v in dict(value).items() if not str(k).startswith("_")}
        obj = functools.partial(target, **kwargs) if kwargs else target
    else:
        raise ConfigError(
            f"{key}: expected a dotted path to a function (MODULE.FUNCTION) or {{_target_: "
            f"MODULE.FUNCTION}}, got {value!r}"
        )
    if not callable(obj):
        raise ConfigError(f"{key}: {value} is not callable")
    return obj


def environment(value: Any, key: str) -> Callable[[], Any]:
    """An environment class (or factory) from config, checked to be callable with no arguments: TRL's
    environment_factory makes one instance per rollout that way, the config's other keys bound first."""
    import inspect

    factory = function(value, key)
    try:
        params = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: cannot tell
        return factory
    needs = [
        p.name for p in params if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]
    if needs:
        target = value.get("_target_") if _is_mapping(value) else value
        named = target if isinstance(target, str) else name_of(factory)
        raise ConfigError(
            f"{key}: {named} needs {', '.join(repr(n) for n in needs)}, which TRL's environment_factory "
            f"never passes (one instance per rollout, made with no arguments): set it in the config, "
            f"{key}.{needs[0]}=..., or give it a default"
        )
    return factory


def reward_funcs(value: Any, key: str = "data.reward_funcs") -> dict[str, RewardFunc]:
    """A data config's reward functions as `{name: function}`, from any of the forms ablate accepts:
    a list of dotted paths (`[myrew.short]`: named after the function), a mapping name -> dotted path
    (`+data.reward_funcs.short=myrew.short`) or name -> `{_target_: ..., _partial_: true}` node (or the
    function Hydra made of it)."""
    if value is None:
        return {}
    if isinstance(value, str):
        value = [value]
    if _is_mapping(value):
        return {str(name): function(v, f"{key}.{name}") for name, v in dict(value).items()}
    if isinstance(value, (list, tuple)) or type(value).__name__ == "ListConfig":
        out: dict[str, RewardFunc] = {}
        for i, v in enumerate(value):
            fn = function(v, f"{key}[{i}]")
            name = name_of(fn)
            if name in out:
                raise ConfigError(
                    f"{key}: two reward functions named '{name}'; name them: "
                    f"+data.reward_funcs.NAME=MODULE.FUNCTION"
                )
            out[name] = fn
        return out
    raise ConfigError(f"{key}: expected a list of reward functions, {SHORT_FORM}, got {value!r}")


def name_of(fn: Any) -> str:
    """A function's name in metrics (`rewards/<name>/mean`): its __name__, its partial's or its class's."""
    inner = getattr(fn, "func", fn)
    return getattr(inner, "__name__", None) or type(inner).__name__


def _is_mapping(value: Any) -> bool:
    return isinstance(value, dict) or type(value).__name__ == "DictConfig"
