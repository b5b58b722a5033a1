"""Bad input gets one line naming what to fix, before anything is built or any run dir is touched.

- `check(cfg)`: the composed config: required fields, value types and ranges, unknown root keys,
  data/model paths, the optional packages a `_target_` needs. Raises `ConfigError`.
- `Validate`, a Hydra callback (conf/config.yaml `hydra.callbacks`): runs `check` and the run-dir
  checks in `on_run_start`, which Hydra calls after composing and *before* it creates the run dir or
  writes ablate.log into it, and takes the run dir's lock there; a mistake there leaves every
  existing dir as it was. A multirun job is checked by `ablate.train.run` instead (it fails, the
  sweep goes on); a multirun claims its sweep dir in `on_multirun_start` (`claim_sweep_dir`).
- `one_line(e)`: Hydra's multi-line composition errors ("not in struct", "Could not find
  'method/dpoo'") as one line that names the key or option that was probably meant.

Only the values ablate's own config defines are range-checked (RULES below); any other
TrainingArguments field is checked by TrainingArguments itself. No torch import here: this runs in
the launching process.
"""

from __future__ import annotations

import difflib
import importlib.util
import logging
import os
import re
import sys
from pathlib import Path
from typing import Any, Callable

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from ablate.errors import ConfigError, chain, missing_extra
from ablate.run.code_checks import (  # noqa: F401 - the run-time checks, imported from here by train and cli
    check_code,
    check_distributed,
    check_method_args,
    check_precision,
    check_trainable,
    check_trainer_class,
    has_accelerator,
    job_processes,
)
from ablate.run.rules import (
    RULES,
    at,
    elsewhere,
    hydra_node,
    optimizer_field_hint,
    refusal,
)
from ablate.run import data_checks, sweep_dirs
from ablate.run.targets import check_target

log = logging.getLogger(__name__)

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
    values = {key: OmegaConf.select(cfg, key, default=KeyError) for key in RULES}
    for key, (ok, what) in RULES.items():
        v = values[key]
        if v is not KeyError and key not in swept and not ok(v, cfg):
            raise ConfigError(refusal(key, v, what if isinstance(what, str) else what(cfg)))
    data_checks.check_paths(cfg)
    data_checks.check_data_columns(cfg, swept)
    data_checks.check_datasets_cache(cfg)
    data_checks.check_cache_dir(cfg)
    data_checks.check_reward_funcs(cfg, swept)
    data_checks.check_eval_data(cfg, swept)


def _check_targets(cfg: DictConfig) -> None:
    """Every `_target_` can be found (moved, misspelt, a module not on PYTHONPATH): ablate.run.targets; so can
    every function named by its dotted path alone (the short form: data.reward_funcs=[myrew.short], tools)."""
    for key, target in _targets(cfg) + _dotted_paths(cfg):
        check_target(key, target)


def _dotted_paths(cfg: DictConfig) -> list[tuple[str, str]]:
    """The short-form entries (plain strings) of data.reward_funcs (a list, or a mapping name -> path) and
    method.args.tools."""
    out = []
    for key in ("data.reward_funcs", "method.args.tools"):
        node = OmegaConf.select(cfg, key, default=None, throw_on_resolution_failure=False)
        items = node.items() if isinstance(node, DictConfig) else enumerate(node) if isinstance(node, ListConfig) else ()
        out += [(f"{key}.{name}" if isinstance(node, DictConfig) else f"{key}[{name}]", v)
                for name, v in items if isinstance(v, str)]
    return out


def _check_optimizer_args(cfg: DictConfig) -> None:
    args = at(cfg, "method.args")
    if isinstance(args, DictConfig) and at(cfg, "optimizer.optimizer") is not None:
        for k in args:
            hint = optimizer_field_hint(f"method.args.{k}", args._get_node(k)._value())
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


def _overrides(hc: Any) -> list[str] | None:
    """The task overrides as given (reading them through OmegaConf would resolve `${oc.env:...}`)."""
    node = OmegaConf.select(hc, "overrides.task", default=None) if hc is not None else None
    return None if node is None else [str(o) for o in OmegaConf.to_container(node, resolve=False)]


