"""The composed config's checks that need no code of the method (no torch): every node against its
schema (ablate.schema), `???` fields, unknown root keys, TrainingArguments fields the optimizer group
replaces, `_target_`s and the optional packages they need, data and model paths, the datasets cache.
`check(cfg)` raises ConfigError for the first mistake, in one line."""

from __future__ import annotations

import difflib
import importlib.util
import os
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from ablate.config.targets import check_target
from ablate.errors import ConfigError, missing_extra
from ablate.schema import refusal, schema_for, show

# `_target_` prefix -> (import name, extra): optional packages, installed by `pip install 'ablate[extra]'`.
EXTRAS: dict[str, tuple[str, str]] = {
    "bitsandbytes.": ("bitsandbytes", "quant"),
    "transformers.BitsAndBytesConfig": ("bitsandbytes", "quant"),
    "ablate.logger.wandb.": ("wandb", "wandb"),
    "ablate.rollouts.vllm.": ("vllm", "vllm"),
}
# hydra.launcher._target_ prefix -> (import name, extra, the override that chose it)
LAUNCHER_EXTRAS: dict[str, tuple[str, str, str]] = {
    "hydra_plugins.ablate_launchers.ray_launcher.": ("ray", "ray", "hydra/launcher=ray"),
}
# the same for the multirun's sweeper (the study's sweeper imports optuna only when it starts)
SWEEPER_EXTRAS: dict[str, tuple[str, str, str]] = {
    "hydra_plugins.ablate_sweepers.optuna_sweeper.": ("optuna", "optuna", "hydra/sweeper=optuna (a study)"),
}


def check(cfg: DictConfig, hc: Any = None, swept: frozenset[str] = frozenset()) -> None:
    """Raise ConfigError for the first mistake visible in the composed config `cfg`; `hc` is the
    hydra node (`cfg.hydra` when Hydra's callbacks pass the full config, else HydraConfig.get()).
    `swept`: keys a multirun sweeps, whose value in `cfg` is not what any job gets (not checked)."""
    if hc is None:
        hc = cfg.hydra if "hydra" in cfg else hydra_node()
    try:
        _check(cfg, hc, swept)
    except OmegaConfBaseException as e:  # e.g. ${oc.env:UNSET}
        key = getattr(e, "full_key", None)
        raise ConfigError(f"{key + ': ' if key else ''}{str(e).splitlines()[0]}") from None


def _check(cfg: DictConfig, hc: Any, swept: frozenset[str]) -> None:
    _check_extras(cfg)  # first: the other checks may import modules that probe the optional packages
    _check_targets(cfg)
    _check_missing(cfg, hc, swept)
    _check_root_keys(cfg, hc)
    _check_optimizer_args(cfg)
    _check_schemas(cfg, swept)
    _check_paths(cfg)
    _check_datasets_cache(cfg)
    _check_cache_dir(cfg)
    _check_reward_funcs(cfg, swept)
    _check_eval_data(cfg, swept)


def _check_schemas(cfg: DictConfig, swept: frozenset[str]) -> None:
    """Each node that has a schema (its `_target_`'s, else its path's), with the node's own values and
    its relations to the rest of the config; a key a multirun sweeps is not what any job gets."""
    for path, node in _nodes(cfg):
        schema = schema_for(path, node._get_node("_target_")._value() if "_target_" in node else None)
        if schema is None:
            continue
        found = schema.of({k: _value(node, k) for k in schema.__dataclass_fields__ if k in node})
        for key, value, what in [*found.problems(path), *found.relations(cfg)]:
            if key not in swept:
                raise ConfigError(refusal(key, value, what))


def _value(node: DictConfig, key: str) -> Any:
    """`node[key]` resolved, a list or mapping as plain Python."""
    v = node[key]
    return OmegaConf.to_container(v, resolve=True) if isinstance(v, (DictConfig, ListConfig)) else v


def _nodes(node: DictConfig, path: str = "") -> list[tuple[str, DictConfig]]:
    """Every mapping node of the config with its dotted path (the root: ""), Hydra's own left out."""
    out = [(path, node)]
    for k in node.keys():
        child = node._get_node(k)
        if isinstance(child, DictConfig) and not (k == "hydra" and not path) and not child._is_missing() \
                and not child._is_none():
            out += _nodes(child, f"{path}.{k}" if path else str(k))
    return out


def _check_targets(cfg: DictConfig) -> None:
    """Every `_target_` can be found (moved, misspelt, a module not on PYTHONPATH): ablate.config.targets."""
    for key, target in _targets(cfg):
        check_target(key, target)


def _check_optimizer_args(cfg: DictConfig) -> None:
    args = at(cfg, "method.args")
    if isinstance(args, DictConfig) and at(cfg, "optimizer.optimizer") is not None:
        for k in args:
            hint = optimizer_field_hint(f"method.args.{k}", args._get_node(k)._value())
            if hint:
                raise ConfigError(hint)


