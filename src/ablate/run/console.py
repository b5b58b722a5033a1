"""Lines on the console while a tqdm progress bar may be drawn there. A bar redraws its own line
with `\\r` and no newline, so a plain print lands glued to the bar and is drawn over at its next
update: `write` puts a line above a live bar (for messages during training), `say` ends the live
bars first (for a last line: an error, `interrupted`). No import of tqdm: no bar, a plain print.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, TextIO


def _bars() -> list[Any]:
    std = sys.modules.get("tqdm.std")  # the base class of every tqdm bar (tqdm.auto's too)
    return [b for b in list(getattr(getattr(std, "tqdm", None), "_instances", [])) if not getattr(b, "disable", True)]


def write(text: str, file: TextIO | None = None) -> None:
    """`text` on lines of its own; a live bar is cleared and redrawn below it (tqdm.write)."""
    out = file or sys.stderr
    if _bars():
        sys.modules["tqdm.std"].tqdm.write(text, file=out)
        return
    print(text, file=out, flush=True)


def end_bars() -> None:
    """Close every live bar: its final state stays on a line of its own (a sweep's worker leaving
    ends its bar, so the sweep's one line below is not glued to it)."""
    for bar in _bars():
        try:
            bar.close()
        except Exception:  # noqa: BLE001 - a bar that cannot close must not hide the line
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
