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


def hub_unreachable(timeout: float = 3.0) -> str | None:
    """Why the Hugging Face Hub (HF_ENDPOINT, else huggingface.co) cannot be reached, or None when a
    TCP connection opens (or offline mode is set: then the library reads its cache and says so).
    huggingface_hub retries a failed request 5 times per file with a warning each (~25 s, ~20 lines)
    before it gives up: a model or dataset that is neither local nor cached is refused at once instead."""
    import socket
    from urllib.parse import urlparse

    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        return None
    url = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    host, port = url.hostname or "huggingface.co", url.port or (80 if url.scheme == "http" else 443)
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as e:
        return f"{host} cannot be reached ({e.strerror or e})"
    return None


def local_model_path(value: str) -> str | None:
    """Why a model path (model.path, teacher.path: `from_pretrained`'s) is a local path, or None when it is a
    hub id. Local: it starts with `/`, `.` or `~`, it exists here, its first folder exists here
    (`outputs/run/model` with ./outputs/), or it cannot be a hub id (huggingface_hub's rule: NAME or
    ORG/NAME). `from_pretrained` would try a missing local path as a hub id, and say so in words about
    repo ids, after the run dir exists."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    path = Path(value).expanduser()
    if value.startswith(("/", ".", "~")):
        return "a path"
    if path.exists():
        return "it exists here"
    if len(path.parts) > 1 and Path(path.parts[0]).is_dir():
        return f"./{path.parts[0]} is a folder here"
    try:
        validate_repo_id(value)
    except HFValidationError:
        return "it cannot be a hub id (NAME or ORG/NAME)"
    return None
