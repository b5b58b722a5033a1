"""The generation counters a rollout trainer declares (`ReportsRollouts`), for summary.json and for
ablate.speed.throughput's time split and MFU. No torch: the throughput callback imports it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable


@dataclass
class RolloutStats:
    """Running totals over the training rounds (evaluation's rounds are not counted)."""

    rounds: int = 0  # generation rounds
    generation_seconds: float = (
        0.0  # sampling (the generator's calls); async GRPO: the trainer's wait for a round
    )
    background_seconds: float = 0.0  # async GRPO: the generation worker's sampling, concurrent with training
    scoring_seconds: float = 0.0  # the rest of a round: padding, pi_old / reference log-probs, rewards
    generated_tokens: int = 0  # completion tokens sampled (one forward each: 2N FLOPs in the MFU)
    num_tokens: int = 0  # TRL's num_tokens: prompt + completion tokens generated (before any masking)

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps (generation_state.json), so a resumed run's summary counts the rounds
        and seconds before the resume too. Scoring seconds and generated tokens are this process's:
        the throughput callback uses their differences within a run only."""
        saved = {"rounds": self.rounds, "seconds": self.generation_seconds, "num_tokens": self.num_tokens}
        return {**saved, "background_seconds": self.background_seconds} if self.background_seconds else saved

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        self.rounds, self.generation_seconds = saved["rounds"], saved["seconds"]
        self.num_tokens = saved.get("num_tokens", 0)  # absent from the earliest checkpoints
        self.background_seconds = saved.get("background_seconds", 0.0)  # async GRPO runs only


@runtime_checkable
class ReportsRollouts(Protocol):
    """A trainer that generates its own training data (GRPO) and reports its counters."""

    def rollout_stats(self) -> RolloutStats:
        """The running totals so far."""
        ...


def completion_metrics(lengths: list[float], truncated: list[bool]) -> dict[str, float]:
    """TRL 1.16's `completions/*` of one round: the lengths (the model's own tokens), the share cut at
    max_completion_length (no EOS), and the lengths of those that ended with EOS (all 0 when none did, as
    TRL)."""
    ended = [n for n, cut in zip(lengths, truncated) if not cut] or [0.0]
    return {
        "completions/mean_length": sum(lengths) / len(lengths),
        "completions/min_length": float(min(lengths)),
        "completions/max_length": float(max(lengths)),
        "completions/clipped_ratio": sum(truncated) / len(truncated),
        "completions/mean_terminated_length": sum(ended) / len(ended),
        "completions/min_terminated_length": float(min(ended)),
        "completions/max_terminated_length": float(max(ended)),
    }
