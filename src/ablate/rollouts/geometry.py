"""GRPO's batch geometry: the table printed at the start of every run, from the generation schedule
(ablate.rollouts.schedule: which micro-step generates, which optimizer steps are off-policy)."""

from __future__ import annotations

import math
import sys
from typing import Any

from transformers import TrainerCallback, TrainingArguments

from ablate.rollouts.schedule import Schedule


def batch_geometry(args: Any, world_size: int, max_steps: int) -> str:
    """The table printed at the start of every GRPO run: prompts and completions per micro-step, per
    optimizer step and per generation round; rounds and optimizer steps in total; off-policy steps."""
    schedule = Schedule.from_args(args)
    b, g, spg, ga = (
        args.per_device_train_batch_size,
        args.num_generations,
        schedule.steps_per_generation,
        schedule.accumulation,
    )
    mu = schedule.num_iterations
    rows = [
        ("per micro-step", b, 1),
        ("per optimizer step", b * ga, ga),
        ("per generation round", b * spg, spg * mu),
    ]
    micro = max_steps * ga
    rounds = math.ceil(micro / schedule.micro_steps_per_round)
    period = schedule.period_steps  # optimizer steps after which the pattern repeats
    off = schedule.off_policy_steps()
    if schedule.staleness:
        policy = _stale(schedule.stale_steps(max_steps), max_steps)
    elif not off:
        policy = "none (every micro-batch is scored by the policy that generated it: ratio = 1)"
    else:
        policy = f"{', '.join(map(str, off))} of every {period} (ratio != 1: clipping can act)"
    lines = [
        f"GRPO batch geometry ({world_size} device{'s' if world_size > 1 else ''}, num_generations={g}, "
        f"num_iterations={mu})",
        f"  {'':22}{'prompts':>9}{'completions':>13}{'micro-steps':>13} "
        f"  (per device; x{world_size} for all)",
    ]
    lines += [f"  {name:22}{n // g:>9}{n:>13}{m:>13}" for name, n, m in rows]
    lines += [
        f"  optimizer steps: {max_steps}   micro-steps: {micro}   generation rounds: {rounds}",
        f"  off-policy optimizer steps: {policy}",
    ]
    if schedule.staleness:
        lines += _versions(schedule, max_steps)
    return "\n".join(lines)


def _stale(steps: list[int], max_steps: int) -> str:
    if not steps:
        return "none (every micro-batch is scored by the policy that generated it: ratio = 1)"
    if steps == list(range(steps[0], max_steps + 1)):
        return f"every step from step {steps[0]} on (ratio vs the sampling policy != 1: clipping can act)"
    listed = ", ".join(map(str, steps[:12])) + (", ..." if len(steps) > 12 else "")
    return f"{listed} (ratio != 1: clipping can act)"


def _versions(schedule: Schedule, max_steps: int, shown: int = 8) -> list[str]:
    """Asynchronous GRPO: which policy version (optimizer steps taken) sampled each step's data."""
    s, per_round = schedule.staleness, schedule.micro_steps_per_round / schedule.accumulation
    versions = [schedule.step_versions(t) for t in range(1, max_steps + 1)]
    lag = max(t - v[0] for t, v in enumerate(versions))  # step t + 1 trains after t updates
    head = ", ".join(f"{t + 1}: v{'/v'.join(map(str, v))}" for t, v in enumerate(versions[:shown]))
    sync = f"every {per_round:g} optimizer steps" if per_round > 1 else "every optimizer step"
    return [
        f"  async ({s} round{'s' if s > 1 else ''} ahead): round k sampled by a worker with the weights of "
        f"round k-{s}'s start, "
        f"synced at round starts ({sync})",
        f"  sampling policy version per optimizer step (v = steps taken): {head}"
        f"{', ...' if max_steps > shown else ''} (lag <= {lag} step{'s' if lag != 1 else ''})",
    ]


class PrintGeometry(TrainerCallback):
    """Prints `batch_geometry` once at the start of training (main process), before the first step."""

    def on_train_begin(self, args: TrainingArguments, state: Any, control: Any, **kwargs: Any) -> None:
        if state.is_world_process_zero:
            from tqdm.auto import tqdm

            # above the progress bar, on lines of its own (as ablate.process.console.print_above_bar)
            with tqdm.external_write_mode(file=sys.stdout):
                sys.stdout.write(batch_geometry(args, args.world_size, state.max_steps) + "\n")
                sys.stdout.flush()
