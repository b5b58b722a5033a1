"""The Hydra callback that refuses a bad config or run dir before Hydra touches anything (the words of a
mistake: ablate.config.hints).

- `Validate` (conf/config.yaml `hydra.callbacks`): runs the config checks (ablate.config.checks, then
  ablate.config.code_checks) and the run-dir checks in `on_run_start`, which Hydra calls after
  composing and *before* it creates the run dir or writes ablate.log into it, and takes the run dir's
  lock there; a mistake leaves every existing dir as it was. A multirun job is checked by
  `ablate.train.run` instead (it fails, the sweep goes on); a multirun claims its sweep dir in
  `on_multirun_start` (`claim_sweep_dir`).

No torch import at module level: this runs in the launching process.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from ablate.config.checks import check, check_launcher, task_overrides
from ablate.config.code_checks import check_code
from ablate.config.hints import os_error_line
from ablate.config.machine import job_processes
from ablate.errors import ConfigError
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