def _check_reward_funcs(cfg: DictConfig, swept: frozenset[str]) -> None:
    """GRPO with no reward function (data=local has none; `data.reward_funcs.NAME=null` drops one) has
    nothing to learn from. Each function's own contract: ablate.config.code_checks, ablate.rewards.calls."""
    funcs = at(cfg, "data.reward_funcs")
    trainer = at(cfg, "method.trainer")
    given = trainer._get_node("reward_funcs")._value() if isinstance(trainer, DictConfig) and "reward_funcs" in trainer else None
    grpo = str(at(cfg, "method.args._target_", "")).endswith("GRPOConfig")
    if not grpo or any(k.startswith(("data", "method.trainer")) for k in swept) \
            or not str(given).startswith("${oc.select:data.reward_funcs"):
        return  # not GRPO, swept, or the trainer given its rewards some other way
    add = "+data.reward_funcs.NAME._target_=pkg.module.fn +data.reward_funcs.NAME._partial_=true"
    if not isinstance(funcs, DictConfig) or not len(funcs):
        data = at(cfg, "hydra.runtime.choices.data") or OmegaConf.select(hydra_node(), "runtime.choices.data", default="")
        raise ConfigError(f"data.reward_funcs: GRPO needs a reward function, and data={data or '...'} has none: add "
                          f"yours ({add}), or use data that scores itself (data=tiny_repeat)")
    if not any(v is not None for v in funcs.values()):
        raise ConfigError(f"data.reward_funcs: GRPO needs a reward function, and every entry is null "
                          f"({', '.join(map(str, funcs))}); keep one, or add yours: {add}")


def _check_eval_data(cfg: DictConfig, swept: frozenset[str]) -> None:
    """Evaluation asked for, with data whose loader (a known one) has no eval split."""
    strategy = at(cfg, "method.args.eval_strategy")
    data = at(cfg, "data")
    if strategy in (None, "no") or "method.args.eval_strategy" in swept or not isinstance(data, DictConfig):
        return
    target = str(data.get("_target_", ""))
    # data=local: a save_to_disk dir as train_path may bring its own eval split
    local = ("eval_path", lambda: data.get("eval_path") is None and not Path(str(data.get("train_path"))).expanduser().is_dir())
    missing = {"ablate.data.local": local, "ablate.data.jsonl": local,
               "ablate.data.hub": ("eval_split", lambda: data.get("eval_split") is None),
               "ablate.data.packaged": ("with_eval", lambda: not data.get("with_eval", True) or not _packaged_eval(data))}
    if target in missing and missing[target][1]():
        field_ = missing[target][0]
        fix = "data.with_eval=true" if field_ == "with_eval" else f"data.{field_}=..."
        raise ConfigError(f"method.args.eval_strategy={strategy} but the data has no eval split: add {fix}, "
                          f"or leave evaluation off (method.args.eval_strategy=no)")


def _packaged_eval(data: DictConfig) -> bool:
    return (Path(__file__).resolve().parents[1] / "data" / "tiny" / f"{data.get('name')}_eval.jsonl").is_file()


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
    added = {str(o).lstrip("+").split("=")[0].split(".")[0] for o in overrides if str(o).startswith("+")}
    known = _known_roots(hc)
    for root in sorted(added - known):
        if root in cfg:
            hint = difflib.get_close_matches(root, sorted(known - {"hydra"}), n=1)
            meant = f"did you mean '{hint[0]}'?" if hint else f"known keys: {', '.join(sorted(known - {'hydra'}))}"
            raise ConfigError(f"unknown root key '{root}' (nothing reads it; {meant})")


def _check_paths(cfg: DictConfig) -> None:
    """Data files and a local model dir exist (checked before the model is loaded)."""
    data = cfg.get("data") or {}
    for key in ("train_path", "eval_path"):
        path = data.get(key) if isinstance(data, DictConfig) else None
        local = Path(path).expanduser() if isinstance(path, str) else None
        if local is not None and not local.is_file() and not _saved_dataset(local):
            what = ("is a directory but no save_to_disk dataset (no dataset_dict.json or state.json)"
                    if local.is_dir() else "not found")
            raise ConfigError(f"data.{key}={path}: {what}")
        if isinstance(path, str) and not os.access(Path(path).expanduser(), os.R_OK):
            raise ConfigError(f"data.{key}={path}: not readable (permission denied); check its permissions (ls -l)")
    model = cfg.get("model") or {}
    path = model.get("path") if isinstance(model, DictConfig) else None
    if isinstance(path, str) and path.startswith(("/", ".", "~")) or (isinstance(path, str) and Path(path).exists()):
        local = Path(path).expanduser()
        if not (local / "config.json").is_file() and not (local / "adapter_config.json").is_file():  # a +peft run's model/ loads too
            why = "not found" if not local.exists() else "no config.json there"
            raise ConfigError(f"model.path={path} is not a save_pretrained directory ({why})")


DATA_LOADERS = ("ablate.data.local", "ablate.data.jsonl", "ablate.data.packaged", "ablate.data.hub")  # through datasets' cache


