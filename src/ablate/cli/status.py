"""`ablate status SWEEP_DIR`: each job of a sweep, from its run dirs and the scheduler."""

from __future__ import annotations

import sys
from pathlib import Path

from ablate.launchers.slurm import status


def status_cmd(argv: list[str]) -> None:
    """`ablate status SWEEP_DIR`: each job's state (run dirs + SLURM); the end table once all are done."""
    from ablate.run.rundir import RunDirError, check_readable

    try:
        check_readable(Path(argv[0])) if argv else None
    except RunDirError as e:
        print(f"ablate: error: {e}", file=sys.stderr)
        sys.exit(2)
    if len(argv) != 1 or not (Path(argv[0]) / "multirun.yaml").is_file():
        from ablate.cli import refuse
        from ablate.run import rundir

        why = ("ablate status takes one sweep dir" if len(argv) != 1 else
               f"{argv[0]} is a run dir, not a sweep dir: `ablate ls {argv[0]}` shows its state"
               if (Path(argv[0]) / rundir.RUN).is_file() else f"{argv[0]} is not a sweep dir (no multirun.yaml)")
        refuse(why, "ablate status SWEEP_DIR")
    status(Path(argv[0]).resolve())
