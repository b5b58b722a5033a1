"""GRPO's generation schedule: which micro-step generates, which slice of its round each micro-step
trains on, and when the policy changes between a round's generation and its use.

One round is generated for `batch_size * steps_per_generation` completions (spg micro-batches) and
serves its spg slices `num_iterations` (mu) times over, so it feeds spg * mu micro-steps:

    micro-step   0        1        2        3        4  ...      (spg = 2, mu = 2)
    generate     round 0  -        -        -        round 1
    trains on    slice 0  slice 1  slice 0  slice 1  slice 0

The optimizer steps after every `accumulation` micro-steps. This is the one reader of
`steps_per_generation`, `num_iterations` and `max_staleness` (s: `staleness`); the trainer and the
geometry table ask it.

With s > 0 (asynchronous GRPO, ablate.rollouts.ahead) round k is sampled ahead of its
use, by the weights the policy had when round k - s began (rounds 0..s by the initial weights): its
`policy_version` is the optimizer steps taken at that moment. s = 0 is the synchronous schedule above,
where round k is sampled by the weights at its own start.
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
    staleness: int = 0  # rounds sampled ahead: round k by the weights at round k - staleness's start

    @classmethod
    def from_args(cls, args: Any) -> Schedule:
        """From a GRPOConfig (Trainer's `train_batch_size`: per device, times GPUs under DataParallel)."""
        return cls(
            batch_size=args.train_batch_size,
            num_generations=args.num_generations,
            steps_per_generation=args.steps_per_generation,
            num_iterations=args.num_iterations,
            accumulation=args.gradient_accumulation_steps,
            staleness=getattr(args, "max_staleness", 0),
        )

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

    def round_of(self, micro_step: int) -> int:
        """The round `micro_step` trains on."""
        return micro_step // self.micro_steps_per_round

    def policy_version(self, round_index: int) -> int:
        """Optimizer steps the policy that samples round `round_index` has taken: those done when round
        `round_index - staleness` began (its first micro-step), at least round 0's."""
        return max(round_index - self.staleness, 0) * self.micro_steps_per_round // self.accumulation

    def step_versions(self, step: int) -> list[int]:
        """The policy versions that sampled what optimizer step `step` (1-based) trains on."""
        micro = range((step - 1) * self.accumulation, step * self.accumulation)
        return sorted({self.policy_version(self.round_of(m)) for m in micro})

    @property
    def keeps_old_logps(self) -> bool:
        """Whether pi_old's log-probs are scored at generation time: the policy can be updated between
        a round's generation and (some) use when a round does not fit whole optimizer steps, and with
        mu > 1 the ratio is always against the round's policy (as in TRL); rounds sampled ahead
        (staleness > 0) always keep the log-probs of the weights that sampled them. Otherwise the
        ratio is exactly 1 and the detached current log-probs stand in."""
        return (
            self.staleness > 0
            or self.num_iterations > 1
            or self.accumulation % self.steps_per_generation != 0
        )

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

    def stale_steps(self, max_steps: int) -> list[int]:
        """With rounds sampled ahead: the optimizer steps (1-based, up to `max_steps`) that train on a
        micro-batch sampled before the policy's last update: those whose sampling version is below the
        steps already taken (step - 1)."""
        return [t for t in range(1, max_steps + 1) if self.step_versions(t)[0] < t - 1]

    @property
    def period_steps(self) -> int:
        """Optimizer steps after which the off-policy pattern repeats."""
        served = self.micro_steps_per_round
        return served * self.accumulation // math.gcd(served, self.accumulation) // self.accumulation