def _check_datasets_cache(cfg: DictConfig) -> None:
    """`datasets` writes every file it loads into its cache: a read-only HOME would fail the run after
    its dir exists, in words about the data files. Where the cache goes is datasets' own rule."""
    if str(at(cfg, "data._target_", "")) not in DATA_LOADERS:
        return
    env = os.environ
    home = env.get("HF_HOME") or os.path.join(env.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "huggingface")
    cache = Path(env.get("HF_DATASETS_CACHE") or os.path.join(home, "datasets")).expanduser()
    existing = cache
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not os.access(existing, os.W_OK | os.X_OK):
        where = "" if existing == cache else f" ({existing} is not writable)"
        raise ConfigError(f"the datasets cache {cache} cannot be written{where}: data files are cached there; set "
                          f"HF_DATASETS_CACHE (or HF_HOME) to a writable folder, e.g. HF_DATASETS_CACHE=/tmp/hf_datasets")


def _check_cache_dir(cfg: DictConfig) -> None:
    """The reuse cache's dir (`cache.dir`, else under $ABLATE_CACHE) is not under a file: the run would
    go on without its cache, saying so at each lookup, and with no cached speed probe either."""
    from ablate.paths import cache_root

    given = at(cfg, "cache.dir")
    for key, path in (("cache.dir", given), ("ABLATE_CACHE", os.environ.get("ABLATE_CACHE"))):
        above = Path(str(path)).expanduser() if path else None
        while above is not None and not above.exists() and above != above.parent:
            above = above.parent
        if above is not None and above.exists() and not above.is_dir():
            where = "" if above == Path(str(path)).expanduser() else f" ({above} is a file)"
            raise ConfigError(f"{key}={path} is a file, not a directory{where}: the cache needs a directory of its own"
                              f" (unset it for the default, {cache_root() if key == 'cache.dir' else '~/.cache/ablate'})")


def _saved_dataset(path: Path) -> bool:
    """A `save_to_disk` dir (data=local reads it)."""
    return (path / "dataset_dict.json").is_file() or (path / "state.json").is_file()


def _targets(node: Any, prefix: str = "") -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    if isinstance(node, DictConfig):
        for k in node.keys():
            if k == "hydra" and not prefix:
                continue
            v = node._get_node(k)
            if k == "_target_":
                out.append((prefix + "_target_", str(node[k])))
            elif isinstance(v, DictConfig):
                out += _targets(v, f"{prefix}{k}.")
    return out


def _check_extras(cfg: DictConfig) -> None:
    for key, target in _targets(cfg):
        for prefix, (module, extra) in EXTRAS.items():
            if target.startswith(prefix) and not installed(module):
                raise missing_extra(module, extra, f"{key}={target}")


def check_launcher(hc: Any) -> None:
    """The multirun's launcher (or sweeper) needs an optional package that is missing: one line naming the extra."""
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


# TrainingArguments fields that ablate's optimizer group replaces (ablate.methods.optim builds the
# optimizer and schedule from `optimizer`): set in method.args they would be silently ignored.
OPTIMIZER_FIELDS = {
    "learning_rate": "optimizer.optimizer.lr={v}",
    "weight_decay": "optimizer.optimizer.weight_decay={v}",
    "adam_beta1": "'optimizer.optimizer.betas=[{v},0.999]'",
    "adam_beta2": "'optimizer.optimizer.betas=[0.9,{v}]'",
    "adam_epsilon": "+optimizer.optimizer.eps={v}",
    "optim": "optimizer=adamw|adamw_8bit|sgd (conf/optimizer/)",
    "optim_args": "optimizer.optimizer.<field>=... (the optimizer's own arguments)",
    "lr_scheduler_type": "optimizer/scheduler=constant|cosine|step (conf/optimizer/scheduler/)",
    "lr_scheduler_kwargs": "optimizer.scheduler.<field>=... (the schedule's own arguments)",
    "warmup_ratio": "optimizer.scheduler.warmup_ratio={v} (the cosine schedule)",
    "warmup_steps": "optimizer/scheduler=constant optimizer.scheduler.warmup_steps={v}, or "
                    "optimizer.scheduler.warmup_ratio=... (cosine)",
}


def optimizer_field_hint(key: str, value: Any = "...") -> str | None:
    """For `method.args.learning_rate` and the like: what to write instead (the optimizer group)."""
    field_ = key.rsplit(".", 1)[-1]
    if not key.startswith("method.args.") or field_ not in OPTIMIZER_FIELDS:
        return None
    return (f"{key} is not used: the optimizer group builds the optimizer and its schedule "
            f"(Trainer's own {field_} is ignored); use {OPTIMIZER_FIELDS[field_].format(v=show(value))}")


def hydra_node() -> Any:
    from hydra.core.hydra_config import HydraConfig

    return HydraConfig.get() if HydraConfig.initialized() else None


def at(cfg: DictConfig, key: str, default: Any = None) -> Any:
    return OmegaConf.select(cfg, key, default=default)
