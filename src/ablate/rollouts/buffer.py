"""GRPO's rollouts: a generation round's tensors (`Rollout`) and the buffer that serves them on the
schedule (ablate.rollouts.schedule) and keeps them across checkpoints.

The buffer splits a round into its `steps_per_generation` slices and serves slice k at micro-step k
of each pass. A checkpoint saved mid-round also holds the round (`generation_buffer.pt`:
completions, advantages and the old policy's log-probs), so a resume serves the rest of that round
instead of regenerating it and, with the RNG restored, reproduces the uninterrupted run's per-step
losses exactly (TRL regenerates: that round's completions are new samples). Without a saved round
(a checkpoint from before this, or one at a round's end) the round is generated again, from the same
prompts. The generation counters (`RolloutStats`) are saved with every checkpoint
(`generation_state.json`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import Any

import torch

from ablate.rollouts.schedule import Schedule
from ablate.rollouts.stats import RolloutStats

GENERATION_STATE = "generation_state.json"  # in each checkpoint: the counters summary.json reports
GENERATION_BUFFER = "generation_buffer.pt"  # in each checkpoint saved mid-round: the round's slices


@dataclass
class Rollout:
    """One generation round, or one micro-step's slice of it. Rows are completions, each prompt's
    `num_generations` in consecutive rows; prompts left-padded, completions right-padded."""

    prompt_ids: torch.Tensor  # (rows, prompt width)
    prompt_mask: torch.Tensor  # (rows, prompt width), 0 on padding
    completion_ids: torch.Tensor  # (rows, completion width)
    completion_mask: torch.Tensor  # (rows, completion width): the tokens that get a loss
    num_items: torch.Tensor  # () dapo's normaliser: the round's completion tokens per micro-batch
    advantages: torch.Tensor | None = None  # (rows,); None for a method without rewards (distillation)
    old_logps: torch.Tensor | None = None  # (rows, completion width) pi_old, when the schedule keeps it
    ref_logps: torch.Tensor | None = None  # (rows, completion width) the reference policy's, when beta > 0
    # the sampling engine's own log-probs, for an importance-sampling correction of an engine whose
    # numbers differ from the trainer's (vLLM); None for the generators here, which sample the policy
    sampling_logps: torch.Tensor | None = None
    policy_version: int = 0  # optimizer steps the generating policy had taken (global_step)
    # (rows, completion width) with tool calls: 1 on the model's tokens, 0 on tool results (attended to, not
    # trained on: TRL's tool_mask); None without tools
    tool_mask: torch.Tensor | None = None

    def loss_mask(self) -> torch.Tensor:
        """The completion tokens that get a loss: the completion mask, less the tool results."""
        return self.completion_mask if self.tool_mask is None else self.completion_mask * self.tool_mask

    def tokens(self) -> dict[str, torch.Tensor]:
        """The prompt and completion tensors, as the scoring functions take them."""
        return {
            "prompt_ids": self.prompt_ids,
            "prompt_mask": self.prompt_mask,
            "completion_ids": self.completion_ids,
            "completion_mask": self.completion_mask,
        }

    def map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> Rollout:
        """A copy with `fn` applied to every tensor that is set."""
        return replace(self, **{k: fn(v) for k, v in self._tensors().items()})

    def split(self, n: int) -> list[Rollout]:
        """`n` slices of consecutive rows, equal in size (a round's micro-batches); scalars shared."""
        size = self.prompt_ids.size(0) // n
        return [self.map(lambda v, i=i: v[i * size : (i + 1) * size] if v.dim() else v) for i in range(n)]

    def state_dict(self) -> dict[str, Any]:
        """The tensors that are set (on the CPU) and the policy version."""
        return {**{k: v.cpu() for k, v in self._tensors().items()}, "policy_version": self.policy_version}

    @classmethod
    def from_state_dict(cls, saved: dict[str, Any], device: torch.device | str) -> Rollout:
        """From `state_dict()`'s dict, or from a checkpoint of before this class (no policy version)."""
        return cls(**{k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in saved.items()})

    def _tensors(self) -> dict[str, torch.Tensor]:
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        return {k: v for k, v in values.items() if isinstance(v, torch.Tensor)}


class RolloutBuffer:
    """Serves generation rounds on a `Schedule`. Per training micro-step: `start(global_step)`, then
    `put` a new round when `needs_round()`, `serve()` the micro-step's slice, and `advance()` after it.
    Trainer counts optimizer steps only, so the buffer keeps the micro-step count itself."""

    def __init__(self, schedule: Schedule) -> None:
        self.schedule = schedule
        self.stats = RolloutStats()
        self.slices: list[Rollout] | None = None  # the round being served, one slice per micro-step of a pass
        self.micro_step: int | None = None  # micro-steps trained; None until training (re)starts

    def start(self, global_step: int) -> None:
        """The first call of this process places the count where the run is: after a resume, the
        micro-step after the checkpoint's last (later calls change nothing)."""
        if self.micro_step is None:
            self.micro_step = self.schedule.first_micro_step(global_step)

    def needs_round(self) -> bool:
        """A new round is due: at a round's first micro-step, or when none is held (a resume from a
        checkpoint without its round: that round is generated again, from the same prompts)."""
        return self.slices is None or self.schedule.starts_round(self.micro_step)

    def put(self, rollout: Rollout) -> None:
        self.slices = rollout.split(self.schedule.steps_per_generation)

    def serve(self) -> Rollout:
        return self.slices[self.schedule.slice_index(self.micro_step)]

    def advance(self) -> None:
        self.micro_step += 1

    def mid_round(self) -> bool:
        """Whether the round held still has micro-steps to serve."""
        return self.slices is not None and not self.schedule.starts_round(self.micro_step or 0)

    def save(self, folder: str) -> None:
        """The counters, and the round when some of it is still to be served."""
        with open(os.path.join(folder, GENERATION_STATE), "w") as f:
            json.dump(self.stats.state_dict(), f)
        if self.mid_round():
            torch.save([s.state_dict() for s in self.slices], os.path.join(folder, GENERATION_BUFFER))

    def load(self, folder: str, device: torch.device | str) -> None:
        """What `save` wrote; a checkpoint without a file leaves that part as it is."""
        state = os.path.join(folder, GENERATION_STATE)
        if os.path.isfile(state):
            with open(state) as f:
                self.stats.load_state_dict(json.load(f))
        buffer = os.path.join(folder, GENERATION_BUFFER)
        if os.path.isfile(buffer):
            self.slices = [Rollout.from_state_dict(s, device) for s in torch.load(buffer, weights_only=True)]
