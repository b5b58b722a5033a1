"""Errors a user can fix: reported as one line, never as a traceback page."""

from __future__ import annotations

from ablate.rundir import RunDirError


class ConfigError(ValueError):
    """A config value ablate refuses (checked before any model is built)."""


class DataError(ValueError):
    """Bad or missing data: reported to the user as one line."""


# FloatingPointError: NaNGuard stopping a diverged run is the user's to fix (lr, precision), not a bug.
USER_ERRORS: tuple[type[BaseException], ...] = (ConfigError, DataError, RunDirError, FloatingPointError)
