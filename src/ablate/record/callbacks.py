"""The callbacks every run gets, part of the run directory contract (not config options):
metrics.jsonl, log windows that survive a resume, secrets masked in saved TrainingArguments,
checkpoints sealed; and a study's trial reporting to its study (`ReportToStudy`)."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from ablate.callbacks import FollowMetric
from ablate.errors import Pruned

log = logging.getLogger("ablate")


class MetricsJSONL(TrainerCallback):
    """Appends every log event to `<run_dir>/metrics.jsonl` (part of the run directory contract).

    Always installed by `ablate.train` (not a config option): `ablate compare` depends on the file.
    Only the main process writes. `time` is seconds since this process started training, plus the
    time recorded before a resume, so curves against wall-clock stay continuous.
    """

    def __init__(self, path: str | Path, time_offset: float = 0.0) -> None:
        self.path = Path(path)
        self.time_offset = time_offset
        self._t0 = time.monotonic()

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if not logs or not state.is_world_process_zero:
            return
        event = {"step": state.global_step, "time": round(self.time_offset + time.monotonic() - self._t0, 3)}
        event.update({k: v for k, v in logs.items() if isinstance(v, (int, float, str, bool))})
        with self.path.open("a") as f:
            f.write(json.dumps(event) + "\n")


class SealCheckpoint(TrainerCallback):
    """The last word on every checkpoint. Trainer pickles its TrainingArguments into it
    (training_args.bin): a secret given as one (`+method.args.hub_token=hf_...`) is masked there.
    Then, once every rank's files are in, `manifest.json` lists every file with its size and sha256
    (ablate.record.checkpoints.write_manifest): a resume takes only a checkpoint whose files match it.

    Always installed by ablate.train, first of ablate's callbacks (Trainer's own write nothing at
    on_save): on_save runs right after the trainer's `_save_checkpoint` (Trainer's files and the
    method's own, such as GRPO's generation buffer), and this one before any callback that may end
    the run there (SaveOnPreemption raises once the save is done)."""

    def on_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        from ablate.record import checkpoints

        ckpt = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        if args.should_save:
            mask_saved_args(ckpt, args)
        _barrier()  # every rank's rng_state_<rank>.pth is written before the manifest lists the files
        if args.should_save and ckpt.is_dir():
            checkpoints.write_manifest(ckpt)


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def mask_saved_args(directory: Path, args: TrainingArguments) -> None:
    """Rewrite `directory/training_args.bin` with secret-looking fields masked, whatever their type
    (a token given as a number, a dict of credentials), only if there is any."""
    import copy
    import dataclasses

    import torch

    from ablate.record.secrets import mask

    path = Path(directory) / "training_args.bin"
    changed = {
        f.name: masked
        for f in dataclasses.fields(args)
        if isinstance(v := getattr(args, f.name, None), (str, int, float, dict, list, tuple))
        and (masked := mask(v, key=f.name)) != (list(v) if isinstance(v, tuple) else v)
    }
    if not changed or not path.is_file():
        return
    masked = copy.copy(args)
    for name, value in changed.items():
        object.__setattr__(masked, name, value)
    torch.save(masked, path)


class LogAtSaveAndEnd(TrainerCallback):
    """Log at every checkpoint and at the last step, besides every `logging_steps`.

    Always installed by `ablate.train`. Each logged loss is the mean since the previous log, so with a
    log at every checkpoint a resumed run logs the same windows as an uninterrupted one, and the logs
    cover every step: summary.json's `train_loss` is computed from them across resumes.
    """

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if control.should_save or control.should_training_stop or state.global_step >= state.max_steps:
            control.should_log = True


def trial_callbacks() -> list[Any]:
    """[ReportToStudy] when this run is a study's trial (the sweeper set its environment,
    ablate.record.studies), else []."""
    import os

    from ablate.record.studies import METRIC_ENV, PRUNER_ENV, STORAGE_ENV, STUDY_ENV, TRIAL_ENV

    if not os.environ.get(TRIAL_ENV):
        return []
    return [
        ReportToStudy(
            os.environ[STORAGE_ENV],
            os.environ[STUDY_ENV],
            int(os.environ[TRIAL_ENV]),
            os.environ[METRIC_ENV],
            os.environ.get(PRUNER_ENV),
        )
    ]


class ReportToStudy(FollowMetric):
    """A run that is one trial of a study (hydra/sweeper=optuna) reports its metric to the study at every
    log event holding it (an eval's `eval_*` or a train metric), and the study's pruner may stop it
    (Optuna's protocol: `trial.report(value, step)`, then `trial.should_prune()`; Li et al. 2018
    Hyperband, Jamieson & Talwalkar 2016 successive halving, or the median rule of Google Vizier,
    Golovin et al. 2017). The sweeper sets the job's environment (ablate.record.studies); a pruned run
    ends through `Pruned`: ablate.record.lifecycle records status `pruned` with the step, saves no
    model, and the job counts as done (not failed)."""

    def __init__(
        self, storage_url: str, study_name: str, trial_id: int, metric: str, pruner: str | None = None
    ) -> None:
        from ablate.record.studies import pruner as make_pruner
        from ablate.record.studies import require_optuna, storage

        optuna = require_optuna()
        self.metric = metric
        study = optuna.load_study(
            study_name=study_name, storage=storage(storage_url), pruner=make_pruner(pruner)
        )
        self.trial = optuna.trial.Trial(study, trial_id)

    def on_metric(self, value: float, state: TrainerState, control: TrainerControl) -> None:
        if not state.is_world_process_zero:
            return
        self.trial.report(float(value), state.global_step)
        if self.trial.should_prune():
            log.warning(
                "trial %d pruned at step %d (%s=%.4g)",
                self.trial.number,
                state.global_step,
                self.metric,
                value,
            )
            raise Pruned(state.global_step, self.metric, float(value))


def run_callbacks(cfg: Any, run: Any) -> list[TrainerCallback]:
    """A run's callbacks: ablate's own (the run dir contract, SLURM preemption), the config's
    (`callbacks` group), a study trial's, the tracker's. `run`: its ablate.record.lifecycle.Run."""
    from hydra.utils import instantiate

    from ablate.process.preemption import SaveOnPreemption
    from ablate.record import rundir

    events = rundir.read_metrics(run.dir)  # already truncated to the resume point
    out = [
        SealCheckpoint(),  # first at on_save (SaveOnPreemption may raise there): secrets masked, seal last
        MetricsJSONL(run.dir / rundir.METRICS, time_offset=events[-1]["time"] if events else 0.0),
        SaveOnPreemption(),  # SLURM USR2: checkpoint at this step's end, requeue (no-op elsewhere)
        LogAtSaveAndEnd(),  # after SaveOnPreemption (it may ask for a save): resumes log the same windows
    ]
    out += [instantiate(c) for c in (cfg.callbacks or {}).values() if c is not None]
    out += run.study_callbacks()
    if run.tracker is not None and run.tracker.callback() is not None:
        out.append(run.tracker.callback())
    return out
