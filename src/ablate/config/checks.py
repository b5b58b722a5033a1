"""The composed config's checks that need no code of the method (no torch): every node against its
schema (ablate.schema), `???` fields, unknown root keys, TrainingArguments fields the optimizer group
replaces, `_target_`s and the optional packages they need; the data's files (ablate.config.data_checks).
`check(cfg)` raises ConfigError for the first mistake, in one line."""

from __future__ import annotations

import difflib
import importlib.util
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from ablate.config import data_checks
from ablate.config.hints import at, children, elsewhere, hydra_node, optimizer_field_hint, raw
from ablate.config.targets import check_target
from ablate.errors import ConfigError, missing_extra
from ablate.schema import refusal, schema_for

# `_target_` prefix -> (import name, extra): optional packages, installed by `pip install 'ablate[extra]'`.
EXTRAS: dict[str, tuple[str, str]] = {
    "bitsandbytes.": ("bitsandbytes", "quant"),
    "transformers.BitsAndBytesConfig": ("bitsandbytes", "quant"),
    "ablate.logger.wandb.": ("wandb", "wandb"),
    "ablate.rollouts.vllm.": ("vllm", "vllm"),
    "ablate.rollouts.server.": ("vllm", "vllm"),  # the trainer's side of the weight transfer is vLLM's
    "ablate.evaluation.harness.": ("lm_eval", "eval"),  # eval=lm_eval: lm-evaluation-harness
}
# hydra.launcher._target_ prefix -> (import name, extra, the override that chose it)
LAUNCHER_EXTRAS: dict[str, tuple[str, str, str]] = {
    "hydra_plugins.ablate_launchers.ray_launcher.": ("ray", "ray", "hydra/launcher=ray")
}
# the same for the multirun's sweeper (the study's sweeper imports optuna only when it starts)
SWEEPER_EXTRAS: dict[str, tuple[str, str, str]] = {
    "hydra_plugins.ablate_sweepers.optuna_sweeper.": ("optuna", "optuna", "hydra/sweeper=optuna (a study)")
}


def check(
    cfg: DictConfig, hc: Any = None, swept: frozenset[str] = frozenset(), packages: bool = True
) -> None:
    """Raise ConfigError for the first mistake visible in the composed config `cfg`; `hc` is the
    hydra node (`cfg.hydra` when Hydra's callbacks pass the full config, else HydraConfig.get()).
    `swept`: keys a multirun sweeps, whose value in `cfg` is not what any job gets (not checked).
    `packages`: the optional packages the config needs are installed (`ablate plan` says which instead)."""
    if hc is None:
        hc = cfg.hydra if "hydra" in cfg else hydra_node()
    try:
        if packages:  # first: the other checks may import modules that probe the optional packages
            for key, target, module, extra in needed_packages(cfg):
                if not installed(module):
                    raise missing_extra(module, extra, f"{key}={target}")
        _check(cfg, hc, swept, packages)
    except OmegaConfBaseException as e:  # e.g. ${oc.env:UNSET}
        key = getattr(e, "full_key", None)
        raise ConfigError(f"{key + ': ' if key else ''}{str(e).splitlines()[0]}") from None


def _check(cfg: DictConfig, hc: Any, swept: frozenset[str], packages: bool = True) -> None:
    _check_targets(cfg, packages)
    _check_missing(cfg, hc, swept)
    _check_root_keys(cfg, hc)
    _check_optimizer_args(cfg)
    about_data = _check_schemas(cfg, swept)
    data_checks.check_paths(cfg)
    data_checks.check_data_columns(cfg, swept)
    data_checks.check_data_rows(cfg, swept)
    if about_data:  # a method's relation to the data, judged once the data itself passed (a mix of kinds)
        raise about_data[0]
    data_checks.check_teacher(cfg, hc, swept)
    data_checks.check_datasets_cache(cfg)
    data_checks.check_cache_dir(cfg)
    data_checks.check_eval_data(cfg, swept)


def _check_schemas(cfg: DictConfig, swept: frozenset[str]) -> list[ConfigError]:
    """Each node that has a schema (its `_target_`'s, else its path's), with the node's own values and
    its relations to the rest of the config; a key a multirun sweeps is not what any job gets. A
    relation that is about the data (`data.*`, e.g. GRPO's reward functions) is returned, for after the
    data's own checks."""
    about_data = []
    for path, node in _nodes(cfg):
        schema = schema_for(path, raw(node, "_target_"))
        if schema is None:
            continue
        found = schema.of({k: _value(node, k) for k in schema.__dataclass_fields__ if k in node})
        for key, value, what in [*found.problems(path), *found.relations(cfg)]:
            if key not in swept and not any(s.startswith(key + ".") for s in swept):
                if key.startswith("data.") and not path.startswith("data"):
                    about_data.append(ConfigError(refusal(key, value, what)))
                    continue
                raise ConfigError(refusal(key, value, what))
    return about_data


def _value(node: DictConfig, key: str) -> Any:
    """`node[key]` resolved, a list or mapping as plain Python."""
    v = node[key]
    return OmegaConf.to_container(v, resolve=True) if isinstance(v, (DictConfig, ListConfig)) else v


def _nodes(node: DictConfig, path: str = "") -> list[tuple[str, DictConfig]]:
    """Every mapping node of the config with its dotted path (the root: ""), Hydra's own left out; a
    mapping in a list too (`data.reward_funcs[0]`: a reward model's node, found by its `_target_`)."""
    out = [(path, node)]
    for k, child in children(node):
        at = f"{path}.{k}" if path else str(k)
        if k == "hydra" and not path:
            continue
        if isinstance(child, DictConfig):
            out += _nodes(child, at)
        elif isinstance(child, ListConfig):
            out += [
                n
                for i, item in children(child)
                if isinstance(item, DictConfig)
                for n in _nodes(item, f"{at}[{i}]")
            ]
    return out


