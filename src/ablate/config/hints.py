"""What a config mistake is called, in one line: Hydra's composition errors (a key the node does not declare,
an option not in its group, a typed field's wrong value) in the words of the schema or the option that was
probably meant, and where a key written in the wrong place really is (`max_steps=5`: method.args.max_steps),
read from typed facts, never from the wording of Hydra's messages. Also how a config node is read as written
(`raw`, `children`), on OmegaConf's public API. No torch import here."""

from __future__ import annotations

import difflib
import sys
from pathlib import Path
from typing import Any

from hydra.errors import HydraException
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from ablate.errors import chain, missing_extra
from ablate.schema import show


def at(cfg: DictConfig, key: str, default: Any = None) -> Any:
    return OmegaConf.select(cfg, key, default=default)


def hydra_node() -> Any:
    from hydra.core.hydra_config import HydraConfig

    return HydraConfig.get() if HydraConfig.initialized() else None


def raw(node: Any, key: Any) -> Any:
    """`node[key]` as written (an interpolation as its text, `???` as it is), or None when it is not there."""
    if isinstance(node, DictConfig) and key not in node:
        return None
    return (
        OmegaConf.to_container(node, resolve=False)[key]
        if isinstance(node, (DictConfig, ListConfig))
        else None
    )


def children(node: Any) -> list[tuple[Any, Any]]:
    """A mapping's (key, value) or a list's (index, item), each a value of its own: not `???`, not null, not
    an interpolation of another node (whose own path walks it)."""
    keys = list(node.keys()) if isinstance(node, DictConfig) else range(len(node))
    return [
        (k, node[k])
        for k in keys
        if not OmegaConf.is_missing(node, k)
        and not OmegaConf.is_interpolation(node, k)
        and node[k] is not None
    ]


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
    return (
        f"{key} is not used: the optimizer group builds the optimizer and its schedule "
        f"(Trainer's own {field_} is ignored); use {OPTIMIZER_FIELDS[field_].format(v=show(value))}"
    )


def elsewhere(cfg: DictConfig, key: str, value: Any = "...") -> str | None:
    """For a key that is not where it was written (`max_steps=5`, `method.args.lr=1e-3`): the full
    paths where a key of that name is in the composed config, as "'max_steps' is method.args.max_steps:
    write method.args.max_steps=5"; None when there is none (a typo: the caller suggests a close name)."""
    leaf = key.rsplit(".", 1)[-1]
    found = [path for path in _paths(cfg) if path.rsplit(".", 1)[-1] == leaf and path != key]
    if not found:
        return None
    group = _group_behind(cfg, found[0])
    if group is not None:  # method.trainer.scale_rewards: ${..grpo_scale_rewards}, a group's node
        name = value if str(value).isidentifier() else "NAME"
        return (
            f"'{leaf}' is picked by the config group {group}: write {group}={name} (options: conf/{group}/)"
        )
    return (
        f"'{leaf}' is {' or '.join(found[:3])}: write {found[0]}={show(value) if value != '...' else value}"
    )


def _group_behind(cfg: DictConfig, path: str) -> str | None:
    """The config group (`method/grpo_scale_rewards`) whose node the key at `path` interpolates
    (`${..grpo_scale_rewards}`, `${speed}`), or None."""
    import re

    from ablate.paths import conf_dir

    parent, _, leaf = path.rpartition(".")
    node = OmegaConf.select(cfg, parent, default=None) if parent else cfg
    written = raw(node, leaf)
    ref = re.fullmatch(r"\$\{(\.*)([\w.]+)\}", str(written)) if isinstance(written, str) else None
    if ref is None:
        return None
    dots, target = ref.groups()
    base = parent.split(".") if parent else []
    base = base[: len(base) - len(dots) + 1] if dots else []
    group = "/".join([*base, *target.split(".")])
    return group if (Path(conf_dir()) / group).is_dir() else None


def _paths(node: Any, prefix: str = "") -> list[str]:
    """Every key's full path in `node` (Hydra's own node and `_target_`s left out), values not resolved."""
    out: list[str] = []
    if isinstance(node, DictConfig):
        for k in node.keys():
            if (k == "hydra" and not prefix) or str(k).startswith("_"):
                continue
            out.append(f"{prefix}{k}")
            if not OmegaConf.is_interpolation(node, k) and not OmegaConf.is_missing(node, k):
                out += _paths(node[k], f"{prefix}{k}.")
    return out


