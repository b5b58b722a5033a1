"""GRPO's batch geometry: the table printed at the start of every run, and which optimizer steps are
off-policy (see ablate.methods.grpo's module docstring for the generation schedule)."""

from __future__ import annotations

import math
import sys
from typing import Any

from transformers import TrainerCallback, TrainingArguments


def off_policy_steps(spg: int, accumulation: int, num_iterations: int = 1) -> list[int]:
    """Which optimizer steps (1-based, within one period of lcm(spg * mu, accumulation) micro-steps) train
    on at least one micro-batch generated before the policy's last update (ratio != 1, clipping active).

    A round serves spg * mu micro-steps: micro-step m belongs to the round generated at micro-step
    r = spg * mu * (m // (spg * mu)); the policy is updated after every `accumulation` micro-steps, so m
    is off-policy when m // accumulation > r // accumulation.
    """
    served = spg * num_iterations
    period = served * accumulation // math.gcd(served, accumulation)
    steps = {m // accumulation + 1 for m in range(period)
             if m // accumulation > (served * (m // served)) // accumulation}
    return sorted(steps)


def batch_geometry(args: Any, world_size: int, max_steps: int) -> str:
    """The table printed at the start of every GRPO run: prompts and completions per micro-step, per
    optimizer step and per generation round; rounds and optimizer steps in total; off-policy steps."""
    b, g, spg, ga = args.per_device_train_batch_size, args.num_generations, args.steps_per_generation, \
        args.gradient_accumulation_steps
    mu = args.num_iterations
    rows = [("per micro-step", b, 1), ("per optimizer step", b * ga, ga), ("per generation round", b * spg, spg * mu)]
    micro = max_steps * ga
    period = spg * mu * ga // math.gcd(spg * mu, ga) // ga  # optimizer steps after which the pattern repeats
    off = off_policy_steps(spg, ga, mu)
    if not off:
        policy = "none (every micro-batch is scored by the policy that generated it: ratio = 1)"
    else:
        policy = f"{', '.join(map(str, off))} of every {period} (ratio != 1: clipping can act)"
    lines = [f"GRPO batch geometry ({world_size} device{'s' if world_size > 1 else ''}, num_generations={g}, "
             f"num_iterations={mu})",
             f"  {'':22}{'prompts':>9}{'completions':>13}{'micro-steps':>13}   (per device; x{world_size} for all)"]
    lines += [f"  {name:22}{n // g:>9}{n:>13}{m:>13}" for name, n, m in rows]
    lines += [f"  optimizer steps: {max_steps}   micro-steps: {micro}   generation rounds: {math.ceil(micro / (spg * mu))}",
              f"  off-policy optimizer steps: {policy}"]
    return "\n".join(lines)


class PrintGeometry(TrainerCallback):
    """Prints `batch_geometry` once at the start of training (main process), before the first step."""

    def on_train_begin(self, args: TrainingArguments, state: Any, control: Any, **kwargs: Any) -> None:
        if state.is_world_process_zero:
            from tqdm.auto import tqdm

            # above the progress bar, on lines of its own (as ablate.run.console.print_above_bar)
            with tqdm.external_write_mode(file=sys.stdout):
                sys.stdout.write(batch_geometry(args, args.world_size, state.max_steps) + "\n")
                sys.stdout.flush()
