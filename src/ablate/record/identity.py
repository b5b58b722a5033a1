"""A run's identity, recorded in run.json and checked whenever the dir is used again: the command
that made it (its overrides, launch context, versions), the config it composed (resolved, masked,
hashed) and the data it read (rows and sha256 per split). A resume on another command, config or data
is refused in one line, unless `ablate resume RUN_DIR --force` accepts the new config or data."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from ablate.errors import ConfigError
from ablate.record import checkpoints, rundir, secrets

log = logging.getLogger("ablate")
NEW_DATA_ENV = "ABLATE_ACCEPT_NEW_DATA"  # set by `ablate resume --force`: resume although the data changed
# set by `ablate resume --force`: resume although the composed config changed
NEW_CONFIG_ENV = "ABLATE_ACCEPT_NEW_CONFIG"
# set by `ablate resume` on another rank count: the keys it changed to keep the global batch (accepted)
RESIZED_ENV = "ABLATE_RESUME_RESIZED"
# method keys that only describe the method (ablate.schema.method: what defines each metric, its kind of rows,
# what plan counts), left out of its identity: a run started before a method declared them resumes
COMPARE_ONLY = {"defined_by", "data_kind", "rows", "reference", "generates"}
# where a run's rollout server is and how long to wait for it (method/rollouts=vllm_server), not what the run
# trains: a run whose server moved or restarted elsewhere is the same run, resumed with the new address.
# Its node is composed at method.rollouts and resolved again into the trainer's `generator`
WHERE_NODES = ("method.rollouts", "method.trainer.generator")
WHERE_KEYS = (
    "url",
    "start",
    "start_on",
    "sbatch_args",
    "ray_address",
    "ray_resources",
    "group_host",
    "timeout_s",
    "start_timeout_s",
)
WHERE = {f"{node}.{k}" for node in WHERE_NODES for k in WHERE_KEYS}


def claim(run_dir: Path, overrides: list[str]) -> dict[str, Any]:
    """Record (or check) the run's identity: a dir is resumed only by the same command; a dir that
    is neither empty nor an ablate run, or whose run.json is corrupt, is refused (RunDirError)."""
    rundir.is_usable(run_dir)
    info = rundir.read_json_checked(run_dir / rundir.RUN)
    if info is not None:
        same_run(run_dir, info, overrides)
        return info
    info = {
        "overrides": overrides,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "versions": rundir.versions(),
        "git_sha": rundir.git_sha(),
        **_launch_context(),
    }
    rundir.write_json(run_dir / rundir.RUN, info)
    return info


def same_overrides(recorded: list[str], given: list[str]) -> bool:
    """The same command: `given` as recorded (masked)."""
    resized = _resized_keys()  # `ablate resume` on another rank count changed these keys itself
    kept = [
        [o for o in map(str, x) if o.split("=", 1)[0].lstrip("+~") not in resized | WHERE]
        for x in (recorded, secrets.mask(given))
    ]
    return sorted(kept[0]) == sorted(kept[1])


def _resized_keys() -> set[str]:
    return set(filter(None, os.environ.get(RESIZED_ENV, "").split(",")))


def same_run(run_dir: Path, info: dict[str, Any] | None, overrides: list[str]) -> None:
    if info is not None and not same_overrides(info.get("overrides", []), overrides):
        raise ConfigError(
            f"{run_dir} holds another run (overrides {info.get('overrides')}); "
            "pick a new hydra.run.dir, or repeat that run's exact overrides to resume it"
        )


def _launch_context() -> dict[str, Any]:
    """What `ablate resume` needs beyond the overrides to compose the same config: the --config-dir
    given at launch (method/my_hinge.yaml lives there) and the PYTHONPATH its _target_s import from."""
    out: dict[str, Any] = {}
    dirs = [s.path for s in HydraConfig.get().runtime.config_sources if s.provider == "command-line"]
    if dirs:
        out["config_dir"] = str(Path(dirs[0].split("://", 1)[-1]).resolve())
    paths = [str(Path(p).resolve()) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if paths:
        out["pythonpath"] = paths
    return out


def identity(cfg: DictConfig) -> dict[str, Any]:
    """What a job's run.json records of its config: the resolved config, secrets masked as every
    record is (ablate.record.secrets: a resolved `${oc.env:HF_TOKEN}` becomes ***), and its hash (of the
    masked config: a rotated token does not change the job; a resumed sweep compares it)."""
    resolved = secrets.mask(OmegaConf.to_container(cfg, resolve=True))
    # how `ablate compare` reads the metrics: trains nothing differently
    if isinstance(resolved.get("method"), dict):
        resolved["method"] = {k: v for k, v in resolved["method"].items() if k not in COMPARE_ONLY}
    return {"config_hash": config_hash(_without_where(resolved)), "config": resolved}


def _without_where(resolved: dict[str, Any]) -> dict[str, Any]:
    """The config without the WHERE keys (a copy): what the run trains."""

    def strip(node: Any, path: list[str]) -> Any:
        if not isinstance(node, dict):
            return node
        if not path:
            return {k: v for k, v in node.items() if k not in WHERE_KEYS}
        head, *rest = path
        return {**node, head: strip(node[head], rest)} if head in node else node

    for where in WHERE_NODES:
        resolved = strip(resolved, where.split("."))
    return resolved


def check_same_config(
    run_dir: Path, info: dict[str, Any] | None, now: dict[str, Any], warn: bool = True
) -> None:
    """A resume (a checkpoint to continue) whose composed config differs from the one the run started
    with (a config file edited since, a changed default) would train its remaining steps on another
    config and rewrite `.hydra/config.yaml` to it: refused naming the keys (ConfigError), unless
    `ablate resume RUN_DIR --force` accepts the new config. No checkpoint: the run starts over on it."""
    before = (info or {}).get("config_hash")
    if not before or same_config(info or {}, now) or not checkpoints.checkpoints(run_dir):
        return
    changed = [
        c
        for c in config_changes((info or {}).get("config") or {}, now["config"])
        if c.split(" (was ", 1)[0] not in _resized_keys()
    ]
    if not changed:  # only what `ablate resume` changed for another rank count
        return
    shown = "; ".join(changed[:3]) + (f"; and {len(changed) - 3} more" if len(changed) > 3 else "")
    if os.environ.get(NEW_CONFIG_ENV):
        if warn:  # said once, by the run (the launching process checks it first, silently)
            log.warning(
                "the composed config changed since this run started (%s): resuming with it (--force)", shown
            )
        return
    raise ConfigError(
        f"the composed config changed since this run started: {shown or 'its hash'}; restore the "
        f"config files, or resume with the new config: ablate resume {run_dir} --force"
    )


def same_config(info: dict[str, Any], now: dict[str, Any]) -> bool:
    """run.json's config is `now`'s (`identity`): the same hash."""
    return info.get("config_hash") == now["config_hash"]


def config_changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """`key (was X, now Y)` for every key, in config order, whose value differs."""
    a, b = _flat(_without_where(old)), _flat(_without_where(new))
    return [
        f"{k} (was {a.get(k, '<absent>')}, now {b.get(k, '<absent>')})"
        for k in [*b, *(k for k in a if k not in b)]
        if a.get(k, "<absent>") != b.get(k, "<absent>")
    ]


def _flat(node: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(node, dict) and node:
        out: dict[str, Any] = {}
        for k, v in node.items():
            out.update(_flat(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: node}


def config_hash(resolved: Any) -> str:
    return hashlib.sha256(json.dumps(resolved, sort_keys=True, default=str).encode()).hexdigest()[:16]


def data_fingerprint(data: Any) -> dict[str, Any]:
    """Rows and sha256 of the train and eval splits as loaded (after `max_*_samples` and `columns`):
    of the rows themselves, so it is the same wherever the data comes from (a file, the hub, a loader
    of the user's) and changes with any edit that reaches training."""
    out: dict[str, Any] = {}
    for split in ("train", "eval"):
        ds = getattr(data, split, None)
        if ds is None:
            out[split] = None
            continue
        h = hashlib.sha256()
        for batch in ds.iter(batch_size=1024):
            h.update(json.dumps(batch, sort_keys=True, default=str).encode())
        out[split] = {"rows": len(ds), "sha256": h.hexdigest()}
    return out
