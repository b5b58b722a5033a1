"""The Hydra callback that refuses a bad config or run dir before Hydra touches anything, and Hydra's
own errors as one line.

- `Validate` (conf/config.yaml `hydra.callbacks`): runs the config checks (ablate.config.checks, then
  ablate.config.code_checks) and the run-dir checks in `on_run_start`, which Hydra calls after
  composing and *before* it creates the run dir or writes ablate.log into it, and takes the run dir's
  lock there; a mistake leaves every existing dir as it was. A multirun job is checked by
  `ablate.train.run` instead (it fails, the sweep goes on); a multirun claims its sweep dir in
  `on_multirun_start` (`claim_sweep_dir`).
- `one_line(e)`: Hydra's multi-line composition errors ("not in struct", "Could not find
  'method/dpoo'") as one line that names the key or option that was probably meant.

No torch import at module level: this runs in the launching process.
"""

from __future__ import annotations

import difflib
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from ablate.config.checks import check, check_launcher, elsewhere, optimizer_field_hint, task_overrides
from ablate.config.code_checks import check_code, job_processes
from ablate.errors import ConfigError, chain, missing_extra
from ablate.record import sweep_dirs

log = logging.getLogger(__name__)


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
    and untouched (`ablate.record.lifecycle` says so). `ablate.train` checks the same again, for
    multirun jobs. Without `take_lock` only the checks run, creating nothing (before the code checks)."""
    from ablate.record import rundir

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
    from ablate.record import rundir
    from ablate.record.identity import check_same_config, identity, same_run

    info = rundir.read_json_checked(run_dir / rundir.RUN) if run_dir.is_dir() else None
    overrides = task_overrides(hc)
    if overrides is not None:
        same_run(run_dir.resolve(), info, overrides)
    if info is not None and cfg is not None and rundir.completed_summary(run_dir) is None:
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
            # imports the method's code (torch), which the run needs next anyway
            check_code(config, processes=job_processes())
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
                # in about a second: before the code checks import torch
                sweep_dirs.check_sweep_dir_free(sweep_dir, task_overrides(config.hydra))
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

    from ablate.config.compose import quote_override_value
    from ablate.record import rundir

    hc = config.hydra
    path = Path(str(hc.sweep.dir))
    raw = sweep_dirs.hydra_overrides(hc)
    given = [o for o in raw if o.lstrip("+").split("=", 1)[0] == "hydra.sweep.dir"]
    if given:
        check_dir(path, "hydra.sweep.dir", create=False)
        if sweep_dirs.check_sweep_dir_free(path, task_overrides(hc)):
            log.info(
                f"{path}: the same launch again (multirun.yaml's overrides): each job continues its run dir"
            )
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
        raise ConfigError(
            f"{key} is empty (it would write into the current directory); give a directory: "
            f"{key}=outputs/my_run, or leave it out for a new dir under outputs/"
        )
    return value


def _swept(config: DictConfig) -> frozenset[str] | None:
    """The keys a multirun sweeps, or None when it sweeps a config group (or they cannot be read)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    choices = OmegaConf.select(config, "hydra.runtime.choices", default=None) or {}
    try:
        parsed = OverridesParser.create().parse_overrides(task_overrides(config.hydra) or [])
    except Exception:  # Hydra parsed them already; never refuse a sweep on our own parse
        return None
    keys = {o.key_or_group for o in parsed if o.is_sweep_override()}
    if any(k in choices or "/" in k for k in keys):
        return None
    # a sweep file's params: its plain keys are swept; a swept `method` makes method.args another schema's (a
    # value fixed for GRPO and RLOO is not judged as DPO's); its other groups keep the fixed values' schema
    params = {
        str(k).lstrip("+~") for k in OmegaConf.select(config, "hydra.sweeper.params", default=None) or {}
    }
    return (
        None
        if "method" in params
        else frozenset(keys | {k for k in params if k not in choices and "/" not in k})
    )


def _exit_on_error(fn: Callable[[], Any]) -> None:
    """Run the checks; a refusal exits here with one line. Hydra would turn any exception raised in
    a callback into a warning and go on to create the run dir, so nothing may escape: an OS error
    (a dir that cannot be read) is one line too, and a bug in a check is its traceback and exit 1."""
    from ablate.record.rundir import RunDirError
    from ablate.record.secrets import mask_text

    try:
        fn()
    except (ConfigError, RunDirError) as e:
        print(f"ablate: error: {mask_text(str(e))}", file=sys.stderr)
        sys.exit(2)
    except OSError as e:
        print(f"ablate: error: {mask_text(os_error_line(e))}", file=sys.stderr)
        sys.exit(2)
    except Exception:  # a bug in a check: loud, and the run does not start
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
    import re

    from hydra.errors import HydraException, MissingConfigException, OverrideParseException

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
    line = _group_not_in_config(e)
    if line is not None:
        return line
    line = _merge_mismatch(e)
    if line is not None:
        return line
    line = _schema_type(e)
    if line is not None:
        return line
    typed = _schema_key_error(e)
    if typed is not None:  # Hydra: "To append to your config use +key=value"
        given = re.search(r"use \+([^=\s]+)=(\S*)", str(e))
        return _unknown_key(typed, given.group(2) if given else "...")
    appended = re.match(r"Could not append to config\. An item is already at '([^']+)'", str(e))
    if appended is not None:
        key = appended.group(1)
        value = re.search(rf"'{re.escape(key)}=([^']*)'", str(e))
        return (
            f"+{key}: {key} is already a key of this config (its default is declared): set it without the +, "
            f"{key}={value.group(1) if value else '...'}"
        )
    if (
        isinstance(e, HydraException)
        and isinstance(e.__cause__, OmegaConfBaseException)
        and "not in struct" in str(e.__cause__)
    ):
        import re

        # Hydra: "To append to your config use +key=value"
        given = re.search(r"use \+([^=\s]+)=(\S*)", str(e))
        return _unknown_key(e.__cause__, given.group(2) if given else "...")
    if isinstance(e, (HydraException, OmegaConfBaseException)):
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
        return " ".join(lines[:3]) if lines else type(e).__name__
    return None