def os_error_line(e: OSError) -> str:
    """`PermissionError: [Errno 13] ...` as what to fix: the file, what went wrong, and the usual fix."""
    what = e.strerror or type(e).__name__
    where = f"{e.filename}: " if e.filename else ""
    fix = ""
    if isinstance(e, PermissionError):
        fix = " (check its permissions, and those of the folders above it: ls -ld)"
    elif e.errno == 28:  # ENOSPC
        fix = " (free some space, or write elsewhere: hydra.run.dir=...)"
    return f"{where}{what.lower() if what[:1].isupper() and what[1:2].islower() else what}{fix}"


def one_line(e: BaseException, overrides: list[str] | None = None) -> str | None:
    """The user-facing line for a config/composition error, or None for anything else (a bug). Read from typed
    facts only: the exception's class and public attributes (OmegaConf's `full_key`, `object_type`, Hydra's
    `options`, `override`), the overrides as Hydra's override parser reads them (`overrides`: the command's,
    by default those on its command line) and the config composed without the refused one."""
    from hydra.errors import ConfigCompositionException, MissingConfigException, OverrideParseException
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, ConfigTypeError, ValidationError

    from ablate.errors import USER_ERRORS

    for cause in chain(e, context=False):
        if isinstance(cause, USER_ERRORS):
            return str(cause).splitlines()[0] if str(cause) else type(cause).__name__
    line = bad_config_file(e)
    if line is not None:
        return line
    if isinstance(e, OverrideParseException):
        key, _, value = str(e.override).partition("=")
        if "~" in value:  # a home path: Hydra's grammar has no unquoted ~ (and ablate expands it)
            return (
                f"cannot parse the override '{e.override}': Hydra reads '~' only inside quotes: write "
                f"'{key}=\"{value}\"' (single quotes outside, for the shell), or "
                f"{key}=$HOME{value.lstrip('~')}"
            )
        return f"cannot parse the override '{e.override}': {str(e).splitlines()[0]}"
    if isinstance(e, MissingConfigException):
        return _missing_option(e)
    given = _parsed(_argv_overrides() if overrides is None else overrides)
    omega = next((c for c in chain(e) if isinstance(c, OmegaConfBaseException) and c.full_key), None)
    if isinstance(omega, ValidationError) and _schema_of(omega) is not None:
        line = _schema_type(omega, given)
        if line is not None:
            return line
    if isinstance(omega, ConfigTypeError) and isinstance(e, ConfigCompositionException):
        line = _merge_mismatch(omega, given)
        if line is not None:
            return line
    if isinstance(omega, (ConfigAttributeError, ConfigKeyError)) and (
        isinstance(e, ConfigCompositionException) or _schema_of(omega) is not None
    ):  # a key the node does not declare, in an override or a config file
        return _unknown_key(omega, given, overrides)
    if isinstance(e, ConfigCompositionException) and omega is None:
        line = _already_declared(given, overrides) or _group_not_in_config(given, overrides)
        if line is not None:
            return line
    if isinstance(e, (HydraException, OmegaConfBaseException)):
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
        return " ".join(lines[:3]) if lines else type(e).__name__
    return None


def _argv_overrides() -> list[str]:
    """The overrides on this command's line (`ablate train KEY=VALUE ...`), its flags left out."""
    return [a for a in sys.argv[1:] if "=" in a and not a.startswith("-")]


def _parsed(overrides: list[str]) -> list[Any]:
    """`overrides` as Hydra's override parser reads them (key or group, value, add/delete), each alone: one
    it cannot parse is left out (Hydra refused the command for that one already)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    parser, out = OverridesParser.create(), []
    for line in overrides:
        try:
            out += parser.parse_overrides([line])
        except OverrideParseException:
            continue
    return out


def _text(o: Any) -> str:
    """An override's value as the user wrote it (`[a.b]`, `1e-3`)."""
    return str(o.input_line).partition("=")[2]


def _override_of(given: list[Any], key: str) -> Any:
    """The override that sets `key` or a key under it (`a.b._target_=` for the node `a.b`), or None."""
    for o in given:
        if not o.is_delete() and (o.key_or_group == key or o.key_or_group.startswith(f"{key}.")):
            return o
    return None


def _schema_of(cause: BaseException) -> Any:
    """The schema class of the typed node an OmegaConf error is about (ablate.config.compose), or None."""
    from ablate.schema import Schema

    cls = getattr(cause, "object_type", None)
    return cls if isinstance(cls, type) and issubclass(cls, Schema) else None


