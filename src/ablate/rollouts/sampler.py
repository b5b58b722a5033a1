"""The order in which GRPO's prompts are drawn: each prompt `num_generations` times in a row (its group), in
chunks of one generation round's prompts over all ranks, the same order whenever it is asked for. Asynchronous
GRPO reads a round's prompts ahead of the dataloader (`round_indices`).

Several ranks: the dataloader hands batch b to rank b % ranks (accelerate's BatchSamplerShard), and a batch is
one rank's round. A chunk holds every rank's round, one after the other, and is yielded `repeat` times whole,
so each rank takes its own slice of the chunk at every repetition (TRL's RepeatSampler: its batch is the
global one). A chunk per rank instead would hand the first repetition to rank 0 and the second, the same
prompts, to rank 1.
"""

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

    def __init__(
        self, data: Sized, num_generations: int, prompts: int, repeat: int, seed: int, ranks: int = 1
    ) -> None:
        # `prompts`: one round's on one rank; a chunk is every rank's (module docstring)
        self.n, self.g, self.prompts, self.repeat = len(data), num_generations, prompts * ranks, repeat
        self.seed, self.epoch, self.ranks = seed, 0, ranks

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

    def round_indices(self, k: int, rank: int = 0) -> list[int]:
        """Rank `rank`'s rows of chunk `k` counted over epochs (epoch k // chunks per epoch), each prompt
        `num_generations` times: what one pass of `__iter__` hands that rank for it, without iterating."""
        epoch, chunk = divmod(k, self.n // self.prompts)
        order = torch.randperm(self.n, generator=torch.Generator().manual_seed(self.seed + epoch)).tolist()
        per_rank = self.prompts // self.ranks
        first = chunk * self.prompts + rank * per_rank
        return [i for i in order[first : first + per_rank] for _ in range(self.g)]
