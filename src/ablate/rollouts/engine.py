"""What a generation engine behind GRPO's generator seam does, wherever it runs: in the training process
(`method/rollouts=vllm`, ablate.rollouts.vllm: one engine per rank under torchrun) or in a server of its own
(`method/rollouts=vllm_server`, ablate.rollouts.server).

The engine holds a copy of the policy. It is told when the policy changes (a TrainerCallback: every optimizer
step, and at train start, when a resume has loaded other weights) and is pushed the trainer's weights before
the next round it samples (TRL's `_last_loaded_step`); `policy_version` is the optimizer steps the weights it
holds have taken. The push streams the weights (ablate.rollouts.weights): under FSDP2 one unit is gathered at
a time, so the generator needs no `full_params` around it (`gathers_weights`).

Sampling: the config's temperature, top_p, top_k (0 = off) and max_completion_length, stopped at the same stop
ids as the HF path (the tokenizer's EOS and the model's generation-config EOS). Every row has its own seed:
`base` (drawn from torch's global RNG, which Trainer seeds and restores on resume; async GRPO: the round's own
seed) plus the row's index in the round counted over all ranks (`rank * rows + i`): a row is sampled with the
same seed whatever the world size, so a 2-rank run samples what a 1-process run of the same global batch
samples. The engine returns each sampled token's log-prob after its temperature/top-k/top-p processing (TRL's
`processed_logprobs`), which the trainer uses for the importance-sampling correction
(ablate.losses.is_correction).
"""

from __future__ import annotations

import os
import time
from abc import ABC, abstractmethod
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase, TrainerCallback

from ablate.rollouts.generation import Completions, SamplingArgs, cut_at_eos, stop_ids
from ablate.rollouts.weights import digest


class EngineGenerator(TrainerCallback, ABC):
    """A `GenerateFn` whose engine holds its own copy of the policy (module docstring)."""

    gathers_weights = True  # the push gathers FSDP2 units one at a time: no full_params around generation

    def __init__(
        self, args: SamplingArgs, tokenizer: PreTrainedTokenizerBase, verify_push: bool = False
    ) -> None:
        self.tokenizer = tokenizer
        self.verify_push = (
            verify_push  # after each push: the engine's digest of what it loaded == the trainer's
        )
        self.temperature, self.top_p, self.top_k = args.temperature, args.top_p, args.top_k
        self.max_tokens = args.max_completion_length
        self.version = 0  # the trainer's policy version (optimizer steps), from the callback events
        self.pushed: int | None = None  # the version the engine holds; None: not the trainer's weights
        self.pushes, self.push_seconds, self.verified = 0, 0.0, 0

    # ---- the generator seam ----

    @torch.no_grad()
    def __call__(self, model: PreTrainedModel, prompt_ids: list[list[int]]) -> Completions:
        self.ready(model)
        rows = len(prompt_ids) * world_size()
        base = int(torch.randint(0, 2**31 - rows, ()))  # torch's RNG: seeded, restored on resume
        return self.generate(prompt_ids, base, stop_ids(self.tokenizer, model))

    def ready(self, model: PreTrainedModel) -> None:
        """The engine built, and holding the policy's current weights."""
        self.start(model)
        if self.pushed != self.version:
            t0 = time.perf_counter()
            self.push(model)
            self.pushed, self.pushes = self.version, self.pushes + 1
            self.push_seconds += time.perf_counter() - t0
            if self.verify_push:
                self.check_push(model)

    def check_push(self, model: PreTrainedModel) -> None:
        """The engine holds the trainer's weights: its digest of the stream it loaded equals the trainer's of
        its own weights (ablate.rollouts.weights.Digest); every rank calls it (FSDP2's gathers)."""
        mine, engines = digest(model), self.received_digests()
        if any(d != mine for d in engines):
            raise RuntimeError(
                f"push {self.pushes} (policy version {self.version}): the engine's digest of the weights it "
                f"loaded {engines} differs from the trainer's {mine}"
            )
        self.verified += 1

    def generate(self, prompt_ids: list[list[int]], base: int, stops: list[int]) -> Completions:
        """Row i of this rank samples with seed `base + rank * len(prompt_ids) + i` (module docstring)."""
        first = base + rank() * len(prompt_ids)
        sampled = self.sample(
            [list(p) for p in prompt_ids], [first + i for i in range(len(prompt_ids))], stops
        )
        ids, logps = [], []
        for tokens, token_logps in sampled:
            row = cut_at_eos(list(tokens), stops)
            ids.append(row)
            logps.append([float(x) for x in token_logps[: len(row)]])
        return Completions(ids=ids, logps=logps)

    def sampling(self, stops: list[int]) -> dict[str, Any]:
        """The sampling settings every request carries (vLLM's SamplingParams names)."""
        return dict(
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            max_tokens=self.max_tokens,
            stop_token_ids=stops,
            logprobs=0,
        )

    # ---- TrainerCallback: when the policy changes ----

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.version, self.pushed = state.global_step, None  # a resume loaded other weights: push again

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.version = state.global_step  # an optimizer step changed the policy

    # ---- what each engine defines ----

    @abstractmethod
    def start(self, model: PreTrainedModel) -> None:
        """Build (or reach) the engine; a no-op once it is there."""

    @abstractmethod
    def push(self, model: PreTrainedModel) -> None:
        """Load the policy's current weights (LoRA: merged) into the engine; reset its prefix cache."""

    @abstractmethod
    def sample(
        self, prompt_ids: list[list[int]], seeds: list[int], stops: list[int]
    ) -> list[tuple[list[int], list[float]]]:
        """One completion per prompt row, with its seed: (token ids, each token's log-prob)."""

    @abstractmethod
    def received_digests(self) -> list[str]:
        """Each engine worker's digest of what the last push loaded (ablate.rollouts.weights.Digest)."""

    @abstractmethod
    def close(self) -> None:
        """Free the engine (or the connection to it), however the run ends."""


def rank() -> int:
    """This process's rank among the trainer's processes (0 without torch.distributed)."""
    dist = torch.distributed
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def world_size() -> int:
    """The trainer's processes (torchrun's WORLD_SIZE; 1 without torchrun)."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return int(os.environ.get("WORLD_SIZE", "1"))
