"""`ablate status SWEEP_DIR`: each job of a sweep, from its run dirs and the scheduler."""

from __future__ import annotations

import sys
from typing import Any

from ablate.launchers.slurm import status


def status_cmd(args: Any) -> None:
    """`ablate status SWEEP_DIR`: each job's state (run dirs + SLURM); the end table once all are done."""
    from ablate.record.rundir import RunDirError, check_readable

    try:
        check_readable(args.sweep_dir)
    except RunDirError as e:
        print(f"ablate: error: {e}", file=sys.stderr)
        sys.exit(2)
    if not (args.sweep_dir / "multirun.yaml").is_file():
        from ablate.cli import refuse
        from ablate.record import rundir

        d = args.sweep_dir
        refuse(f"{d} is a run dir, not a sweep dir: `ablate ls {d}` shows its state" if (d / rundir.RUN).is_file()
               else f"{d} is not a sweep dir (no multirun.yaml): give one, e.g. outputs/sweeps/NAME/<date-time>",
               "ablate status")
    status(args.sweep_dir.resolve())