def _check_root_keys(cfg: DictConfig, hc: Any) -> None:
    """A `+key=value` at the root that is no config group (`+precison=bf16`) would compose as a plain
    value nothing reads, and the run would train without it: refuse it, naming the likely key."""
    overrides = _overrides(hc)
    if overrides is None:
        return
    added = {str(o).lstrip("+").split("=")[0].split(".")[0]: str(o) for o in overrides if str(o).startswith("+")}
    known = _known_roots(hc)
    for root in sorted(set(added) - known):
        if root in cfg:
            given = added[root].lstrip("+")
            there = elsewhere(cfg, given.split("=")[0], given.partition("=")[2]) if "." not in given.split("=")[0] else None
            hint = difflib.get_close_matches(root, sorted(known - {"hydra"}), n=1)
            meant = there or (f"did you mean '{hint[0]}'?" if hint else f"known keys: {', '.join(sorted(known - {'hydra'}))}")
            raise ConfigError(f"unknown root key '{root}' (nothing reads it; {meant})")


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


def check_dir(path: Path, key: str, create: bool = True) -> None:
    """`path` (hydra.run.dir / hydra.sweep.dir) is, or can be created as, a writable directory; with
    `create`, a missing one is created now (a failure is ours to report, and nothing existing is
    touched). Nothing is written into an existing dir (the write test is os.access)."""
    try:
        _check_dir(path, key, create)
    except OSError as e:  # e.g. a folder above it that cannot be searched (chmod 000)
        where = "" if str(e.filename) == str(path) else f"{e.filename}: "
        raise ConfigError(f"{key}={path}: {where}{os_error_line(e).split(': ', 1)[-1]}") from None


