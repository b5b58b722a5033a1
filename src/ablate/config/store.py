"""Each method's `method.args` as a Hydra structured config: its schema dataclass (ablate.schema.args,
.grpo, .methods) stored in Hydra's ConfigStore as `schema/<Class>`, so a field's type, default, help and
check are declared once, in Python. A method's YAML selects its class (`- /schema@args: DPOArgs`) and
overrides only what it wires to the rest of the config (GRPO's `max_completion_length: the data's`).

The node is typed (OmegaConf rejects `method.args.beta=abc` while composing: ablate.config.validate says
it in the schema's words) and closed: a TrainingArguments field the schema does not declare is added
with `+method.args.<field>=...`. No torch import here."""

from __future__ import annotations

import dataclasses
from typing import Any

GROUP = "schema"


def method_schemas() -> list[type]:
    """Every method's arguments schema (the classes a method's config class subclasses)."""
    from ablate.schema import Schema, schema_for

    schema_for("")  # imports the schema modules: each registers itself
    return sorted({c for c in Schema.by_target.values() if c.node == "method.args"}, key=lambda c: c.__name__)


def node(cls: type) -> Any:
    """`cls` as Hydra composes it: its fields, typed, with the keys that make it an instantiable node and
    the run's seed."""
    from omegaconf import OmegaConf, open_dict

    out = OmegaConf.structured(cls)
    with open_dict(out):
        out["_target_"] = cls.targets[0]  # the method's config class (DPOConfig: DPOArgs + TrainingArguments)
        out["_recursive_"] = cls.recursive
        out["seed"] = "${seed}"  # Trainer's seed (heads' init, dropout): the run's
        out["data_seed"] = "${seed}"  # the data's order: the run's seed
    return out


def register() -> None:
    """Store every method schema in Hydra's ConfigStore (once per process)."""
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    if GROUP in store.repo and len(store.repo[GROUP]) == len(method_schemas()):
        return
    for cls in method_schemas():
        store.store(group=GROUP, name=cls.__name__, node=node(cls))


def data_or_default(key: str, _parent_: Any) -> Any:
    """`${ablate_data_or_default:KEY}` in a method's args: the data's KEY (data=calc_tools says its
    completions need 128 tokens), else the field's default in the args' schema."""
    from omegaconf import OmegaConf

    from ablate.schema import schema_for

    given = OmegaConf.select(_parent_._get_root(), f"data.{key}", default=None)
    if given is not None:
        return given
    # while Hydra merges the method's YAML, its node is not yet the schema's (no `_target_`): no default yet
    cls = schema_for("method.args", _parent_.get("_target_"))
    f = {f.name: f for f in dataclasses.fields(cls)}.get(key) if cls is not None else None
    if f is None:
        return None
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