def _check_targets(cfg: DictConfig, packages: bool = True) -> None:
    """Every `_target_` can be found (moved, misspelt, a module not on PYTHONPATH): ablate.config.targets; so
    can every function named by its dotted path alone (the short form: data.reward_funcs=[myrew.short],
    tools). Without `packages`, those of the optional packages are not looked for."""
    for key, target in _targets(cfg) + _dotted_paths(cfg):
        if packages or not target.startswith(tuple(EXTRAS)):
            check_target(key, target)


def _dotted_paths(cfg: DictConfig) -> list[tuple[str, str]]:
    """The short-form entries (plain strings) of data.reward_funcs (a list, or a mapping name -> path) and
    method.args.tools."""
    out = []
    for key in ("data.reward_funcs", "method.args.tools"):
        node = OmegaConf.select(cfg, key, default=None, throw_on_resolution_failure=False)
        items = (
            node.items()
            if isinstance(node, DictConfig)
            else enumerate(node)
            if isinstance(node, ListConfig)
            else ()
        )
        out += [
            (f"{key}.{name}" if isinstance(node, DictConfig) else f"{key}[{name}]", v)
            for name, v in items
            if isinstance(v, str)
        ]
    return out


def _check_optimizer_args(cfg: DictConfig) -> None:
    args = at(cfg, "method.args")
    if isinstance(args, DictConfig) and at(cfg, "optimizer.optimizer") is not None:
        for k in args:
            hint = optimizer_field_hint(f"method.args.{k}", raw(args, k))
            if hint:
                raise ConfigError(hint)


def _check_missing(cfg: DictConfig, hc: Any, swept: frozenset[str]) -> None:
    """`???` fields (data=jsonl's train_path, model=local's path): name the group and the fix."""
    task = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"]) if "hydra" in cfg else cfg
    missing = sorted(set(OmegaConf.missing_keys(task)) - swept)
    if missing:
        key = missing[0]
        root = key.split(".")[0]
        choice = OmegaConf.select(hc, f"runtime.choices.{root}", default=None) if hc is not None else None
        group = f" ({root}={choice} needs it)" if choice else ""
        raise ConfigError(f"{key} is required{group}: add {key}=...")


def _known_roots(hc: Any) -> set[str]:
    """Root keys that come from ablate's config: the primary config's own keys and config groups."""
    from ablate.paths import conf_dir

    known = {"hydra"}
    known |= {str(k) for k in OmegaConf.load(Path(conf_dir()) / "config.yaml") if k != "defaults"}
    choices = OmegaConf.select(hc, "runtime.choices", default=None) or {}
    known |= {str(group).split("/")[0].split("@")[0] for group in choices}
    return known


def task_overrides(hc: Any) -> list[str] | None:
    """The task overrides as given (reading them through OmegaConf would resolve `${oc.env:...}`)."""
    node = OmegaConf.select(hc, "overrides.task", default=None) if hc is not None else None
    return None if node is None else [str(o) for o in OmegaConf.to_container(node, resolve=False)]


def _check_root_keys(cfg: DictConfig, hc: Any) -> None:
    """A `+key=value` at the root that is no config group (`+precison=bf16`) would compose as a plain
    value nothing reads, and the run would train without it: refuse it, naming the likely key."""
    overrides = task_overrides(hc)
    if overrides is None:
        return
    added = {
        str(o).lstrip("+").split("=")[0].split(".")[0]: str(o) for o in overrides if str(o).startswith("+")
    }
    known = _known_roots(hc)
    for root in sorted(set(added) - known):
        if root in cfg:
            hint = difflib.get_close_matches(root, sorted(known - {"hydra"}), n=1)
            given = added[root].lstrip("+")
            there = (
                elsewhere(cfg, given.split("=")[0], given.partition("=")[2])
                if "." not in given.split("=")[0]
                else None
            )
            meant = there or (
                f"did you mean '{hint[0]}'?"
                if hint
                else f"known keys: {', '.join(sorted(known - {'hydra'}))}"
            )
            raise ConfigError(f"unknown root key '{root}' (nothing reads it; {meant})")


def _targets(node: Any, prefix: str = "") -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    if isinstance(node, DictConfig):
        for k, v in children(node):
            if k == "hydra" and not prefix:
                continue
            if k == "_target_":
                out.append((prefix + "_target_", str(v)))
            elif isinstance(v, DictConfig):
                out += _targets(v, f"{prefix}{k}.")
    return out


def needed_packages(cfg: DictConfig) -> list[tuple[str, str, str, str]]:
    """The optional packages the config's `_target_`s need, installed or not: (key, target, import name,
    extra), each package once."""
    out: dict[str, tuple[str, str, str, str]] = {}
    for key, target in _targets(cfg):
        for prefix, (module, extra) in EXTRAS.items():
            if target.startswith(prefix):
                out.setdefault(module, (key, target, module, extra))
    return list(out.values())


def check_launcher(hc: Any) -> None:
    """The multirun's launcher (or sweeper) needs an optional package that is missing: one line naming the
    extra."""
    for key, extras in (("launcher._target_", LAUNCHER_EXTRAS), ("sweeper._target_", SWEEPER_EXTRAS)):
        target = str(OmegaConf.select(hc, key, default="") or "")
        for prefix, (module, extra, what) in extras.items():
            if target.startswith(prefix) and not installed(module):
                raise missing_extra(module, extra, what)


def installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False