def _check_dir(path: Path, key: str, create: bool) -> None:
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{key}={path} is a file, not a directory")
    parent = path
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise ConfigError(f"{key}={path}: {parent} is a file, not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f"{key}={path}: {parent} is not writable")
    if parent != path and create:
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ConfigError(f"{key}={path}: cannot create it ({e.strerror})") from None


def check_run_dir(run_dir: Path, hc: Any, take_lock: bool = True, cfg: DictConfig | None = None) -> None:
    """A single run's dir is absent, empty, or an ablate run dir (a readable run.json) of the same
    overrides, and no live process holds its lock; then this process takes the lock, before Hydra
    writes ablate.log into the dir and before ablate writes `.hydra/` (nothing of a process refused
    here touches the dir, whatever its timing against the holder). A completed run is left unlocked
    and untouched (`ablate.run.lifecycle` says so). `ablate.train` checks the same again, for
    multirun jobs. Without `take_lock` only the checks run, creating nothing (before the code checks)."""
    from ablate.run import rundir

    if not rundir.is_main_process():  # rank 0 checks (and then holds) the dir its other ranks share
        return
    rundir.is_usable(run_dir)
    _check_same_run(run_dir, hc, cfg)
    if not take_lock:
        return
    if rundir.completed_summary(run_dir) is not None:
        return
    rundir.lock(run_dir)
    _check_same_run(run_dir, hc)  # again under the lock: the holder before us may have written run.json


def _check_same_run(run_dir: Path, hc: Any, cfg: DictConfig | None = None) -> None:
    from ablate.run import rundir
    from ablate.run.secrets import mask

    info = rundir.read_json_checked(run_dir / rundir.RUN) if run_dir.is_dir() else None
    overrides = _overrides(hc)
    if info is not None and overrides is not None and sorted(info.get("overrides", [])) != sorted(mask(overrides)):
        raise ConfigError(f"{run_dir.resolve()} holds another run (overrides {info.get('overrides')}); "
                          "pick a new hydra.run.dir, or repeat that run's exact overrides to resume it")
    if info is not None and cfg is not None and rundir.completed_summary(run_dir) is None:
        from ablate.run.config_change import check_same_config
        from ablate.run.lifecycle import identity

        task = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"]) if "hydra" in cfg else cfg
        check_same_config(run_dir.resolve(), info, identity(task), warn=False)


class Validate(Callback):
    """Hydra callback: a single run's config and run dir are checked before Hydra touches the dir.
    Hydra turns a callback's exception into a warning, so a refusal exits here (code 2)."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        def checks() -> None:
            check(config)  # first: reading hydra.run.dir may resolve a bad ${oc.env:...} override
            run_dir = Path(_dir_value(config, "hydra.run.dir"))
            check_dir(run_dir, "hydra.run.dir", create=False)
            check_run_dir(run_dir, config.hydra, take_lock=False, cfg=config)  # creates nothing yet
            check_code(config, processes=job_processes())  # imports the method's code (torch), which the run needs next anyway
            check_dir(run_dir, "hydra.run.dir")  # creates it
            check_run_dir(run_dir, config.hydra)  # again, now under the dir's lock, held from here on

        _exit_on_error(checks)

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        """A mistake in a sweep's fixed values would fail every job: refuse the sweep instead. The
        config here is the defaults plus the fixed overrides; when a group is swept the jobs'
        configs differ from it too much to judge, so each job is checked when it starts. Then the
        launch claims its sweep dir (`claim_sweep_dir`)."""
        _exit_on_error(lambda: check_launcher(config.hydra))  # before any job is submitted
        swept = _swept(config)

        def checks() -> None:
            sweep_dir = Path(_dir_value(config, "hydra.sweep.dir"))  # empty: refused
            if sweep_dirs.given(config.hydra):
                sweep_dirs.check_sweep_dir_free(sweep_dir, sweep_dirs.task_overrides(config.hydra))  # in about a second: before the code checks import torch
            if swept is not None:
                check(config, swept=swept)
                check_dir(sweep_dir, "hydra.sweep.dir", create=False)
                check_code(config, swept)  # the sweep's dir is created after the code checks
            claim_sweep_dir(config)

        _exit_on_error(checks)


def claim_sweep_dir(config: DictConfig) -> None:
    """A sweep launch owns its dir as a run owns its run dir. The default dir (named to the second) is
    created anew: `_2`, `_3`, ... when another launch (of the same second, or before) has it. A
    `hydra.sweep.dir` given on the command line (`--resume` gives its launch's) is used as it is,
    unless a live launch holds it. Either way this process holds `<sweep dir>/.lock` until it exits,
    and the dir is pinned in the multirun's hydra overrides: every job (in this process, a worker, a
    SLURM job) and multirun.yaml name the same one."""
    from omegaconf import open_dict, read_write

    from ablate.run import rundir
    from ablate.run.compose import quote_override_value

    hc = config.hydra
    path = Path(str(hc.sweep.dir))
    raw = sweep_dirs.hydra_overrides(hc)
    given = [o for o in raw if o.lstrip("+").split("=", 1)[0] == "hydra.sweep.dir"]
    if given:
        check_dir(path, "hydra.sweep.dir", create=False)
        task = sweep_dirs.task_overrides(hc)
        sweep_dirs.check_sweep_dir_free(path, task)
        if sweep_dirs.same_launch(path, task) and not os.environ.get(sweep_dirs.RESUME_ENV):
            log.info(f"{path}: the same launch again (multirun.yaml's overrides): each job continues its run dir")
        check_dir(path, "hydra.sweep.dir")
    else:
        check_dir(path.parent, "hydra.sweep.dir")
        path = rundir.claim_new_dir(path)
    rundir.lock(path, what="sweep dir", advice="launch the sweep into another hydra.sweep.dir")
    with read_write(hc), open_dict(hc):
        hc.sweep.dir = str(path)
        overrides = [o for o in raw if o not in given]
        hc.overrides.hydra = [*overrides, f"hydra.sweep.dir={quote_override_value(str(path))}"]


def _dir_value(config: DictConfig, key: str) -> str:
    """hydra.run.dir / hydra.sweep.dir as given; empty would mean the current directory."""
    value = str(OmegaConf.select(config, key, default="") or "").strip()
    if not value:
        raise ConfigError(f"{key} is empty (it would write into the current directory); give a directory: "
                          f"{key}=outputs/my_run, or leave it out for a new dir under outputs/")
    return value


def _swept(config: DictConfig) -> frozenset[str] | None:
    """The keys a multirun sweeps, or None when it sweeps a config group (or they cannot be read)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    choices = OmegaConf.select(config, "hydra.runtime.choices", default=None) or {}
    try:
        parsed = OverridesParser.create().parse_overrides(_overrides(config.hydra) or [])
    except Exception:  # noqa: BLE001 - Hydra parsed them already; never refuse a sweep on our own parse
        return None
    keys = {o.key_or_group for o in parsed if o.is_sweep_override()}
    return None if any(k in choices or "/" in k for k in keys) else frozenset(keys)


def _exit_on_error(fn: Callable[[], Any]) -> None:
    """Run the checks; a refusal exits here with one line. Hydra would turn any exception raised in
    a callback into a warning and go on to create the run dir, so nothing may escape: an OS error
    (a dir that cannot be read) is one line too, and a bug in a check is its traceback and exit 1."""
    from ablate.run.rundir import RunDirError
    from ablate.run.secrets import mask_text

    try:
        fn()
    except (ConfigError, RunDirError) as e:
        print(f"ablate: error: {mask_text(str(e))}", file=sys.stderr)
        sys.exit(2)
    except OSError as e:
        print(f"ablate: error: {mask_text(os_error_line(e))}", file=sys.stderr)
        sys.exit(2)
    except Exception:  # noqa: BLE001 - a bug in a check: loud, and the run does not start
        import traceback

        traceback.print_exc()
        sys.exit(1)


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


def one_line(e: BaseException) -> str | None:
    """The user-facing line for a config/composition error, or None for anything else (a bug)."""
    from hydra.errors import (
        HydraException,
        MissingConfigException,
        OverrideParseException,
    )

    from ablate.errors import USER_ERRORS

    for cause in chain(e, context=False):
        if isinstance(cause, USER_ERRORS):
            return str(cause).splitlines()[0] if str(cause) else type(cause).__name__
    line = _bad_config_file(e)
    if line is not None:
        return line
    if isinstance(e, OverrideParseException):
        key, _, value = str(e.override).partition("=")
        if "~" in value:  # a home path: Hydra's grammar has no unquoted ~ (and ablate expands it)
            return (f"cannot parse the override '{e.override}': Hydra reads '~' only inside quotes: write "
                    f"'{key}=\"{value}\"' (single quotes outside, for the shell), or {key}=$HOME{value.lstrip('~')}")
        return f"cannot parse the override '{e.override}': {str(e).splitlines()[0]}"
    if isinstance(e, MissingConfigException):
        return _missing_option(e)
    if isinstance(e, HydraException) and isinstance(e.__cause__, OmegaConfBaseException) \
            and "not in struct" in str(e.__cause__):
        given = re.search(r"use \+([^=\s]+)=(\S*)", str(e))  # Hydra: "To append to your config use +key=value"
        return _unknown_key(e.__cause__, given.group(2) if given else "...")
    if isinstance(e, (HydraException, OmegaConfBaseException)):
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
        return " ".join(lines[:3]) if lines else type(e).__name__
    return None


def _bad_config_file(e: BaseException) -> str | None:
    """A config file (conf/, a sweep config, --config-dir) that is not YAML or not UTF-8."""
    import yaml

    for c in chain(e):
        if isinstance(c, yaml.MarkedYAMLError):
            mark = c.problem_mark or c.context_mark
            where = f"{mark.name} line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "a config file"
            return f"{where}: not valid YAML ({c.problem or c.context})"
        if isinstance(c, UnicodeDecodeError):
            return f"a config file is not UTF-8 text (byte 0x{c.object[c.start]:02x}); save it as UTF-8"
    return None


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
    return f"no option '{option}' in config group '{group}' ({meant}options: {', '.join(options)})"


def _unknown_key(cause: Any, value: str = "...") -> str:
    key = str(getattr(cause, "full_key", "") or "")
    hint = optimizer_field_hint(key)  # method.args.warmup_steps: the optimizer group's, not a typo of max_steps
    if hint is not None:
        return hint
    parent = getattr(cause, "parent_node", None)
    leaf = key.rsplit(".", 1)[-1]
    prefix = key[: -len(leaf)]
    known = [str(k) for k in parent.keys()] if isinstance(parent, DictConfig) else []
    there = elsewhere(parent._get_root(), key, value) if isinstance(parent, DictConfig) else None
    if there is not None:  # `max_steps=5`: the key exists, under another node (before a close name here)
        return f"unknown config key '{key}': {there}"
    hint = difflib.get_close_matches(leaf, known, n=1)
    if hint:
        return f"unknown config key '{key}' (did you mean '{prefix}{hint[0]}'?)"
    return f"unknown config key '{key}'; known under '{prefix.rstrip('.') or '<root>'}': {', '.join(known)}" \
           f" (to add a new field on purpose: +{key}=...)"

