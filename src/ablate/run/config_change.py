"""A resume continues the run that started, on the config it started with (issue 32): a composed config
that changed since (a config file edited, a changed default) is refused naming the keys, unless
`ablate resume RUN_DIR --force` accepts it. The run's identity (run.json's `config_hash` and `config`)
is recorded by ablate.run.lifecycle. No torch import.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from ablate.errors import ConfigError
from ablate.run import rundir

log = logging.getLogger("ablate")
NEW_CONFIG_ENV = "ABLATE_ACCEPT_NEW_CONFIG"  # set by `ablate resume --force`: resume although the composed config changed


def check_same_config(run_dir: Path, info: dict[str, Any] | None, now: dict[str, Any], warn: bool = True) -> None:
    """A resume (a checkpoint to continue) whose composed config differs from the one the run started
    with (a config file edited since, a changed default) would train its remaining steps on another
    config and rewrite `.hydra/config.yaml` to it: refused naming the keys (ConfigError), unless
    `ablate resume RUN_DIR --force` accepts the new config. No checkpoint: the run starts over on it."""
    before = (info or {}).get("config_hash")
    if not before or before == now["config_hash"] or not rundir.checkpoints(run_dir):
        return
    changed = config_changes((info or {}).get("config") or {}, now["config"])
    shown = "; ".join(changed[:3]) + (f"; and {len(changed) - 3} more" if len(changed) > 3 else "")
    if os.environ.get(NEW_CONFIG_ENV):
        if warn:  # said once, by the run (the launching process checks it first, silently)
            log.warning("the composed config changed since this run started (%s): resuming with it (--force)",
                        shown)
        return
    raise ConfigError(f"the composed config changed since this run started: {shown or 'its hash'}; restore the "
                      f"config files, or resume with the new config: ablate resume {run_dir} --force")


def config_changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """`key (was X, now Y)` for every key, in config order, whose value differs."""
    a, b = flat(old), flat(new)
    return [f"{k} (was {a.get(k, '<absent>')}, now {b.get(k, '<absent>')})"
            for k in [*b, *(k for k in a if k not in b)] if a.get(k, "<absent>") != b.get(k, "<absent>")]


def flat(node: Any, prefix: str = "") -> dict[str, Any]:
    """A nested config as {dotted.key: leaf} (an empty node is a leaf)."""
    if isinstance(node, dict) and node:
        out: dict[str, Any] = {}
        for k, v in node.items():
            out.update(flat(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: node}
