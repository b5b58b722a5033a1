"""Composing a run's config: Hydra's resolvers for run-dir names, the launch time every process of
one launch shares, and override values quoted for Hydra's grammar (old spellings: ablate.config.moved).

No torch import here: `ablate train --cfg job` composes and prints in about a second.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
from datetime import datetime


def _dirname(overrides: str, limit: int = 100) -> str:
    """Run-dir suffix from the overrides: filesystem-safe, bounded in length (hash keeps it unique)."""
    if not overrides:
        return ""
    from ablate.record.secrets import mask_text

    overrides = mask_text(overrides)  # `+model.token=hf_...` must not name a directory
    safe = re.sub(r"[^A-Za-z0-9=,._+-]", "_", overrides)
    if len(safe) > limit:
        safe = safe[:limit] + "-" + hashlib.sha1(overrides.encode()).hexdigest()[:8]
    return "_" + safe


LAUNCH_TIME_ENV = "ABLATE_LAUNCH_TIME"


def _launch_time() -> datetime:
    """When this run was launched. Every process of one launch must name the same dirs, yet each
    composes its own config: a multirun's job processes (joblib workers, SLURM jobs) inherit the
    launching process's time in ABLATE_LAUNCH_TIME (set by `publish_launch_time`); torchrun ranks
    share their launcher (the torchrun agent, their parent process), whose start time is the same
    for all of them; several nodes' agents are not one process: the user exports the same value on each."""
    if os.environ.get(LAUNCH_TIME_ENV):  # ISO (what publish_launch_time writes) or Unix seconds (`date +%s`)
        value = os.environ[LAUNCH_TIME_ENV].strip()
        return datetime.fromtimestamp(float(value)) if value.replace(".", "", 1).isdigit() else datetime.fromisoformat(value)
    if "TORCHELASTIC_RUN_ID" in os.environ:
        import psutil

        return datetime.fromtimestamp(psutil.Process(os.getppid()).create_time())
    return datetime.now()


@functools.lru_cache(maxsize=1)
def _launched() -> datetime:
    return _launch_time()


def publish_launch_time() -> None:
    """Hand this process's launch time to the processes it starts from now on (a multirun's
    jobs), so `${ablate_now:...}` in hydra.sweep.dir resolves to the same folder in all of them."""
    os.environ[LAUNCH_TIME_ENV] = _launched().isoformat()


def register_resolvers() -> None:
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver("ablate_dirname"):
        OmegaConf.register_new_resolver("ablate_dirname", _dirname)
    if not OmegaConf.has_resolver("ablate_now"):  # like Hydra's ${now:fmt}, the same for every rank
        OmegaConf.register_new_resolver("ablate_now", lambda fmt: _launched().strftime(fmt))
    if not OmegaConf.has_resolver("ablate_div"):  # GRPO's prompts per batch: completions / num_generations
        OmegaConf.register_new_resolver("ablate_div", lambda a, b: max(int(a) // int(b), 1))


def quote_override_value(value: str) -> str:
    """`value` as one quoted value of Hydra's override grammar: run-dir names hold `=` and `,`, a cwd
    may hold spaces or quotes. Inside single quotes only a quote, and backslashes before a quote or
    the closing quote, are escaped (hydra/grammar/OverrideLexer.g4, QUOTED_VALUE)."""
    return "'" + re.sub(r"(\\*)('|$)", lambda m: m.group(1) * 2 + ("\\'" if m.group(2) else ""), value) + "'"
