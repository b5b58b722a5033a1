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

from ablate.record import rundir
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


TABLE_ROWS = 2000  # examples in W&B's table at most (eval_examples.jsonl keeps every one)


def eval_key(metric: str) -> str:
    """eval.json's name of a metric as W&B gets it: the Trainer's `eval_x` in the `eval/` section, as the
    training's evals log it (`_Forward`); a backend's `lm_eval/...` or `judge/...` as it is."""
    return f"eval/{metric[5:]}" if metric.startswith("eval_") else metric


def _cell(value: Any) -> Any:
    """A table cell: text, a number, or nothing (W&B's table takes one type per column)."""
    return value if value is None or isinstance(value, (int, float, str)) else str(value)


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

    def resume(self, run_dir: Path, run_info: dict[str, Any], job_type: str | None = None) -> None:
        """Open the run's own W&B run again, by the id, group and name run.json recorded (a run trained
        without W&B gets a new id, recorded there too), to add what was measured after it trained."""
        import wandb

        os.environ.setdefault("WANDB_SILENT", "true")
        kwargs = mask(dict(self.kwargs))
        kwargs.update(group=run_info.get("wandb_group") or kwargs["group"])
        kwargs.update(name=run_info.get("wandb_name") or kwargs["name"] or Path(run_dir).name)
        kwargs.update(job_type=job_type or kwargs["job_type"])
        if "wandb_run_id" not in run_info:
            run_info["wandb_run_id"] = _new_id()
            rundir.write_json(Path(run_dir) / rundir.RUN, run_info)
        self.run = wandb.init(
            dir=str(run_dir), id=run_info["wandb_run_id"], resume="allow", reinit="finish_previous", **kwargs
        )

    def log_eval(
        self, run_dir: Path, run_info: dict[str, Any], metrics: dict[str, float], rows: list[dict[str, Any]]
    ) -> None:
        """eval.json's metrics into the run's own W&B run (resumed), as summary values under the names the
        training's eval got (`eval_x` -> `eval/x`; `lm_eval/...`, `judge/...` as they are), and the examples
        that have text (lm-eval's prompts and responses, the judge's prompt, both answers and scores) as a
        wandb.Table `eval/examples`."""
        import wandb

        self.resume(run_dir, run_info)
        self.run.summary.update({eval_key(k): v for k, v in metrics.items()})
        texts = [r for r in rows if any(isinstance(v, str) for k, v in r.items() if k not in ("id", "eval"))]
        if texts:
            columns = list(dict.fromkeys(k for r in texts for k in r))
            table = wandb.Table(
                columns=columns, data=[[_cell(r.get(c)) for c in columns] for r in texts[:TABLE_ROWS]]
            )
            self.run.log({"eval/examples": table})
        self.finish("completed")

    def finish(self, status: str) -> None:
        if self.run is not None:
            run, self.run = self.run, None
            run.finish(exit_code=0 if status in ("completed", "pruned") else 1)
            if self.kwargs["mode"] == "offline":
                print(f"W&B (offline): upload with `wandb sync {Path(run.dir).parent}`")
