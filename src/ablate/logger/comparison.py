"""`ablate compare --wandb`: the comparison into the compared runs' W&B group. Imports neither torch nor
transformers (ablate compare stays light), wandb only when called."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ablate.record import rundir

DEFAULTS = {"project": "ablate", "entity": None, "mode": "offline"}  # WandbTracker's (conf/logger/wandb.yaml)


def log_comparison(outcomes: list[dict[str, Any]]) -> list[str]:
    """`ablate compare --wandb`: each table it printed into a W&B run of the compared runs' group (the
    sweep's, recorded in their run.json), job_type `compare`, in the project, entity and mode their config
    used (logger.*): `compare/arms` (the table: per-arm means and 95% intervals), `compare/differences`
    (each paired difference, probability of improvement and per-example difference, with its interval) and
    `compare/verdicts` (the summary in words). Offline, the files go under the sweep dir's wandb/. Returns
    where each went; ConfigError (one line) when the runs never logged to W&B."""
    import wandb

    from ablate.errors import ConfigError

    os.environ.setdefault("WANDB_SILENT", "true")
    where = []
    for outcome in outcomes:
        runs = [Path(p) for p in outcome["runs"]]
        infos = [rundir.read_json(p / rundir.RUN) or {} for p in runs]
        groups = [i["wandb_group"] for i in infos if i.get("wandb_group")]
        if not groups:
            raise ConfigError(
                "--wandb: these runs did not log to W&B (no wandb_group in their run.json: train them with "
                "logger=wandb), so there is no group to log the comparison to"
            )
        group = max(set(groups), key=groups.count)
        settings = _logger_settings(runs[0])
        home = Path(os.path.commonpath([str(p.resolve().parent) for p in runs]))
        run = wandb.init(
            dir=str(home),
            group=group,
            name=f"compare {group}",
            job_type="compare",
            reinit="finish_previous",
            **settings,
        )
        run.log(
            {
                "compare/arms": wandb.Table(columns=outcome["header"], data=outcome["cells"]),
                "compare/differences": wandb.Table(
                    columns=["difference"], data=[[d] for d in outcome["differences"]]
                ),
                "compare/verdicts": wandb.Table(columns=["verdict"], data=[[w] for w in outcome["words"]]),
            }
        )
        run.finish()
        where.append(f"group {group}" + (f" (offline: {run.dir})" if settings["mode"] == "offline" else ""))
    return where


def _logger_settings(run_dir: Path) -> dict[str, Any]:
    """The project, entity and mode a run logged with (its .hydra/config.yaml's logger node; a value left to
    ablate's default there: WandbTracker's)."""
    import yaml

    try:
        node = (yaml.safe_load((run_dir / rundir.HYDRA / "config.yaml").read_text()) or {}).get(
            "logger"
        ) or {}
    except (OSError, yaml.YAMLError):
        node = {}
    out = {}
    for key, default in DEFAULTS.items():
        value = node.get(key)
        out[key] = default if value is None or str(value).startswith("${") else value
    return out
