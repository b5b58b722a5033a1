"""Resume a sweep: `ablate sweep NAME --resume` / `ablate sweep --resume SWEEP_DIR`.

Hydra has no sweep resume (hydra#3328), but it numbers a sweep's jobs deterministically (the
product of the swept values, in order), so launching the same multirun into the same sweep dir
gives every job the dir it had. What ablate adds:

- a pre-flight in the launching process (`plan`), before any job starts: each job's identity is its
  overrides plus a hash of its resolved config (recorded in its run.json by the job itself); if the
  sweep config, code-level defaults or the overrides changed, the resume is refused with one line
  naming the first differing key, or (`--force`) the changed job's old dir is moved into
  `<sweep dir>/.replaced/` and the job starts fresh;
- in each job (`ablate.train`, with RESUME_ENV set): a run dir whose summary says `completed` is
  returned as it is; any other (failed, interrupted, preempted) resumes from its newest complete
  checkpoint, as `ablate resume` does; a missing one starts;
- the end-of-sweep table's `this launch` column: skipped / resumed from step N / restarted / new.

No torch import here: this module runs in the launching process.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from ablate.record import checkpoints, rundir
from ablate.record.identity import config_changes, identity, same_config, same_overrides


class ResumeRefused(Exception):
    """A job of the sweep is no longer the job that ran in its dir."""


def latest_sweep_dir(parent: Path) -> Path | None:
    """The newest launch (a dir holding multirun.yaml) under `outputs/sweeps/<name>/`."""
    launches = [p for p in parent.glob("*") if (p / "multirun.yaml").is_file()] if parent.is_dir() else []
    return max(launches, key=lambda p: (p.stat().st_mtime, p.name)) if launches else None


def launch_argv(sweep_dir: Path) -> list[str]:
    """The multirun command line that launched `sweep_dir` (Hydra records it in multirun.yaml)."""
    cfg = OmegaConf.load(sweep_dir / "multirun.yaml")
    hydra_overrides = [o for o in cfg.hydra.overrides.hydra if not o.startswith("hydra.sweep.dir=")]
    return ["-m", *cfg.hydra.overrides.task, *hydra_overrides]


def _compose(overrides: list[str], hydra_config: bool = False) -> DictConfig:
    from hydra import compose

    return compose(config_name="config", overrides=overrides, return_hydra_config=hydra_config)


def fixed_overrides(argv: list[str]) -> list[str]:
    """The overrides of a multirun command line that sweep nothing: what compose() accepts (neither
    the sweep dir nor the swept params depend on the swept values)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    return [a for a in argv if not a.startswith("-") and not parser.parse_override(a).is_sweep_override()]


def expand_jobs(argv: list[str]) -> list[list[str]]:
    """Each job's overrides, in Hydra's job order: what its BasicSweeper does with the config's
    `hydra.sweeper.params` and the command line's task overrides (the product of each key's values, a key
    given twice taking its last place's values, in the order keys are first given)."""
    import itertools

    from hydra.core.override_parser.overrides_parser import OverridesParser

    task = [a for a in argv if not a.startswith("-") and not a.startswith("hydra")]
    params = _compose(fixed_overrides(argv), hydra_config=True).hydra.sweeper.params or {}
    values: dict[str, list[str]] = {}
    for o in OverridesParser.create().parse_overrides([f"{k}={v}" for k, v in params.items()] + task):
        key = o.get_key_element()
        swept = o.sweep_string_iterator() if o.is_sweep_override() else [o.get_value_element_as_str()]
        values[key] = [f"{key}={v}" for v in swept]
    return [list(job) for job in itertools.product(*values.values())]


def job_dir(sweep_dir: Path, num: int) -> Path | None:
    """Hydra's subdir of job `num`: `<num>` or `<num>_<overrides>`."""
    for p in sweep_dir.iterdir():
        if p.is_dir() and (p.name == str(num) or p.name.startswith(f"{num}_")):
            return p
    return None


