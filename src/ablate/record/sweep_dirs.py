"""A sweep dir belongs to one launch: a new launch into a `hydra.sweep.dir` that holds a sweep
is refused unless it is `--resume`, a launch still running there is refused at once, and a job whose
dir was refused (a folder of the user's, another run's) is recorded here, in the sweep's own dir
(`.refused/`), since nothing may be written into that dir: the end-of-sweep table counts it as failed.

No torch import: the launching process checks these before any job starts.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hydra.types import RunMode
from omegaconf import OmegaConf

from ablate.errors import ConfigError, RunDirError
from ablate.record import rundir


def hydra_overrides(hc: Any) -> list[str]:
    # as written: an override may hold an interpolation that only a job can resolve (${hydra.job.num})
    return [str(o) for o in OmegaConf.to_container(hc.overrides.hydra, resolve=False)]


def given(hc: Any) -> bool:
    """`hydra.sweep.dir` was given on the command line (else the launch makes a new dir of its own)."""
    return any(o.lstrip("+").split("=", 1)[0] == "hydra.sweep.dir" for o in hydra_overrides(hc))


# set by `--resume` (and in its job processes): the launch continues the sweep there
RESUME_ENV = "ABLATE_RESUME_SWEEP"
# what a launch leaves in its sweep dir (Hydra's record; a study's database)
SWEEP_RECORDS = ("multirun.yaml", "study.db")


def same_launch(path: Path, task: list[str] | None) -> bool:
    """The sweep in `path` was launched with these very overrides (its multirun.yaml says so): the same
    command again, which docs/runs.md promises continues it (each job resumes its run dir, checked as
    any resume is). A study is never continued so: `--resume` says how many trials it has left."""
    record = path / "multirun.yaml"
    if task is None or not record.is_file() or (path / "study.db").exists():
        return False
    try:
        recorded = OmegaConf.to_container(OmegaConf.load(record).hydra.overrides.task, resolve=False)
    except Exception:  # not Hydra's record (hand-written, truncated): not the same launch
        return False
    return isinstance(recorded, list) and sorted(map(str, recorded)) == sorted(task)


def check_sweep_dir_free(path: Path, task: list[str] | None = None) -> bool:
    """A new launch into a `hydra.sweep.dir` that holds an earlier launch would rewrite its multirun.yaml
    and run its jobs again unchecked: refused, unless this is `--resume` (which checked every job) or
    the same command again (`task`: this launch's overrides, `same_launch`). A launch (a study's
    driver) still running there is refused at once, before the code checks' seconds. True: the same
    command again, continuing the sweep there."""
    resuming = bool(os.environ.get(RESUME_ENV))  # `--resume` checked every job already
    held = [] if resuming else [name for name in SWEEP_RECORDS if (path / name).exists()]
    again = bool(held) and same_launch(path, task)
    if held and not again:
        raise ConfigError(
            f"hydra.sweep.dir={path} holds a sweep ({', '.join(held)}): continue it with "
            f"`ablate sweep --resume {path}`, or choose another hydra.sweep.dir"
        )
    if rundir.lock_held(path):
        holder = (path / rundir.LOCK).read_text(errors="replace").strip() or "another process"
        raise RunDirError(
            f"sweep dir {path.resolve()} is in use by {holder}; wait for it to end, or launch the "
            "sweep into another hydra.sweep.dir"
        )
    return again


# in a sweep's dir: one JSON file per job whose dir was refused (nothing written into that dir)
REFUSED = ".refused"


def record_refusal(
    sweep_dir: Path, run_dir: Path, error: str | None, overrides: list[str] | None = None
) -> None:
    """Record (or, with `error` None, forget) that a sweep's job refused its dir `run_dir`, in the
    sweep's own dir: the end-of-sweep table (ablate.launchers.sweep) shows the job as failed."""
    path = sweep_dir / REFUSED / f"{run_dir.name}.json"
    if not rundir.is_main_process():
        return
    if error is None:  # forgotten only when the file is ablate's record of this very job
        if (rundir.read_json(path) or {}).get("run_dir") == str(run_dir.resolve()):
            path.unlink(missing_ok=True)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    from ablate.record.secrets import mask

    rundir.write_text(
        path,
        json.dumps(
            {"run_dir": str(run_dir.resolve()), "error": error, "overrides": mask(list(overrides or []))}
        )
        + "\n",
    )


def refusals(sweep_dir: Path) -> dict[str, dict[str, Any]]:
    """{job dir: {run_dir, error, overrides}} of the sweep's jobs that refused their dir
    (`record_refusal`)."""
    out = {}
    for p in sorted((sweep_dir / REFUSED).glob("*.json")) if (sweep_dir / REFUSED).is_dir() else []:
        record = rundir.read_json(p) or {}
        if record.get("run_dir") and record.get("error"):
            out[str(record["run_dir"])] = record
    return out


@contextlib.contextmanager
def refusal_recorded(run_dir: Path, hc: Any) -> Iterator[None]:
    """A sweep's job refused its dir (a folder of the user's, another run's, one in use): nothing is
    written into that dir, not even the log line Hydra writes about the failed job; the refusal is
    recorded in the sweep's dir instead, so the sweep's table counts the job as failed. A later
    launch that claims the dir drops the record."""
    multirun = hc.mode == RunMode.MULTIRUN
    try:
        yield
    except (RunDirError, ConfigError) as e:
        if multirun:
            from ablate.record.secrets import mask_text

            rundir.stop_logging_into(run_dir)
            overrides = OmegaConf.to_container(hc.overrides.task, resolve=False)
            record_refusal(Path(str(hc.sweep.dir)), run_dir, mask_text(str(e)), overrides)
        raise
    if multirun:
        record_refusal(Path(str(hc.sweep.dir)), run_dir, None)
