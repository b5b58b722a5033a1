"""`ablate compare DIR...`: the command line; the analysis lives in ablate.analysis."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from ablate.cli.exits import fail, user_errors


def newest_sweep() -> Path:
    """`ablate compare last`: the newest sweep launch under outputs/sweeps (by its multirun.yaml), said on
    stderr; RunDirError in one line when there is none."""
    from ablate.cli.status import SWEEPS, newest_launch
    from ablate.record.rundir import RunDirError

    found = newest_launch(SWEEPS) if SWEEPS.is_dir() else None
    if found is None:
        raise RunDirError(
            f"`last` is the newest sweep under {SWEEPS}/ and there is none here (no multirun.yaml "
            f"under {SWEEPS.resolve()}); run `ablate sweep NAME` first, or give run or sweep dirs"
        )
    print(f"last: {found}", file=sys.stderr)
    return found


def compare_cmd(args: Any) -> None:
    """`ablate compare DIR... [--metric M]... [--out [DIR]]` (arguments: ablate.cli.parser)."""
    from ablate.analysis.compare import DEFAULT_OUT, compare
    from ablate.cli.arguments import OUT_ALONE

    # --out without a dir: compare() picks it (ablate.analysis.report.DEFAULT_OUT_RULE)
    if args.out == OUT_ALONE:
        args.out = DEFAULT_OUT
    metrics = [m for ms in args.metric for m in ms.split(",") if m] if args.metric else None
    x_axes = [x for x in args.x.split(",") if x] if args.x else None
    from ablate.analysis.plots import X_AXES

    if x_axes and not set(x_axes) <= set(X_AXES):
        fail(f"--x takes {','.join(X_AXES)}, got {args.x}")
    from ablate.config.checks import installed
    from ablate.errors import missing_extra

    if args.out is not None and not installed("matplotlib"):
        fail(missing_extra("matplotlib", "plot", "ablate compare --out (PNG plots)"))
    from ablate.errors import ConfigError
    from ablate.record.rundir import LAST, RunDirError, check_readable

    with user_errors(FileNotFoundError, ConfigError, RunDirError):
        args.dirs = [newest_sweep() if str(d) == LAST and not d.exists() else d for d in args.dirs]
        # a dir given by name that cannot be read is the user's to fix (a nested one is listed)
        for d in args.dirs:
            check_readable(d)
        if args.out not in (None, DEFAULT_OUT):  # never over files of the user's; the default: compare()
            from ablate.analysis.report import check_out

            check_out(args.out)
        if args.wandb and not installed("wandb"):
            fail(missing_extra("wandb", "wandb", "ablate compare --wandb"))
        outcomes: list[dict[str, Any]] = []
        compare(
            args.dirs,
            metrics=metrics,
            out=args.out,
            pool=args.pool,
            xs=x_axes,
            tags=args.tag,
            all_launches=args.all_launches,
            verbose=args.verbose,
            outcomes=outcomes,
        )
        if args.wandb:
            from ablate.logger.comparison import log_comparison

            for where in log_comparison(outcomes):
                print(f"W&B: the comparison logged to {where}")