def plan(argv: list[str], sweep_dir: Path | None = None, force: bool = False) -> tuple[Path, dict[str, str]]:
    """The sweep dir to resume (`sweep_dir`, else the newest launch of the sweep `argv` names: its
    default sweep dir's parent) and what resuming it does to each job: {job number: action}.
    Raises ResumeRefused when there is nothing to resume, or (unless `force`) when a job's
    overrides or resolved config changed."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException

    from ablate.config.compose import register_resolvers
    from ablate.paths import conf_dir

    register_resolvers()
    GlobalHydra.instance().clear()
    actions: dict[str, str] = {}
    try:
        with initialize_config_dir(config_dir=conf_dir(), version_base="1.3"):
            if sweep_dir is None:
                pattern = Path(str(_compose(fixed_overrides(argv), hydra_config=True).hydra.sweep.dir))
                sweep_dir = (
                    pattern if (pattern / "multirun.yaml").is_file() else latest_sweep_dir(pattern.parent)
                )
                if sweep_dir is None:
                    raise ResumeRefused(
                        f"no earlier launch under {pattern.parent}/ to resume "
                        "(run it without --resume, or give the sweep dir: ablate sweep --resume DIR)"
                    )
            if (
                sweep_dir / "study.db"
            ).is_file():  # a study (hydra/sweeper=optuna) continues from its database
                from ablate.errors import ConfigError
                from ablate.launchers.study import check_study

                try:
                    check_study(sweep_dir)
                except ConfigError as e:
                    raise ResumeRefused(str(e)) from None
                return sweep_dir.resolve(), {}
            # a sweep config of the user's own
            search = [a for a in argv if a.startswith("hydra.searchpath=")]
            for num, overrides in enumerate(expand_jobs(argv)):
                actions[str(num)] = _job_action(sweep_dir, num, overrides, search, force)
    except HydraException as e:  # a bad override: Hydra's own message, first line
        raise ResumeRefused(str(e).splitlines()[0]) from None
    finally:
        GlobalHydra.instance().clear()  # hydra.main initializes it again
    return sweep_dir.resolve(), actions


def _job_action(sweep_dir: Path, num: int, overrides: list[str], search: list[str], force: bool) -> str:
    d = job_dir(sweep_dir, num)
    info = rundir.read_json(d / rundir.RUN) if d else None
    if d is None or info is None:  # never launched, or launched and killed before ablate started
        return "new"
    differs = None
    if not same_overrides(info.get("overrides", []), overrides):
        old = dict(o.split("=", 1) for o in info.get("overrides", []) if "=" in o)
        new = dict(o.split("=", 1) for o in overrides if "=" in o)
        differs = "overrides " + (config_changes(old, new) or ["?"])[0]
    elif info.get("config_hash"):
        resolved = identity(_compose([*search, *overrides]))
        if not same_config(info, resolved):
            differs = (config_changes(info.get("config") or {}, resolved["config"]) or ["?"])[0]
    if differs is not None:
        if not force:
            raise ResumeRefused(
                f"cannot resume {sweep_dir}: job {num} ({d.name}) changed since it ran: {differs}; "
                "--force starts the changed jobs fresh"
            )
        aside = sweep_dir / ".replaced" / f"{d.name}-{time.strftime('%Y%m%d-%H%M%S')}"
        aside.parent.mkdir(exist_ok=True)
        shutil.move(str(d), aside)
        return "new (--force: changed)"
    status = (rundir.read_json(d / rundir.SUMMARY) or {}).get("status", "interrupted")
    if status == "completed":
        return "skipped"
    ckpt = checkpoints.latest_checkpoint(d)
    was = "interrupted" if status == "running" else status  # `running` left behind = killed
    return (
        f"resumed from step {ckpt.name.split('-')[-1]} ({was})"
        if ckpt
        else f"restarted ({was}, no checkpoint)"
    )
