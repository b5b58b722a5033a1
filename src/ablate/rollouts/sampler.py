"""The order in which GRPO's prompts are drawn: each prompt `num_generations` times in a row (its
group), in chunks of one generation round's prompts, the same order whenever it is asked for.
Asynchronous GRPO reads a round's prompts ahead of the dataloader (`round_indices`)."""

from __future__ import annotations

from collections.abc import Iterator, Sized

import torch
from torch.utils.data import Sampler


class RepeatSampler(Sampler[int]):
    """Shuffled prompt indices, each repeated `num_generations` times, in chunks of `prompts` prompts;
    each chunk is yielded `repeat` times (TRL's RepeatSampler; incomplete last chunk dropped).

    The order depends only on (seed, epoch), not on how often the sampler was iterated before (TRL's
    does): Trainer calls `set_epoch`, so a run resumed in epoch k sees the same prompts as the original.
    """

    def __init__(self, data: Sized, num_generations: int, prompts: int, repeat: int, seed: int) -> None:
        self.n, self.g, self.prompts, self.repeat = len(data), num_generations, prompts, repeat
        self.seed, self.epoch = seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        order = torch.randperm(
            self.n, generator=torch.Generator().manual_seed(self.seed + self.epoch)
        ).tolist()
        for start in range(0, self.n - self.prompts + 1, self.prompts):
            chunk = order[start : start + self.prompts]
            for _ in range(self.repeat):
                yield from (i for i in chunk for _ in range(self.g))

    def __len__(self) -> int:
        return (self.n // self.prompts) * self.prompts * self.g * self.repeat

    def round_indices(self, k: int) -> list[int]:
        """The rows of chunk `k` counted over epochs (epoch k // chunks per epoch), each prompt
        `num_generations` times: what one pass of `__iter__` yields for it, without iterating."""
        epoch, chunk = divmod(k, self.n // self.prompts)
        order = torch.randperm(self.n, generator=torch.Generator().manual_seed(self.seed + epoch)).tolist()
        return [i for i in order[chunk * self.prompts : (chunk + 1) * self.prompts] for _ in range(self.g)]
