"""Composing a run's config: Hydra's resolvers for run-dir names, the launch time every process of
one launch shares, and override values quoted for Hydra's grammar.

No torch import here: `ablate train --cfg job` composes and prints in about a second.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
from datetime import datetime

UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")  # a run dir's name holds letters, digits and . _ - only: shell-safe
SLUG_LIMIT = 60  # characters of overrides in a run dir's name (its hash suffix aside)


def dirname_suffix(overrides: str, limit: int = SLUG_LIMIT) -> str:
    """A run dir's name after its time (a sweep job's: after its number), from Hydra's override_dirname
    (`k=v,k2=v2`, sorted): short, readable and shell-safe. Each override as `<its key's last part>-<value>`
    (`method.args.max_steps=400` -> `max_steps-400`, `method/dpo_loss=ipo` -> `dpo_loss-ipo`), those whose
    key has no `.` (group choices, seed) first, joined by `_`,
    brackets and quotes dropped, any other character as `_`, cut to `limit` characters, then `-` and 8 hex
    digits of the overrides' sha1: names shortened alike (`a.beta=1`, `b.beta=1`) stay apart. The overrides
    themselves are in run.json."""
    if not overrides:
        return ""
    from ablate.record.secrets import mask_text

    parts: list[tuple[bool, str]] = []
    for item in _items(mask_text(overrides)):  # `+model.token=hf_...` must not name a directory
        key, sep, value = item.partition("=")
        short = re.split(r"[./]", key.lstrip("+~"))[-1]
        parts.append(("." in key, f"{short}-{value}" if sep else short))
    # choices (seed=1, method/dpo_loss=ipo) first
    joined = "_".join(p for _, p in sorted(parts, key=lambda p: p[0]))
    slug = UNSAFE.sub("_", re.sub(r"[][{}'\"]", "", joined))[:limit].strip("_.-")  # brackets, quotes dropped
    digest = hashlib.sha1(overrides.encode()).hexdigest()[:8]
    return f"_{slug}-{digest}" if slug else f"_{digest}"


def _items(overrides: str) -> list[str]:
    """Hydra's override_dirname split into its overrides: at commas outside brackets, braces and quotes
    (`data.reward_funcs=[a.f,b.g],seed=1` is two)."""
    items, depth, quote, start = [], 0, "", 0
    for i, ch in enumerate(overrides):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "[{(":
            depth += 1
        elif ch in "]})":
            depth = max(depth - 1, 0)
        elif ch == "," and depth == 0:
            items.append(overrides[start:i])
            start = i + 1
    return [*items, overrides[start:]]


LAUNCH_TIME_ENV = "ABLATE_LAUNCH_TIME"


def _launch_time() -> datetime:
    """When this run was launched. Every process of one launch must name the same dirs, yet each
    composes its own config: a multirun's job processes (joblib workers, SLURM jobs) inherit the
    launching process's time in ABLATE_LAUNCH_TIME (set by `publish_launch_time`); torchrun ranks
    share their launcher (the torchrun agent, their parent process), whose start time is the same
    for all of them; several nodes' agents are not one process: the user exports the same value on each."""
    if os.environ.get(LAUNCH_TIME_ENV):  # ISO (what publish_launch_time writes) or Unix seconds (`date +%s`)
        value = os.environ[LAUNCH_TIME_ENV].strip()
        return (
            datetime.fromtimestamp(float(value))
            if value.replace(".", "", 1).isdigit()
            else datetime.fromisoformat(value)
        )
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
    """ablate's resolvers: what any composition of conf/ needs first (its structured configs are served by
    hydra_plugins.ablate_schemas, as each is selected)."""
    from omegaconf import OmegaConf

    from ablate.config import store

    if not OmegaConf.has_resolver("ablate_data_or_default"):  # GRPO's max_completion_length: the data's
        OmegaConf.register_new_resolver("ablate_data_or_default", store.data_or_default)

    if not OmegaConf.has_resolver("ablate_dirname"):
        OmegaConf.register_new_resolver("ablate_dirname", dirname_suffix)
    if not OmegaConf.has_resolver("ablate_now"):  # like Hydra's ${now:fmt}, the same for every rank
        OmegaConf.register_new_resolver("ablate_now", lambda fmt: _launched().strftime(fmt))
    if not OmegaConf.has_resolver("ablate_div"):  # GRPO's prompts per batch: completions / num_generations
        OmegaConf.register_new_resolver("ablate_div", lambda a, b: max(int(a) // int(b), 1))


def quote_override_value(value: str) -> str:
    """`value` as one quoted value of Hydra's override grammar: run-dir names hold `=` and `,`, a cwd
    may hold spaces or quotes. Inside single quotes only a quote, and backslashes before a quote or
    the closing quote, are escaped (hydra/grammar/OverrideLexer.g4, QUOTED_VALUE)."""
    return "'" + re.sub(r"(\\*)('|$)", lambda m: m.group(1) * 2 + ("\\'" if m.group(2) else ""), value) + "'"
