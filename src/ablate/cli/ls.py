"""`ablate ls [DIR]`: what have I run? One line per run, newest first (ablate.analysis.runs)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ablate.analysis.runs import STATUSES, format_rows, list_runs
from ablate.cli import parser as one_line_parser


def ls_cmd(argv: list[str]) -> None:
    """`ablate ls [DIR] [--status S] [--method M] [--tag T]... [--json]`."""
    parser = one_line_parser(prog="ablate ls", description="list runs and sweep jobs, newest first")
    parser.add_argument("dir", nargs="?", type=Path, default=Path("outputs"), help="where to look (default: outputs/)")
    parser.add_argument("--status", choices=STATUSES, help="only runs with this status")
    parser.add_argument("--method", help="only runs of this method (dpo, sft, grpo, ...)")
    parser.add_argument("--tag", action="append", default=[], help="only runs tagged so (repeat: all of them)")
    parser.add_argument("--json", action="store_true", help="one JSON list of runs, for scripts")
    args = parser.parse_args(argv)
    if not args.dir.is_dir():
        print(f"ablate: error: no directory {args.dir} (run `ablate train` first, or give the outputs dir)",
              file=sys.stderr)
        sys.exit(2)
    root = args.dir.resolve()
    rows = list_runs(root, args.status, args.method, args.tag)
    if args.json:
        print(json.dumps([{**r, "path": str(root / r["path"])} for r in rows], indent=2))
        return
    if not rows:
        print(f"no runs under {args.dir}" + (" matching the filters" if args.status or args.method or args.tag else ""))
        return
    print("\n".join(format_rows(rows)))
    print(f"{len(rows)} run(s) under {root}")
