"""Callbacks of the debug presets (`conf/debug/*.yaml`): `debug=overfit` checks that the method's
progress metric (`method.progress`: the loss, GRPO's reward) moves on one repeated batch;
`debug=profile` traces a few steps with torch's profiler."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from ablate.errors import ConfigError
from ablate.schema import nodes

log = logging.getLogger("ablate")


def _print_above_bar(text: str) -> None:
    """On lines of its own above the progress bar (as ablate.process.console.print_above_bar does)."""
    from tqdm.auto import tqdm

    with tqdm.external_write_mode(file=sys.stdout):  # bar cleared, text flushed, bar drawn again
        sys.stdout.write(text + "\n")
        sys.stdout.flush()


class OverfitFailed(ConfigError):
    """One batch, many steps, and the metric did not move: the learning setup is broken (a user
    error to fix: lr, loss, masking, data), reported in one line with status failed."""


class OverfitCheck(TrainerCallback):
    """At the end of training, `metric` must have moved by at least `min_change` of its start: down
    for `mode=min` (a loss), up for `mode=max` (a reward). Start and end are the means of the first and
    the last third of its logged values, so one noisy step (a sampled reward) decides nothing."""

    def __init__(self, metric: str = "loss", mode: str = "min", min_change: float = 0.5) -> None:
        nodes.OverfitCheck.of({"mode": mode, "min_change": min_change}).check()  # its schema's checks
        self.metric, self.mode, self.min_change = metric, mode, float(min_change)

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        values = [
            float(e[self.metric]) for e in state.log_history if isinstance(e.get(self.metric), (int, float))
        ]
        if len(values) < 2:
            raise OverfitFailed(
                f"debug=overfit: fewer than 2 logged values of '{self.metric}' "
                f"(set method.args.logging_steps=1 and more max_steps)"
            )
        third = max(len(values) // 3, 1)
        first, last = sum(values[:third]) / third, sum(values[-third:]) / third
        change = (first - last) if self.mode == "min" else (last - first)
        direction = "fall" if self.mode == "min" else "rise"
        what = f"watched {self.metric} (method.progress; must {direction})"
        span = f"in {state.global_step} steps" + (
            f" (means of the first and last {third} logged)" if third > 1 else ""
        )
        if change < self.min_change * abs(first):
            raise OverfitFailed(
                f"debug=overfit: {what} went {first:.4g} -> {last:.4g} {span} on one repeated batch; "
                f"expected it to {direction} by {self.min_change:.0%} (check lr, the loss, the data)"
            )
        _print_above_bar(f"debug=overfit: {what} {first:.4g} -> {last:.4g} {span}: OK")


class Profile(TrainerCallback):
    """torch.profiler over a few training steps (`wait` skipped, `warmup` discarded, `active`
    recorded), a Chrome/Perfetto trace in `<run_dir>/profile/trace.json` and the `rows` most
    expensive ops as a table in `<run_dir>/profile/summary.txt` (also printed)."""

    def __init__(
        self,
        wait: int = nodes.Profile.wait,
        warmup: int = nodes.Profile.warmup,
        active: int = nodes.Profile.active,
        rows: int = nodes.Profile.rows,
        memory: bool = nodes.Profile.memory,
    ) -> None:
        self.wait, self.warmup, self.active, self.rows, self.memory = wait, warmup, active, rows, memory
        self.prof: Any = None
        self.out: Path | None = None

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        import torch
        from torch.profiler import ProfilerActivity, profile, schedule

        if not state.is_world_process_zero:
            return
        self.out = Path(args.output_dir).parent / "profile"  # output_dir = <run_dir>/checkpoints
        self.out.mkdir(parents=True, exist_ok=True)
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
        self.prof = profile(
            activities=activities,
            record_shapes=False,
            profile_memory=self.memory,
            schedule=schedule(wait=self.wait, warmup=self.warmup, active=self.active, repeat=1),
            on_trace_ready=self._ready,
        )
        self.prof.__enter__()

    def _ready(self, prof: Any) -> None:
        assert self.out is not None
        prof.export_chrome_trace(str(self.out / "trace.json"))
        import torch

        sort = "self_device_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
        table = prof.key_averages().table(sort_by=sort, row_limit=self.rows, max_name_column_width=48)
        (self.out / "summary.txt").write_text(table + "\n")
        _print_above_bar(
            f"debug=profile: {self.active} steps, top {self.rows} ops by {sort}\n{table}\n"
            f"trace: {self.out / 'trace.json'} (open in https://ui.perfetto.dev or chrome://tracing)"
        )

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self.prof is not None:
            self.prof.step()

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self.prof is not None:
            prof, self.prof = self.prof, None
            prof.__exit__(None, None, None)
            if not (self.out and (self.out / "trace.json").is_file()):
                log.warning(
                    "debug=profile: the run ended before %d profiled steps (max_steps too small?)",
                    self.wait + self.warmup + self.active,
                )
