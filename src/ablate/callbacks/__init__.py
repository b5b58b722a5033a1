"""Callbacks a user selects: *when* things happen (printing, stopping). `conf/callbacks/*.yaml`;
the debug presets' callbacks are in `debug`; `learned` says when a finished run's progress metric
never moved. The callbacks every run gets are `ablate.record.callbacks`."""

from __future__ import annotations

import abc
import logging
import math
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from ablate.schema import nodes


class PrintLogs(TrainerCallback):
    """The TRL docs' custom logging callback: print every log event (an example of `on_log`)."""

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if logs is not None and state.is_world_process_zero:
            print(f"Step {state.global_step}: {logs}")


class NaNGuard(TrainerCallback):
    """Stop a run that diverged, instead of training on garbage: a logged loss or grad_norm NaN/inf, or
    a model that collapsed without a NaN (too high an lr: its weights saturate, its logits go to 0 and
    no gradient reaches them): `grad_norm` exactly 0 while the lr is > 0 and the loss is not 0, on
    `dead_after` log events in a row. A loss of exactly 0 with no gradient is a finished task (a
    hinge loss past its margin, GRPO groups of equal rewards), not a collapse: it neither counts nor resets.

    Raises, so the run ends with `status: failed` and the offending step in the error message.
    """

    def __init__(
        self, metrics: tuple[str, ...] = ("loss", "grad_norm"), dead_after: int = nodes.NaNGuard.dead_after
    ) -> None:
        self.metrics = tuple(metrics)
        self.dead_after = dead_after  # log events with no gradient in a row (0: never stop for that)
        self.dead: list[int] = []  # the steps of the log events in a row that had no gradient
        # A log event averages the loss over `logging_steps` steps but reports the last step's grad_norm: a
        # hinge loss with one step past its margin logs loss > 0 and grad_norm 0 and is alive. So a suspect
        # event only turns on a per-step check (free otherwise); a window is dead when no step had a gradient.
        self.checking = False  # every optimizer step since the last log event was checked
        self.live = False  # one of them had a gradient

    def on_pre_optimizer_step(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        model: Any = None,
        **kwargs: Any,
    ) -> None:
        if self.checking and not self.live and model is not None:
            self.live = any(p.grad is not None and bool(p.grad.any()) for p in model.parameters())

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        logs = logs or {}
        for name in self.metrics:
            v = logs.get(name)
            if isinstance(v, float) and not math.isfinite(v):
                raise FloatingPointError(f"{name} is {v} at step {state.global_step}: stopping (NaNGuard)")
        grad, lr, loss = (logs.get(k) for k in ("grad_norm", "learning_rate", "loss"))
        if not all(isinstance(v, (int, float)) for v in (grad, lr, loss)) or loss == 0:
            return
        if not (grad == 0 and lr > 0):
            self.dead, self.checking = [], False
            return
        one_step = getattr(args, "logging_steps", 1) == 1  # the logged loss is this step's own
        dead = one_step or (self.checking and not self.live)
        self.dead = self.dead + [state.global_step] if dead else []
        self.checking, self.live = True, False
        if self.dead_after and len(self.dead) >= self.dead_after:
            steps = f"steps {self.dead[0]}-{self.dead[-1]}" if len(self.dead) > 1 else f"step {self.dead[0]}"
            raise FloatingPointError(
                f"grad_norm is exactly 0 at {steps} with the loss at {loss:.4g} and learning_rate {lr:.3g}: "
                "the model has collapsed (no gradient reaches it; too high an lr?); stopping (NaNGuard)"
            )


class FollowMetric(TrainerCallback, abc.ABC):
    """A callback that follows one logged metric, `self.metric`: `on_metric` runs at every log event that
    holds it as a number (an eval's `eval_*` or a train metric); the other log events pass it by."""

    metric: str

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        value = (logs or {}).get(self.metric)
        if isinstance(value, (int, float)):
            self.on_metric(value, state, control)

    @abc.abstractmethod
    def on_metric(self, value: float, state: TrainerState, control: TrainerControl) -> None:
        """What the callback does with the value (EarlyStop: counts patience; the study: reports it)."""


class EarlyStop(FollowMetric):
    """Stop training when `metric` has not improved by `min_delta` for `patience` log events in a row.

    Works on any logged number: a train metric (`loss`, `rewards/accuracies`) checked every
    `logging_steps`, or an eval metric (`eval_loss`) checked every evaluation. Unlike transformers'
    `EarlyStoppingCallback` it needs neither `load_best_model_at_end` nor checkpoints at every eval.
    A stopped run ends normally (`status: completed`) at the step it stopped; the reason is logged.
    """

    def __init__(
        self,
        metric: str = nodes.EarlyStop.metric,
        mode: str = nodes.EarlyStop.mode,
        patience: int = nodes.EarlyStop.patience,
        min_delta: float = nodes.EarlyStop.min_delta,
    ) -> None:
        nodes.EarlyStop.of({"mode": mode, "patience": patience, "min_delta": min_delta}).check()
        self.metric, self.sign, self.patience, self.min_delta = (
            metric,
            1.0 if mode == "min" else -1.0,
            patience,
            min_delta,
        )
        self.best: float | None = None
        self.bad = 0  # log events since the last improvement

    def on_metric(self, v: float, state: TrainerState, control: TrainerControl) -> None:
        if self.best is None or self.sign * (self.best - v) > self.min_delta:  # improved (lower for min)
            self.best, self.bad = float(v), 0
            return
        self.bad += 1
        if self.bad >= self.patience:
            logging.getLogger("ablate").info(
                "EarlyStop: %s did not improve on %.6g for %d log events; stopping at step %d",
                self.metric,
                self.best,
                self.bad,
                state.global_step,
            )
            control.should_training_stop = True
