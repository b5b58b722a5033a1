"""`ablate ls [DIR]`: what have I run? One line per run, newest first (ablate.analysis.runs)."""

from __future__ import annotations

import json
from typing import Any

from ablate.analysis.runs import STATUSES, format_rows, list_runs
from ablate.cli.exits import fail, user_errors
from ablate.record.rundir import LAST, RunDirError, given_run


def ls_cmd(args: Any) -> None:
    """`ablate ls [DIR] [--status S] [--method M] [--tag T]... [--json]` (arguments: ablate.cli.parser)."""
    if args.status is not None and args.status not in STATUSES:
        from ablate.cli import refuse

        refuse(
            f"ablate ls: argument --status: invalid choice: '{args.status}' (choose from "
            f"{', '.join(STATUSES)})",
            "ablate ls",
        )
    if str(args.dir) == LAST and not args.dir.exists():  # `ablate ls last`: the newest run's line
        with user_errors(RunDirError):
            args.dir = given_run(args.dir)
    if not args.dir.is_dir():
        fail(f"no directory {args.dir} (run `ablate train` first, or give the outputs dir)")
    root = args.dir.resolve()
    rows = list_runs(root, args.status, args.method, args.tag)
    if args.json:
        print(json.dumps([{**r, "path": str(root / r["path"])} for r in rows], indent=2))
        return
    if not rows:
        print(
            f"no runs under {args.dir}"
            + (" matching the filters" if args.status or args.method or args.tag else "")
        )
        return
    print("\n".join(format_rows(rows)))
    print(f"{len(rows)} run(s) under {root}")
    for r in rows:  # why a dir is no usable run (its error is in --json too)
        if r["status"] == "unreadable" and r["error"]:
            print(f"unreadable: {r['path']}: {r['error']}")
