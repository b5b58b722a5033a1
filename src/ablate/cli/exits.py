"""How a command ends on a user's mistake: `ablate: error: <one line>` on stderr, exit 2, said the same
way by every command (ablate.cli.refuse adds where the command's usage is, for argument mistakes)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import NoReturn


def fail(line: str) -> NoReturn:
    """Exit 2 with `ablate: error: LINE` on stderr."""
    print(f"ablate: error: {line}", file=sys.stderr)
    sys.exit(2)


TORCHRUN = "TORCHELASTIC_RUN_ID"  # set by torchrun in every process it starts


def fail_job(line: str) -> NoReturn:
    """`fail` for a mistake every rank of a torchrun job sees alike (its command, its run dir, before any
    work): said once, by rank 0, which exits 2 once the node's other ranks have exited 0, so torchrun reports
    one failed process rather than a line per rank and a SIGTERM'd process each (torchrun's own traceback
    and summary of that one failure no process of its can silence). Outside torchrun: `fail`."""
    if TORCHRUN not in os.environ:
        fail(line)
    if int(os.environ.get("RANK", "0")) != 0:
        sys.exit(0)  # rank 0 says it
    import psutil

    try:  # torchrun's agent started this node's ranks: they are its children
        others = [p for p in psutil.Process(os.getppid()).children() if p.pid != os.getpid()]
        psutil.wait_procs(others, timeout=10)
    except psutil.Error:
        pass
    fail(line)


@contextmanager
def user_errors(*kinds: type[Exception], say: Callable[[str], NoReturn] = fail) -> Iterator[None]:
    """An exception of `kinds` raised inside (a RunDirError, a ConfigError: its message is the line) ends the
    command with its message (`say`: `fail`, or `fail_job` where every rank sees it); any other propagates."""
    try:
        yield
    except kinds as e:
        say(str(e))


@contextmanager
def one_line_errors() -> Iterator[None]:
    """A user's mistake raised inside, in Hydra's or instantiate's wrapping too, ends the command with its one
    line (ablate.config.hints.one_line tells a mistake from a bug); a bug is raised again, traceback and
    all."""
    from ablate.config.hints import one_line

    try:
        yield
    except Exception as e:
        line = one_line(e)
        if line is None:
            raise
        fail(line)
