"""What GRPO's generation rounds leave in a checkpoint and in summary.json (a mixin of GRPOTrainer, which owns
`rollouts`, the RolloutBuffer, and `ahead`, the rounds an async worker samples ahead)."""

from __future__ import annotations

import os
from typing import Any

from torch import nn

from ablate.rollouts.ahead import AheadRounds
from ablate.rollouts.buffer import RolloutBuffer
from ablate.rollouts.stats import RolloutStats


class RoundsInCheckpoints:
    """The rounds and their counters saved with each checkpoint and read back on resume; what they bought,
    reported in the summary."""

    rollouts: RolloutBuffer
    ahead: AheadRounds | None
    args: Any

    def _save_checkpoint(self, model: nn.Module, trial: Any) -> None:
        """Save the rollout buffer with the checkpoint: its counters, so a resumed run's summary counts the
        rounds and seconds before the resume too, and a round saved mid-way (ablate.rollouts.buffer).
        Written before Trainer's files: trainer_state.json comes last and marks the checkpoint complete."""
        if self.args.should_save:
            folder = os.path.join(self.args.output_dir, f"checkpoint-{self.state.global_step}")
            os.makedirs(folder, exist_ok=True)
            self.rollouts.save(folder)
            if self.ahead is not None:  # the rounds sampled ahead, awaited (ablate.rollouts.ahead)
                self.ahead.save(folder)
        super()._save_checkpoint(model, trial)

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: nn.Module | None = None) -> None:
        super()._load_from_checkpoint(resume_from_checkpoint, model)
        self.rollouts.load(resume_from_checkpoint, self.args.device)  # mid-round: serve the rest, do not regenerate
        if self.ahead is not None:
            self.ahead.load(resume_from_checkpoint)  # the rounds sampled ahead: served, not sampled again

    def rollout_stats(self) -> RolloutStats:
        """The generation counters (ablate.rollouts.stats.ReportsRollouts; ablate.speed.throughput reads them)."""
        return self.rollouts.stats

    def summary_fields(self) -> dict[str, Any]:
        """For summary.json: what `steps_per_generation` buys (rounds and seconds, resumes included)."""
        stats = self.rollouts.stats
        fields = {"generation_rounds": stats.rounds, "generation_seconds": round(stats.generation_seconds, 3)}
        if self.ahead is not None:  # async: generation_seconds is the trainer's wait; the worker's sampling time
            fields["background_generation_seconds"] = round(stats.background_seconds, 3)
        return fields