def _schema_type(c: Any, given: list[Any]) -> str | None:
    """`method.args.beta=abc`: OmegaConf refuses a value of the wrong type for a schema's typed field while
    composing; the answer is the schema's own line for that field (`must be a number > 0`), with the value
    the override gave (a config file's value is not known here: the line names the field)."""
    from ablate.schema import ABSENT, refusal

    cls = _schema_of(c)
    rule = cls.__dataclass_fields__.get(str(c.key))
    rule = rule.metadata.get("check") if rule is not None else None
    if rule is None:
        return None
    o = _override_of(given, str(c.full_key))
    value = ABSENT if o is None or o.key_or_group != c.full_key or o.is_sweep_override() else o.value()
    words = rule.words(cls.of({}), str(c.full_key).rpartition(".")[0])
    return refusal(str(c.full_key), value, words if value is not ABSENT else f"must be {words}")


def _merge_mismatch(c: Any, given: list[Any]) -> str | None:
    """`key=[a,b]` over a mapping (or `key={...}` over a list): OmegaConf cannot merge the two. The remedy is
    to replace the node whole (`~key` then `+key=`); a mapping of reward functions also takes one more."""
    o = _override_of(given, str(c.full_key))
    if o is None or o.key_or_group != c.full_key or o.is_sweep_override():
        return None
    key, value, text = c.full_key, o.value(), _text(o)
    override = f"{o.input_line}"
    if isinstance(value, dict):
        return (
            f"{override}: {key} is a list here, which a mapping cannot be merged into: replace it whole, "
            f"'~{key}' '+{key}={text}'"
        )
    if not isinstance(value, list):
        return None
    if key == "data.reward_funcs":  # name -> function: one more beside the data's own
        first = str(value[0]) if value else ""
        add = f"add yours, +{key}.{first.rsplit('.', 1)[-1]}={first}, or " if first else ""
        return (
            f"{override}: {key} is a mapping here (name -> function), which a list cannot be merged into: "
            f"{add}replace them all, '~{key}' '+{key}={text}'"
        )
    return (
        f"{override}: {key} is a mapping here, which a list cannot be merged into: "
        f"replace it whole, '~{key}' '+{key}={text}'"
    )


def _already_declared(given: list[Any], overrides: list[str] | None) -> str | None:
    """`+seed=1`: an override that adds a key the config already has (Hydra adds only a new one)."""
    from hydra.core.override_parser.types import OverrideType

    for o in given:
        if o.type != OverrideType.ADD or _is_group(o.key_or_group):
            continue
        composed, absent = composed_without(o.key_or_group, overrides), object()
        found = OmegaConf.select(composed, o.key_or_group, default=absent, throw_on_resolution_failure=False)
        if found is not absent:  # `+notes=...` too, whose default is null
            key = o.key_or_group
            return (
                f"+{key}: {key} is already a key of this config (its default is declared): set it without "
                f"the +, {key}={_text(o)}"
            )
    return None


def _is_group(key: str) -> bool:
    """`key` names a config group of conf/ (method/dpo_loss), not a key of the config."""
    from ablate.paths import conf_dir

    return (Path(conf_dir()) / key).is_dir()


def bad_config_file(e: BaseException) -> str | None:
    """A config file (conf/, a sweep config, --config-dir) that is not YAML or not UTF-8."""
    import yaml

    for c in chain(e):
        if isinstance(c, yaml.MarkedYAMLError):
            mark = c.problem_mark or c.context_mark
            where = (
                f"{mark.name} line {mark.line + 1}, column {mark.column + 1}"
                if mark is not None
                else "a config file"
            )
            return f"{where}: not valid YAML ({c.problem or c.context})"
        if isinstance(c, UnicodeDecodeError):
            return f"a config file is not UTF-8 text (byte 0x{c.object[c.start]:02x}); save it as UTF-8"
    return None


def _group_not_in_config(given: list[Any], overrides: list[str] | None) -> str | None:
    """`method=grpo method/dpo_loss=hinge`: an override of a config group that this config's defaults list
    does not have: name the options of the group's parent that pick it."""
    import re

    from hydra.core.override_parser.types import OverrideType

    from ablate.paths import conf_dir

    for o in given:
        group = o.key_or_group
        if o.type != OverrideType.CHANGE or not _is_group(group):
            continue
        choices = OmegaConf.select(composed_without(group, overrides, hydra=True), "hydra.runtime.choices")
        if choices is None or group in choices:  # not composed without it either: not the one refused
            continue
        parent, _, leaf = group.rpartition("/")
        users = (
            sorted(
                p.stem
                for p in (Path(conf_dir()) / parent).glob("*.yaml")
                if re.search(rf"^\s*-\s*(override\s+)?{leaf}\s*:", p.read_text(errors="replace"), re.M)
            )
            if parent
            else []
        )
        using = f" (options of {parent} that have it: {', '.join(users)})" if users else ""
        override = f"{group}={_text(o)}"
        return f"{override}: this config has no config group {group}{using}; to add it anyway: +{override}"
    return None