def _schema_of(cause: BaseException) -> Any:
    """The schema class of the typed node an OmegaConf error is about (ablate.config.store), or None."""
    from ablate.schema import Schema

    cls = getattr(cause, "object_type", None)
    return cls if isinstance(cls, type) and issubclass(cls, Schema) else None


def _schema_type(e: BaseException) -> str | None:
    """`method.args.beta=abc`: OmegaConf refuses a value of the wrong type for a schema's typed field while
    composing; the answer is the schema's own line for that field (`must be a number > 0`)."""
    import re

    import yaml
    from omegaconf.errors import ValidationError

    from ablate.schema import refusal

    for c in chain(e):
        cls = _schema_of(c)
        if not isinstance(c, ValidationError) or cls is None or c.full_key is None:
            continue
        rule = cls.__dataclass_fields__.get(str(c.key))
        rule = rule.metadata.get("check") if rule is not None else None
        # the value: in OmegaConf's words, else in the override's (`Error merging override KEY=VALUE`)
        given = re.match(r"Value '(.*)' (of type|is not)", str(c).splitlines()[0]) or re.search(
            rf"override \+*{re.escape(str(c.full_key))}=(.*)", str(e).splitlines()[0]
        )
        if rule is None or given is None:
            continue
        try:
            value = yaml.safe_load(given.group(1))
        except yaml.YAMLError:
            value = given.group(1)
        at = str(c.full_key).rpartition(".")[0]
        return refusal(str(c.full_key), value, rule.words(cls.of({}), at))
    return None


def _schema_key_error(e: BaseException) -> Any:
    """A key a schema's typed node does not declare (`method.args.warmup_ratio=0.1`, or in a YAML file)."""
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError

    for c in chain(e):
        if isinstance(c, (ConfigAttributeError, ConfigKeyError)) and _schema_of(c) and c.full_key:
            return c
    return None


def _merge_mismatch(e: BaseException) -> str | None:
    """`key=[a,b]` over a mapping (or `key={...}` over a list): Hydra's "Error merging override" names no fix.
    The remedy is to replace the node whole (`~key` then `+key=`); a mapping of reward functions also takes
    one more."""
    text = str(e).strip()
    if not text.startswith("Error merging override ") or not any(
        "Cannot merge" in str(c) and "ListConfig" in str(c) for c in chain(e)
    ):
        return None
    override = text.removeprefix("Error merging override ").splitlines()[0]
    key, _, value = override.lstrip("+").partition("=")
    if not value.startswith("["):
        return (
            f"{override}: {key} is a list here, which a mapping cannot be merged into: replace it whole, "
            f"'~{key}' '+{key}={value}'"
        )
    add = ""
    if key == "data.reward_funcs":  # name -> function: one more beside the data's own
        first = value.strip("[]").split(",")[0].strip()
        add = f"add yours, +{key}.{first.rsplit('.', 1)[-1]}={first}, or " if first else ""
        return (
            f"{override}: {key} is a mapping here (name -> function), which a list cannot be merged into: "
            f"{add}replace them all, '~{key}' '+{key}={value}'"
        )
    return (
        f"{override}: {key} is a mapping here, which a list cannot be merged into: "
        f"replace it whole, '~{key}' '+{key}={value}'"
    )


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


def _group_not_in_config(e: BaseException) -> str | None:
    """`method=grpo method/dpo_loss=hinge`: Hydra's "Could not override 'method/dpo_loss'. No match in the
    defaults list" (and an advice to append it): name the options of the group's parent that pick it."""
    import re

    from ablate.paths import conf_dir

    found = re.search(
        r"Could not override '([\w/]+)'\. No match in the defaults list.*?use \+(\S+)", str(e), re.S
    )
    if found is None:
        return None
    group, override = found.groups()
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
    return f"{override}: this config has no config group {group}{using}; to add it anyway: +{override}"


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


def composed_without(key: str) -> DictConfig:
    """The config this command composes, without its override of `key` (the one refused): the config in which
    `elsewhere` looks for a key of that name (an empty one when even that cannot be composed)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from ablate.paths import conf_dir

    given = [a for a in sys.argv[1:] if "=" in a and not a.startswith("-")]
    kept = [a for a in given if a.lstrip("+~").split("=", 1)[0] != key]
    try:
        GlobalHydra.instance().clear()  # Hydra's app that refused the override is done with it
        with initialize_config_dir(config_dir=conf_dir(), version_base="1.3"):
            return compose("config", overrides=kept)
    except Exception:  # another mistake among the overrides: no hint, the line stands
        return OmegaConf.create({})


def _unknown_key(cause: Any, value: str = "...") -> str:
    key = str(getattr(cause, "full_key", "") or "")
    # method.args.warmup_steps: the optimizer group's, not a typo of max_steps
    hint = optimizer_field_hint(key)
    if hint is not None:
        return hint
    parent = getattr(cause, "parent_node", None)
    leaf = key.rsplit(".", 1)[-1]
    prefix = key[: -len(leaf)]
    known = [str(k) for k in parent.keys()] if isinstance(parent, DictConfig) else []
    there = elsewhere(composed_without(key), key, value) if isinstance(parent, DictConfig) else None
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
