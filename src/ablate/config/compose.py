"""Composing a run's config: ablate's structured configs as Hydra's nodes (each node's schema dataclass,
ablate.schema: a method's `method.args`, the speed switches, every node that calls ablate's code with
settings of its own, as a typed node with the keys that make it instantiable, served as `schema/<Class>` by
hydra_plugins.ablate_schemas when a YAML selects it: `- /schema@args: DPOArgs`, `- /schema@_here_: Adapters`;
a field's type, default, help and check are declared once, in Python, and a YAML selects its class and
overrides only what differs or what it wires to the rest of the config), Hydra's resolvers for run-dir names,
the launch time every process of one launch shares, and override values quoted for Hydra's grammar.

A node is typed (OmegaConf rejects `method.args.beta=abc` while composing; ablate.config.hints says it in the
schema's words) and closed: a TrainingArguments field the schema does not declare is added with
`+method.args.<field>=...`. No torch import here: `ablate train --cfg job` composes and prints in about a
second.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import re
from datetime import datetime
from typing import Any

UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")  # a run dir's name holds letters, digits and . _ - only: shell-safe
SLUG_LIMIT = 60  # characters of overrides in a run dir's name (its hash suffix aside)


def dirname_suffix(overrides: str, limit: int = SLUG_LIMIT) -> str:
    """A run dir's name after its time (a sweep job's: after its number), from Hydra's override_dirname
    (`k=v,k2=v2`, sorted): short, readable and shell-safe. Each override as `<its key's last part>-<value>`
    (`method.args.max_steps=400` -> `max_steps-400`, `method/dpo_loss=ipo` -> `dpo_loss-ipo`), those whose
    key has no `.` (group choices, seed) first, joined by `_`,
    brackets and quotes dropped, any other character as `_`, cut to `limit` characters, then `-` and 8 hex
    digits of the overrides' sha1: names shortened alike (`a.beta=1`, `b.beta=1`) stay apart. The overrides
    themselves are in run.json."""
    if not overrides:
        return ""
    from ablate.record.secrets import mask_text

    parts: list[tuple[bool, str]] = []
    for item in _items(mask_text(overrides)):  # `+model.token=hf_...` must not name a directory
        key, sep, value = item.partition("=")
        short = re.split(r"[./]", key.lstrip("+~"))[-1]
        parts.append(("." in key, f"{short}-{value}" if sep else short))
    # choices (seed=1, method/dpo_loss=ipo) first
    joined = "_".join(p for _, p in sorted(parts, key=lambda p: p[0]))
    slug = UNSAFE.sub("_", re.sub(r"[][{}'\"]", "", joined))[:limit].strip("_.-")  # brackets, quotes dropped
    digest = hashlib.sha1(overrides.encode()).hexdigest()[:8]
    return f"_{slug}-{digest}" if slug else f"_{digest}"


def _items(overrides: str) -> list[str]:
    """Hydra's override_dirname split into its overrides: at commas outside brackets, braces and quotes
    (`data.reward_funcs=[a.f,b.g],seed=1` is two)."""
    items, depth, quote, start = [], 0, "", 0
    for i, ch in enumerate(overrides):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "[{(":
            depth += 1
        elif ch in "]})":
            depth = max(depth - 1, 0)
        elif ch == "," and depth == 0:
            items.append(overrides[start:i])
            start = i + 1
    return [*items, overrides[start:]]


LAUNCH_TIME_ENV = "ABLATE_LAUNCH_TIME"


def _launch_time() -> datetime:
    """When this run was launched. Every process of one launch must name the same dirs, yet each
    composes its own config: a multirun's job processes (joblib workers, SLURM jobs) inherit the
    launching process's time in ABLATE_LAUNCH_TIME (set by `publish_launch_time`); torchrun ranks
    share their launcher (the torchrun agent, their parent process), whose start time is the same
    for all of them; several nodes' agents are not one process: the user exports the same value on each."""
    if os.environ.get(LAUNCH_TIME_ENV):  # ISO (what publish_launch_time writes) or Unix seconds (`date +%s`)
        value = os.environ[LAUNCH_TIME_ENV].strip()
        return (
            datetime.fromtimestamp(float(value))
            if value.replace(".", "", 1).isdigit()
            else datetime.fromisoformat(value)
        )
    if "TORCHELASTIC_RUN_ID" in os.environ:
        import psutil

        return datetime.fromtimestamp(psutil.Process(os.getppid()).create_time())
    return datetime.now()


@functools.lru_cache(maxsize=1)
def _launched() -> datetime:
    return _launch_time()


def publish_launch_time() -> None:
    """Hand this process's launch time to the processes it starts from now on (a multirun's
    jobs), so `${ablate_now:...}` in hydra.sweep.dir resolves to the same folder in all of them."""
    os.environ[LAUNCH_TIME_ENV] = _launched().isoformat()