def _other_group(group: str, option: str) -> str | None:
    """A sibling group of `group` (conf/method/grpo_aggregation beside conf/method/dpo_loss) with `option`."""
    from ablate.paths import conf_dir

    parent = (Path(conf_dir()) / group).parent
    found = sorted(
        p.parent.name for p in parent.glob(f"*/{option}.yaml") if p.parent.name != Path(group).name
    )
    return f"{Path(group).parent.as_posix()}/{found[0]}" if found else None


def _missing_option(e: Any) -> str:
    missing = str(getattr(e, "missing_cfg_file", "") or "")
    group, _, option = missing.rpartition("/")
    if missing.startswith("hydra/launcher/submitit"):
        return missing_extra("hydra_plugins.hydra_submitit_launcher", "slurm", "hydra/launcher=slurm").args[0]
    options = list(getattr(e, "options", None) or [])
    if not group or not options:
        return str(e).splitlines()[0]
    hint = difflib.get_close_matches(option, options, n=1)
    meant = f"did you mean {group}={hint[0]}? " if hint else ""
    other = _other_group(group, option) if "/" in group else None
    if other is not None:  # method/dpo_loss=dapo: an option of method/grpo_aggregation
        meant = f"{option} is an option of {other}: {other}={option}; "
    return f"no option '{option}' in config group '{group}' ({meant}options: {', '.join(options)})"


def composed_without(key: str, overrides: list[str] | None = None, hydra: bool = False) -> DictConfig:
    """The config this command composes (`hydra`: with Hydra's node), without its override of `key` (the one
    refused): the config in which `elsewhere` looks for a key of that name (an empty one when even that cannot
    be composed)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from ablate.paths import conf_dir

    kept = [o.input_line for o in _parsed(_argv_overrides() if overrides is None else overrides)]
    kept = [line for line, o in zip(kept, _parsed(kept)) if o.key_or_group != key]
    try:
        GlobalHydra.instance().clear()  # Hydra's app that refused the override is done with it
        with initialize_config_dir(config_dir=conf_dir(), version_base="1.3"):
            return compose("config", overrides=kept, return_hydra_config=hydra)
    except Exception:  # another mistake among the overrides: no hint, the line stands
        return OmegaConf.create({})


def _unknown_key(cause: Any, given: list[Any], overrides: list[str] | None) -> str:
    """A key its node does not declare (OmegaConf's `full_key`; the override's own key where it sets a key
    under a node that has none: `method.trainer.generator._target_`)."""
    o = _override_of(given, str(cause.full_key))
    key = o.key_or_group if o is not None else str(cause.full_key)
    value = _text(o) if o is not None else "..."
    # method.args.warmup_steps: the optimizer group's, not a typo of max_steps
    hint = optimizer_field_hint(key)
    if hint is not None:
        return hint
    leaf = key.rsplit(".", 1)[-1]
    prefix = key[: -len(leaf)]
    composed = composed_without(key, overrides)
    parent = cause.parent_node if key == cause.full_key else OmegaConf.select(composed, prefix.rstrip("."))
    known = [str(k) for k in parent.keys()] if isinstance(parent, DictConfig) else []
    there = elsewhere(composed, key, value) if isinstance(parent, DictConfig) else None
    if there is not None:  # `max_steps=5`: the key exists, under another node (before a close name here)
        return f"unknown config key '{key}': {there}"
    hint = difflib.get_close_matches(leaf, known, n=1)
    if hint:
        return f"unknown config key '{key}' (did you mean '{prefix}{hint[0]}'?)"
    if not known and prefix:  # method.trainer.generator: null here
        return f"unknown config key '{key}' ('{prefix.rstrip('.')}' has no keys here)"
    return (
        f"unknown config key '{key}'; known under '{prefix.rstrip('.') or '<root>'}': {', '.join(known)}"
        f" (to add a new field on purpose: +{key}=...)"
    )
