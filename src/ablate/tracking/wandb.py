"""Weights & Biases, owned by ablate: one W&B run per job, finished in `finally`.

transformers' WandbCallback never calls `wandb.finish()` and wandb reuses an open run, so in a
sequential multirun every job would log into the first job's run. ablate therefore turns the
Trainer's integrations off (`report_to=none`) and drives W&B itself.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments


class _Forward(TrainerCallback):
    def __init__(self, run: Any) -> None:
        self.run = run

    def on_log(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
        logs: dict[str, Any] | None = None, **kwargs: Any,
    ) -> None:
        if logs and state.is_world_process_zero:
            data = {k: v for k, v in logs.items() if isinstance(v, (int, float))}
            # eval_x -> eval/x and x -> train/x, W&B's section convention (as transformers does)
            data = {(f"eval/{k[5:]}" if k.startswith("eval_") else f"train/{k}"): v for k, v in data.items()}
            self.run.log(data, step=state.global_step)


class WandbTracker:
    def __init__(
        self,
        project: str = "ablate",
        entity: str | None = None,
        mode: str = "offline",
        group: str | None = None,
        name: str | None = None,
        job_type: str | None = None,
        tags: list[str] | None = None,
    ) -> None:
        self.kwargs = dict(project=project, entity=entity, mode=mode, group=group, name=name,
                           job_type=job_type, tags=list(tags or []))
        self.run: Any = None

    def start(self, config: dict[str, Any], run_dir: Path, run_info: dict[str, Any]) -> None:
        import wandb

        os.environ.setdefault("WANDB_SILENT", "true")
        # The same id on resume (stored in run.json by ablate.train) continues the same W&B run.
        run_id = run_info.setdefault("wandb_run_id", wandb.util.generate_id())
        self.run = wandb.init(dir=str(run_dir), id=run_id, resume="allow", config=config,
                              reinit="finish_previous", **self.kwargs)

    def callback(self) -> TrainerCallback | None:
        return _Forward(self.run) if self.run is not None else None

    def finish(self, status: str) -> None:
        if self.run is not None:
            self.run.finish(exit_code=0 if status == "completed" else 1)
            if self.kwargs["mode"] == "offline":
                print(f"W&B (offline): upload with `wandb sync {Path(self.run.dir).parent}`")
            self.run = None
