"""Where ablate's files are: the config tree (conf/) and the cache (converted models, probes).

No heavy imports: the launching process uses these to compose a config.
"""

from __future__ import annotations

import os
from pathlib import Path


def conf_dir() -> str:
    """conf/ inside an installed wheel, else the repo's conf/ next to src/ (editable install)."""
    here = Path(__file__).resolve().parent
    for cand in (here / "conf", here.parents[1] / "conf"):
        if (cand / "config.yaml").is_file():
            return str(cand)
    raise FileNotFoundError("ablate: cannot find conf/config.yaml (broken install?)")


def cache_root() -> Path:
    """`$ABLATE_CACHE`, else `~/.cache/ablate` (XDG_CACHE_HOME respected)."""
    if os.environ.get("ABLATE_CACHE"):
        return Path(os.environ["ABLATE_CACHE"]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")).expanduser() / "ablate"


def sweeps_dir() -> str:
    """The shipped sweep files: sweeps/ inside an installed wheel, else the repo's sweeps/."""
    here = Path(__file__).resolve().parent
    for cand in (here / "sweeps", here.parents[1] / "sweeps"):
        if cand.is_dir():
            return str(cand)
    raise FileNotFoundError("ablate: cannot find the sweeps/ folder (broken install?)")
