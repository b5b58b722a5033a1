"""`ablate cache ls|clear`: what the reuse cache holds (ablate.data.cache), and removing it."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Any

from ablate.cli.exits import fail


def cache_cmd(args: Any) -> None:
    """`ablate cache ls [--dir D]` | `ablate cache clear [--kind K] [--dir D]` (arguments:
    ablate.cli.parser)."""
    from ablate.data.cache import KINDS, default_dir, entries, foreign, leftovers

    if args.kind not in (None, *KINDS):
        from ablate.cli import refuse

        refuse(
            f"ablate cache: argument --kind: invalid choice: '{args.kind}' (choose from {', '.join(KINDS)})",
            "ablate cache",
        )
    root = (args.dir or default_dir()).expanduser()
    refuse_root(
        root,
        f"--dir {args.dir}"
        if args.dir
        else f"ABLATE_CACHE={os.environ['ABLATE_CACHE']}"
        if os.environ.get("ABLATE_CACHE")
        else str(root),
    )
    rows = [e for e in entries(root) if args.kind in (None, e["kind"])]
    if args.action == "ls":
        for e in rows:
            print(
                f"{e['kind']:12} {e['entry'][:16]}  {human(e['bytes']):>9}  {e['created']:19}  {e['what']}"
                + (f" ({e['rows']} rows)" if e["rows"] is not None else "")
            )
        print(
            f"{len(rows)} entr{'y' if len(rows) == 1 else 'ies'}, "
            f"{human(sum(e['bytes'] for e in rows))} in {root}"
        )
        return
    for e in rows:  # a run holding an entry keeps reading it (loaded in memory); the next one recomputes
        shutil.rmtree(e["path"], ignore_errors=True)
    for kind in [k for k in KINDS if args.kind in (None, k)]:  # a killed writer's leftovers; lock files stay
        for leftover in leftovers(root, kind):  # (0 bytes: removing one a job holds would let two write)
            shutil.rmtree(leftover, ignore_errors=True)
    print(
        f"removed {len(rows)} entr{'y' if len(rows) == 1 else 'ies'} "
        f"({human(sum(e['bytes'] for e in rows))}) "
        f"from {root}"
    )
    other = foreign(root)
    if other:
        shown = ", ".join(other[:4]) + (", ..." if len(other) > 4 else "")
        print(
            f"ablate: left {len(other)} path{'s' if len(other) > 1 else ''} that are not ablate's cache "
            f"entries in {root}: {shown}",
            file=sys.stderr,
        )


def refuse_root(root: Path, given: str) -> None:
    """Exit 2 with one line when `root` cannot be a cache dir: under a file (`ABLATE_CACHE` naming one),
    or a folder of other things that holds no entry of ablate's (`--dir ~/photos`): nothing is removed."""
    from ablate.data.cache import entries, foreign

    above = root
    while not above.exists() and above != above.parent:
        above = above.parent
    if above.exists() and not above.is_dir():
        where = "" if above == root or str(above) in given else f" ({above} is a file)"
        fail(f"{given} is a file, not a directory{where}: the cache needs a directory of its own")
    other = foreign(root)
    if other and not entries(root):
        shown = ", ".join(other[:3]) + (", ..." if len(other) > 3 else "")
        fail(
            f"{given} is not an ablate cache (it holds {shown} and no entry of ablate's): nothing listed or "
            f"removed; the default is {_default()}"
        )


def _default() -> Path:
    from ablate.data.cache import default_dir

    return default_dir()


def human(n: int) -> str:
    """Bytes as B, KiB, MiB or GiB."""
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"
