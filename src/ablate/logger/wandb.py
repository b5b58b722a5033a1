"""Weights & Biases, owned by ablate: one W&B run per job, finished in `finally`.

transformers' WandbCallback never calls `wandb.finish()` and wandb reuses an open run, so in a
sequential multirun every job would log into the first job's run. ablate therefore turns the
Trainer's integrations off (`report_to=none`) and drives W&B itself:

- one run per job: `reinit="finish_previous"` plus `finish()` from `ablate.train`'s `finally`;
- `group` = the sweep (`<sweep_name>/<sweep dir name>`, i.e. `<name>/<date-time>` by default),
  `name` = the job's overrides (a run without overrides: its run dir's name), `job_type` = the method,
  `tags` += the sweep name, `config` = the resolved Hydra config;
- files under `<run_dir>/wandb/` (offline by default; `wandb sync` command printed at the end);
- the run id lives in run.json, so a resumed job (same run dir) continues the same W&B run;
- secrets (`WANDB_API_KEY`, `HF_TOKEN`, `hf_...`, `*_token` keys) are masked in the config and the
  command line W&B records (ablate.record.secrets).
"""

from __future__ import annotations

import os
import secrets
import string
from pathlib import Path
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from ablate.record.secrets import mask, mask_text
from ablate.schema.nodes import Wandb


class _Forward(TrainerCallback):
    def __init__(self, run: Any) -> None:
        self.run = run

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if logs and state.is_world_process_zero:
            data = {k: v for k, v in logs.items() if isinstance(v, (int, float))}
            # eval_x -> eval/x and x -> train/x, W&B's section convention (as transformers does)
            data = {(f"eval/{k[5:]}" if k.startswith("eval_") else f"train/{k}"): v for k, v in data.items()}
            self.run.log(data, step=state.global_step)


def job_identity(run_dir: Path, sweep_name: str | None) -> dict[str, Any]:
    """W&B group and name of the current Hydra job: in a multirun, group `<sweep_name>/<sweep dir
    name>` (its date-time by default) and name = the job's overrides; a single run has no group."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized():
        return {"group": None, "name": run_dir.name}
    hc = HydraConfig.get()
    name = hc.job.override_dirname or run_dir.name  # overrides, sorted, without sweep_name
    if hc.mode == RunMode.MULTIRUN:
        return {"group": f"{sweep_name or 'multirun'}/{Path(hc.sweep.dir).name}", "name": name}
    return {"group": None, "name": name}


def _new_id() -> str:
    return "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))


class WandbTracker:
    def __init__(
        self,
        project: str = Wandb.project,
        entity: str | None = Wandb.entity,
        mode: str = Wandb.mode,
        group: str | None = Wandb.group,
        name: str | None = Wandb.name,
        job_type: str | None = None,
        tags: list[str] | None = None,
    ) -> None:
        self.kwargs = dict(
            project=project,
            entity=entity,
            mode=mode,
            group=group,
            name=name,
            job_type=job_type,
            tags=list(tags or []),
        )
        self.run: Any = None

    def start(self, config: dict[str, Any], run_dir: Path, run_info: dict[str, Any]) -> None:
        """Open this job's W&B run; records its id in `run_info` (ablate.train saves it to run.json)."""
        import wandb

        os.environ.setdefault("WANDB_SILENT", "true")
        ident = job_identity(Path(run_dir), config.get("sweep_name"))
        kwargs = mask(dict(self.kwargs))  # logger.tags / logger.name are free text
        kwargs["group"] = kwargs["group"] or ident["group"]
        kwargs["name"] = mask_text(kwargs["name"] or ident["name"])  # the overrides may hold a secret
        # root `tags=[...]`
        kwargs["tags"] = [*kwargs["tags"], *map(str, mask(list(config.get("tags") or [])))]
        kwargs["notes"] = mask(config.get("notes"))  # root `notes="..."`
        if ident["group"]:  # sweep runs are tagged with the sweep's name, to filter across launches
            kwargs["tags"] = [*kwargs["tags"], str(config.get("sweep_name"))]
        # The same id on resume (stored in run.json by ablate.train) continues the same W&B run.
        run_id = run_info.setdefault("wandb_run_id", _new_id())
        run_info["wandb_group"], run_info["wandb_name"] = kwargs["group"], kwargs["name"]
        self.run = wandb.init(
            dir=str(run_dir),
            id=run_id,
            resume="allow",
            config=mask(config),
            reinit="finish_previous",
            **kwargs,
        )

    def add_config(self, values: dict[str, Any]) -> None:
        """Config known only once the trainer exists (the speed plan), added to the run's config."""
        if self.run is not None:
            self.run.config.update(mask(values), allow_val_change=True)

    def callback(self) -> TrainerCallback | None:
        return _Forward(self.run) if self.run is not None else None

    def finish(self, status: str) -> None:
        if self.run is not None:
            run, self.run = self.run, None
            run.finish(exit_code=0 if status in ("completed", "pruned") else 1)
            if self.kwargs["mode"] == "offline":
                print(f"W&B (offline): upload with `wandb sync {Path(run.dir).parent}`")
