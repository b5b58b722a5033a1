"""GRPO's generation schedule: which micro-step generates, which slice of its round each micro-step
trains on, and when the policy changes between a round's generation and its use.

One round is generated for `batch_size * steps_per_generation` completions (spg micro-batches) and
serves its spg slices `num_iterations` (mu) times over, so it feeds spg * mu micro-steps:

    micro-step   0        1        2        3        4  ...      (spg = 2, mu = 2)
    generate     round 0  -        -        -        round 1
    trains on    slice 0  slice 1  slice 0  slice 1  slice 0

The optimizer steps after every `accumulation` micro-steps. This is the one reader of
`steps_per_generation` and `num_iterations`; the trainer and the geometry table ask it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Schedule:
    """The schedule of one process; `batch_size` and the counts are per device."""

    batch_size: int  # completions per micro-step (a multiple of num_generations)
    num_generations: int  # completions per prompt (a group)
    steps_per_generation: int = 1  # micro-steps (slices) per generation round
    num_iterations: int = 1  # passes (mu) over a round's slices
    accumulation: int = 1  # micro-steps per optimizer step (gradient_accumulation_steps)

    @classmethod
    def from_args(cls, args: Any) -> Schedule:
        """From a GRPOConfig (Trainer's `train_batch_size`: per device, times GPUs under DataParallel)."""
        return cls(batch_size=args.train_batch_size, num_generations=args.num_generations,
                   steps_per_generation=args.steps_per_generation, num_iterations=args.num_iterations,
                   accumulation=args.gradient_accumulation_steps)

    @property
    def round_size(self) -> int:
        """Completions per generation round: the train dataloader's batch."""
        return self.batch_size * self.steps_per_generation

    @property
    def micro_steps_per_round(self) -> int:
        """Micro-steps one round feeds (spg slices, mu times): how often the sampler repeats its prompts."""
        return self.steps_per_generation * self.num_iterations

    def first_micro_step(self, global_step: int) -> int:
        """Where training (re)starts: optimizer steps done times the micro-steps of each."""
        return global_step * self.accumulation

    def starts_round(self, micro_step: int) -> bool:
        """Whether `micro_step` generates a new round."""
        return micro_step % self.micro_steps_per_round == 0

    def slice_index(self, micro_step: int) -> int:
        """The slice of its round `micro_step` trains on."""
        return micro_step % self.steps_per_generation

    @property
    def keeps_old_logps(self) -> bool:
        """Whether pi_old's log-probs are scored at generation time: the policy can be updated between
        a round's generation and (some) use when a round does not fit whole optimizer steps, and with
        mu > 1 the ratio is always against the round's policy (as in TRL). Otherwise the ratio is
        exactly 1 and the detached current log-probs stand in."""
        return self.num_iterations > 1 or self.accumulation % self.steps_per_generation != 0

    def off_policy_steps(self) -> list[int]:
        """Which optimizer steps (1-based, within one period of lcm(spg * mu, accumulation) micro-steps)
        train on at least one micro-batch generated before the policy's last update (ratio != 1,
        clipping active).

        Micro-step m belongs to the round generated at micro-step r = spg * mu * (m // (spg * mu)); the
        policy is updated after every `accumulation` micro-steps, so m is off-policy when
        m // accumulation > r // accumulation.
        """
        served, ga = self.micro_steps_per_round, self.accumulation
        period = served * ga // math.gcd(served, ga)
        return sorted({m // ga + 1 for m in range(period) if m // ga > (served * (m // served)) // ga})

    @property
    def period_steps(self) -> int:
        """Optimizer steps after which the off-policy pattern repeats."""
        served = self.micro_steps_per_round
        return served * self.accumulation // math.gcd(served, self.accumulation) // self.accumulation