def register_resolvers() -> None:
    """ablate's resolvers: what any composition of conf/ needs first (its structured configs are served by
    hydra_plugins.ablate_schemas, as each is selected)."""
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver("ablate_dirname"):
        OmegaConf.register_new_resolver("ablate_dirname", dirname_suffix)
    if not OmegaConf.has_resolver("ablate_now"):  # like Hydra's ${now:fmt}, the same for every rank
        OmegaConf.register_new_resolver("ablate_now", lambda fmt: _launched().strftime(fmt))
    if not OmegaConf.has_resolver("ablate_div"):  # GRPO's prompts per batch: completions / num_generations
        OmegaConf.register_new_resolver("ablate_div", lambda a, b: max(int(a) // int(b), 1))


def quote_override_value(value: str) -> str:
    """`value` as one quoted value of Hydra's override grammar: run-dir names hold `=` and `,`, a cwd
    may hold spaces or quotes. Inside single quotes only a quote, and backslashes before a quote or
    the closing quote, are escaped (hydra/grammar/OverrideLexer.g4, QUOTED_VALUE)."""
    return "'" + re.sub(r"(\\*)('|$)", lambda m: m.group(1) * 2 + ("\\'" if m.group(2) else ""), value) + "'"


def method_schemas() -> list[type]:
    """Every method's arguments schema (the classes a method's config class subclasses)."""
    from ablate.schema import Schema, schema_for

    schema_for("")  # imports the schema modules: each registers itself
    return sorted((c for c in Schema.declared if c.node == "method.args"), key=lambda c: c.__name__)


def stored() -> list[type]:
    """The schemas Hydra composes from: each with a `_target_` and a default for every field (a method's
    arguments, the speed switches, the nodes of ablate.schema.models, .losses, .nodes)."""
    from ablate.schema import ABSENT, Schema, schema_for

    schema_for("")  # imports the schema modules: each registers itself
    return sorted(
        {
            c
            for c in Schema.declared
            if c.targets and all(f.default is not ABSENT for f in dataclasses.fields(c))
        },
        key=lambda c: c.__name__,
    )


def node(cls: type) -> Any:
    """`cls` as Hydra composes it: its fields, typed, with the keys that make it an instantiable node (a
    method's arguments: and the run's seed)."""
    from omegaconf import OmegaConf, open_dict

    out = OmegaConf.structured(cls)
    if not getattr(cls, "targets", None):  # a node of values only (data.columns)
        return out
    OmegaConf.set_readonly(out, None)  # a frozen dataclass (SpeedSwitches) is still overridden by the config
    with open_dict(out):
        out["_target_"] = cls.targets[0]  # DPOArgs: DPOConfig (DPOArgs + TrainingArguments)
        if cls.partial is not None:
            out["_partial_"] = cls.partial
        if cls.recursive is not None:
            out["_recursive_"] = cls.recursive
        if cls.node == "method.args":
            out["seed"] = "${seed}"  # Trainer's seed (heads' init, dropout): the run's
            out["data_seed"] = "${seed}"  # the data's order: the run's seed
        for name in cls.from_data:  # the data's value where it has one, else the field's own default
            default = cls.__dataclass_fields__[name].default
            out[name] = f"${{oc.select:data.{name},{'null' if default is None else default}}}"
    return out


def user_node(cls: type) -> Any:
    """A user's config class (`my_dpo.MyDPOConfig`, a subclass of DPOConfig) as Hydra composes it:
    the node of the ablate schema it inherits, its own fields added with their defaults, `_target_` the
    user's class. Served by hydra_plugins.ablate_schemas."""
    from omegaconf import open_dict

    from ablate.errors import ConfigError

    base = next((c for c in cls.__mro__ if c in method_schemas()), None)
    if base is None or not dataclasses.is_dataclass(cls):
        raise ConfigError(
            f"schema/{cls.__module__}.{cls.__qualname__}: not a subclass of an ablate method config "
            f"({', '.join(c.__name__ for c in method_schemas())} or their config classes)"
        )
    inherited = {
        f.name for c in cls.__mro__[1:] if dataclasses.is_dataclass(c) for f in dataclasses.fields(c)
    }
    own = [f for f in dataclasses.fields(cls) if f.name not in inherited or f.name in cls.__dict__]
    out = node(base)
    with open_dict(out):
        for f in own:
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            out[f.name] = None if default is dataclasses.MISSING else default
        out["_target_"] = f"{cls.__module__}.{cls.__qualname__}"
    return out


def function_node(fn: Any) -> Any:
    """A user's function (`- /schema@_here_: my_losses.margin_sigmoid`, a loss with a setting of its own) as
    Hydra composes it: a typed node of its keyword settings, whose defaults are the function's own (its
    one source) and whose checks are its annotations' (`margin: Annotated[float, Ge(0)] = 0.5`), `_target_`
    the function, `_partial_` true (the trainer calls it with the rest). Served by ablate_schemas."""
    from ablate.schema import from_signature

    return node(from_signature(fn))
