"""ablate's structured configs as Hydra composes them: each node's schema dataclass (ablate.schema: a
method's `method.args`, the speed switches, every node that calls ablate's code with settings of its own)
as a typed node with the keys that make it instantiable (`_target_`, `_partial_`, `_recursive_`; a method's
arguments: the run's seed), served as `schema/<Class>` by hydra_plugins.ablate_schemas when a YAML selects
it (`- /schema@args: DPOArgs`, `- /schema@_here_: Adapters`). A field's type, default, help and check are
declared once, in Python; a YAML file selects its class and overrides only what differs or what it wires
to the rest of the config (GRPO's `max_completion_length: the data's`).

The node is typed (OmegaConf rejects `method.args.beta=abc` while composing: ablate.config.validate says
it in the schema's words) and closed: a TrainingArguments field the schema does not declare is added
with `+method.args.<field>=...`. No torch import here."""

from __future__ import annotations

import dataclasses
from typing import Any


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


def data_or_default(key: str, _parent_: Any, _root_: Any) -> Any:
    """`${ablate_data_or_default:KEY}` in a method's args: the data's KEY (data=calc_tools says its
    completions need 128 tokens), else the field's default in the args' schema."""
    from omegaconf import OmegaConf

    from ablate.schema import schema_for

    given = OmegaConf.select(_root_, f"data.{key}", default=None)
    if given is not None:
        return given
    # while Hydra merges the method's YAML, its node is not yet the schema's (no `_target_`): no default yet
    cls = schema_for("method.args", _parent_.get("_target_"))
    f = {f.name: f for f in dataclasses.fields(cls)}.get(key) if cls is not None else None
    if f is None:
        return None
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
