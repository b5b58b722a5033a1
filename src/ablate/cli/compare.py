"""`ablate compare DIR...`: the command line; the analysis lives in ablate.analysis."""

from __future__ import annotations

import sys
from pathlib import Path


def compare_cmd(argv: list[str]) -> None:
    """`ablate compare DIR... [--metric M]... [--out DIR]`."""
    from ablate.analysis.compare import DEFAULT_OUT, DEFAULT_OUT_RULE, compare
    from ablate.cli import parser as one_line_parser

    parser = one_line_parser(prog="ablate compare", description="compare run and sweep directories")
    parser.add_argument("dirs", nargs="+", type=Path, help="run dirs, sweep dirs, or folders holding them")
    parser.add_argument("--metric", action="append", default=None,
                        help="metric to show (repeat or comma-separate; default: per method; "
                             "speed: tokens_per_second, mfu and GRPO's time/*)")
    parser.add_argument("--out", type=Path, nargs="?", default=None, const=DEFAULT_OUT, metavar="DIR",
                        help="write report.html (self-contained), PNG plots, summary.md and summary.csv to DIR "
                             f"(--out alone: {DEFAULT_OUT_RULE})")
    parser.add_argument("--pool", action="store_true",
                        help="pool runs with the same overrides across launches (default: each launch apart)")
    parser.add_argument("--all-launches", action="store_true",
                        help="every launch under a sweep's folder, each apart (default: its newest launch)")
    parser.add_argument("--x", default=None,
                        help="x axes of the curves, comma-separated: step,time,tokens "
                             "(default: step; reward also time)")
    parser.add_argument("--tag", action="append", default=[], help="only runs tagged so (tags=[...]; repeat: all of them)")
    args = parser.parse_args(argv)
    metrics = [m for ms in args.metric for m in ms.split(",") if m] if args.metric else None
    x_axes = [x for x in args.x.split(",") if x] if args.x else None
    from ablate.analysis.compare import X_AXES

    if x_axes and not set(x_axes) <= set(X_AXES):
        parser.error(f"--x takes {','.join(X_AXES)}, got {args.x}")
    from ablate.errors import missing_extra
    from ablate.run.validate import installed

    if args.out is not None and not installed("matplotlib"):
        print(f"ablate: error: {missing_extra('matplotlib', 'plot', 'ablate compare --out (PNG plots)')}", file=sys.stderr)
        sys.exit(2)
    from ablate.errors import ConfigError
    from ablate.run.rundir import RunDirError, check_readable

    try:
        for d in args.dirs:  # a dir given by name that cannot be read is the user's to fix (a nested one is listed)
            check_readable(d)
        if args.out not in (None, DEFAULT_OUT):  # never over files of the user's (issue 32); the default: compare()
            from ablate.analysis.report import check_out

            check_out(args.out)
        compare(args.dirs, metrics=metrics, out=args.out, pool=args.pool, xs=x_axes, tags=args.tag,
                all_launches=args.all_launches)
    except (FileNotFoundError, ConfigError, RunDirError) as e:
        print(f"ablate: error: {e}", file=sys.stderr)
        sys.exit(2)
