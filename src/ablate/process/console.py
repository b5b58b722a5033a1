"""Lines on the console while a tqdm progress bar may be drawn there. A bar redraws its own line
with `\\r` and no newline, so a plain print lands glued to the bar and is drawn over at its next
update: `write` puts a line above a live bar (for messages during training), `say` ends the live
bars first (for a last line: an error, `interrupted`). The bars are the ones ablate drew and
`track`ed (the training bar, DPO's reference pass); no import of tqdm here: no bar, a plain print.
"""

from __future__ import annotations

import logging
import sys
import weakref
from typing import Any, TextIO

_bars: weakref.WeakSet[Any] = weakref.WeakSet()


def track(bar: Any) -> Any:
    """Remember a bar ablate drew, so `write` keeps it intact and `say` ends it first; returns it."""
    if bar is not None:
        _bars.add(bar)
    return bar


def _live() -> list[Any]:
    return [b for b in list(_bars) if not getattr(b, "disable", True)]  # tqdm sets disable on close()


def write(text: str, file: TextIO | None = None) -> None:
    """`text` on lines of its own; a live bar is cleared and redrawn below it (tqdm.write)."""
    out = file or sys.stderr
    if _live():
        type(_live()[0]).write(text, file=out)
        return
    print(text, file=out, flush=True)


def end_bars() -> None:
    """Close every live bar: its final state stays on a line of its own (a sweep's worker leaving
    ends its bar, so the sweep's one line below is not glued to it)."""
    for bar in _live():
        try:
            bar.close()
        except Exception:  # a bar that cannot close must not hide the line
            pass


def say(text: str, file: TextIO | None = None) -> None:
    """A last line: every live bar is closed first (its final state stays on a line of its own)."""
    end_bars()
    print(text, file=file or sys.stderr, flush=True)


def print_above_bar(text: str) -> None:
    """`text` on stdout on lines of its own (`write`), flushed before the bar is redrawn, so a pipe
    holding both streams keeps that order too."""
    write(text, file=sys.stdout)


def to_log_file(message: str, level: int = logging.INFO) -> None:
    """Write `message` to the run's ablate.log only (the file handlers Hydra set up), not the console."""
    logger = logging.getLogger("ablate")
    record = logger.makeRecord(logger.name, level, __file__, 0, message, None, None)
    for handler in logging.getLogger().handlers + logger.handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handle(record)


def print_result(summary: dict[str, Any], run_dir: Any) -> None:
    """A run's final metrics as a table, then its run dir on a line of its own (to paste)."""
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=f"{summary['method']} finished: {summary['status']} at step {summary.get('global_step')}"
    )
    table.add_column("metric")
    table.add_column("value", justify="right")
    for k, v in sorted(summary.get("metrics", {}).items()):
        table.add_row(k, f"{v:.4g}" if isinstance(v, float) else str(v))
    Console().print(table)
    if summary.get("note"):
        print(summary["note"])
    # plain print: rich would fold a long path at the terminal width (80 columns when piped) and
    # read `[...]` in it as markup; this line is meant to be pasted (ablate resume / compare)
    print(f"run dir: {run_dir}", flush=True)
