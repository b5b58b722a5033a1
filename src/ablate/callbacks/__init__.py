"""Callbacks: *when* things happen (logging, stopping). Selected by `conf/callbacks/*.yaml`."""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments


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
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
        logs: dict[str, Any] | None = None, **kwargs: Any,
    ) -> None:
        if not logs or not state.is_world_process_zero:
            return
        event = {"step": state.global_step, "time": round(self.time_offset + time.monotonic() - self._t0, 3)}
        event.update({k: v for k, v in logs.items() if isinstance(v, (int, float, str, bool))})
        with self.path.open("a") as f:
            f.write(json.dumps(event) + "\n")


class MaskSavedArgs(TrainerCallback):
    """Trainer pickles its TrainingArguments into every checkpoint (training_args.bin); a secret given
    as one (`+method.args.hub_token=hf_...`) is masked there too. Always installed by ablate.train."""

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        if state.is_world_process_zero:
            mask_saved_args(Path(args.output_dir) / f"checkpoint-{state.global_step}", args)


def mask_saved_args(directory: Path, args: TrainingArguments) -> None:
    """Rewrite `directory/training_args.bin` with secret-looking string fields masked (only if any)."""
    import copy
    import dataclasses

    import torch

    from ablate.redact import mask

    path = Path(directory) / "training_args.bin"
    changed = {f.name: mask(v, key=f.name) for f in dataclasses.fields(args)
               if isinstance(v := getattr(args, f.name, None), str) and mask(v, key=f.name) != v}
    if not changed or not path.is_file():
        return
    masked = copy.copy(args)
    for name, value in changed.items():
        object.__setattr__(masked, name, value)
    torch.save(masked, path)


class PrintLogs(TrainerCallback):
    """The TRL docs' custom logging callback: print every log event (an example of `on_log`)."""

    def on_log(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
        logs: dict[str, Any] | None = None, **kwargs: Any,
    ) -> None:
        if logs is not None and state.is_world_process_zero:
            print(f"Step {state.global_step}: {logs}")


class NaNGuard(TrainerCallback):
    """Stop the run when a logged loss is NaN/inf, instead of training on garbage.

    Raises, so the run ends with `status: failed` and the offending step in the error message.
    """

    def __init__(self, metrics: tuple[str, ...] = ("loss", "grad_norm")) -> None:
        self.metrics = tuple(metrics)

    def on_log(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
        logs: dict[str, Any] | None = None, **kwargs: Any,
    ) -> None:
        for name in self.metrics:
            v = (logs or {}).get(name)
            if isinstance(v, float) and not math.isfinite(v):
                raise FloatingPointError(f"{name} is {v} at step {state.global_step}: stopping (NaNGuard)")


class EarlyStop(TrainerCallback):
    """Stop training when `metric` has not improved by `min_delta` for `patience` log events in a row.

    Works on any logged number: a train metric (`loss`, `rewards/accuracies`) checked every
    `logging_steps`, or an eval metric (`eval_loss`) checked every evaluation. Unlike transformers'
    `EarlyStoppingCallback` it needs neither `load_best_model_at_end` nor checkpoints at every eval.
    A stopped run ends normally (`status: completed`) at the step it stopped; the reason is logged.
    """

    def __init__(self, metric: str = "eval_loss", mode: str = "min", patience: int = 3, min_delta: float = 0.0) -> None:
        if mode not in ("min", "max"):
            raise ValueError(f"EarlyStop: mode must be 'min' or 'max', got {mode!r}")
        self.metric, self.sign, self.patience, self.min_delta = metric, 1.0 if mode == "min" else -1.0, patience, min_delta
        self.best: float | None = None
        self.bad = 0  # log events since the last improvement

    def on_log(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
        logs: dict[str, Any] | None = None, **kwargs: Any,
    ) -> None:
        v = (logs or {}).get(self.metric)
        if not isinstance(v, (int, float)):
            return
        if self.best is None or self.sign * (self.best - v) > self.min_delta:  # improved (lower for min)
            self.best, self.bad = float(v), 0
            return
        self.bad += 1
        if self.bad >= self.patience:
            logging.getLogger("ablate").info(
                "EarlyStop: %s did not improve on %.6g for %d log events; stopping at step %d",
                self.metric, self.best, self.bad, state.global_step,
            )
            control.should_training_stop = True


class LogAtSaveAndEnd(TrainerCallback):
    """Log at every checkpoint and at the last step, besides every `logging_steps`.

    Always installed by `ablate.train`. Each logged loss is the mean since the previous log, so with a
    log at every checkpoint a resumed run logs the same windows as an uninterrupted one, and the logs
    cover every step: summary.json's `train_loss` is computed from them across resumes.
    """

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        if control.should_save or control.should_training_stop or state.global_step >= state.max_steps:
            control.should_log = True
