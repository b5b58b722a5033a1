"""How a command ends on a user's mistake: `ablate: error: <one line>` on stderr, exit 2, said the same
way by every command (ablate.cli.refuse adds where the command's usage is, for argument mistakes)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn


def fail(line: str) -> NoReturn:
    """Exit 2 with `ablate: error: LINE` on stderr."""
    print(f"ablate: error: {line}", file=sys.stderr)
    sys.exit(2)


@contextmanager
def user_errors(*kinds: type[Exception]) -> Iterator[None]:
    """An exception of `kinds` raised inside (a RunDirError, a ConfigError: its message is the line) ends the
    command with its message; any other propagates."""
    try:
        yield
    except kinds as e:
        fail(str(e))


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
