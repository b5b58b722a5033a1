"""`ablate status [SWEEP_DIR]`: each job of a sweep, from its run dirs and the scheduler."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ablate.cli.exits import user_errors
from ablate.launchers.slurm import status

SWEEPS = Path("outputs") / "sweeps"  # the default hydra.sweep.dir's parent: outputs/sweeps/<name>/<launch>


def newest_launch(folder: Path) -> Path | None:
    """The newest launch (a dir holding multirun.yaml) at most two levels under `folder` (a sweep's
    folder, or outputs/sweeps), by the time its multirun.yaml was written."""
    found = [
        p.parent
        for pattern in ("multirun.yaml", "*/multirun.yaml", "*/*/multirun.yaml")
        for p in folder.glob(pattern)
    ]
    return max(found, key=lambda p: ((p / "multirun.yaml").stat().st_mtime, p.name)) if found else None


def status_cmd(args: Any) -> None:
    """`ablate status [SWEEP_DIR]`: each job's state (run dirs + SLURM); no argument: the newest sweep
    under ./outputs/sweeps; a sweep's folder (outputs/sweeps/dpo_loss): its newest launch (arguments:
    ablate.cli.parser)."""
    from ablate.cli import refuse
    from ablate.record import rundir
    from ablate.record.rundir import RunDirError, check_readable

    given = args.sweep_dir or SWEEPS
    with user_errors(RunDirError):
        check_readable(given)
    sweep_dir = (
        given if (given / "multirun.yaml").is_file() else newest_launch(given) if given.is_dir() else None
    )
    if sweep_dir is None:
        if (given / rundir.RUN).is_file():
            refuse(
                f"{given} is a run dir, not a sweep dir: `ablate ls {given}` shows its state", "ablate status"
            )
        what = (
            f"{given} does not exist" if not given.exists() else f"no sweep under {given} (no multirun.yaml)"
        )
        fix = (
            "give a sweep dir (`ablate ls` lists sweep jobs by dir)"
            if args.sweep_dir
            else "run this where you launch sweeps, give a sweep dir, or start one: ablate sweep NAME"
        )
        refuse(f"{what}; {fix}", "ablate status")
    note = (
        ""
        if sweep_dir == given
        else f" (the newest sweep under {given}; ablate status SWEEP_DIR for another)"
    )
    status(sweep_dir.resolve(), note)
