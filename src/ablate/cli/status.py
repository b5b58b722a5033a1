"""`ablate status SWEEP_DIR`: each job of a sweep, from its run dirs and the scheduler."""

from __future__ import annotations

import sys
from pathlib import Path

from ablate.launchers.slurm import status


def status_cmd(argv: list[str]) -> None:
    """`ablate status SWEEP_DIR`: each job's state (run dirs + SLURM); the end table once all are done."""
    from ablate.record.rundir import RunDirError, check_readable

    try:
        check_readable(Path(argv[0])) if argv else None
    except RunDirError as e:
        print(f"ablate: error: {e}", file=sys.stderr)
        sys.exit(2)
    if len(argv) != 1 or not (Path(argv[0]) / "multirun.yaml").is_file():
        print("usage: ablate status SWEEP_DIR   (a sweep dir: it holds multirun.yaml)", file=sys.stderr)
        sys.exit(2)
    status(Path(argv[0]).resolve())
