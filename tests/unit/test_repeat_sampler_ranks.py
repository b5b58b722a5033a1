"""GRPO's prompt order over several ranks (ablate.rollouts.sampler.RepeatSampler under accelerate's
BatchSamplerShard, as Trainer shards it under DDP/FSDP): each rank draws its own prompts at every round, the same
ones for every micro-step its round serves, and the ranks together draw what one process drawing the whole global
round draws; `round_indices` (what async GRPO reads ahead) is each rank's share."""

from __future__ import annotations

import pytest
from accelerate.data_loader import BatchSamplerShard
from torch.utils.data import BatchSampler

from ablate.rollouts.sampler import RepeatSampler

DATA, G, PROMPTS = list(range(40)), 2, 3  # 40 prompts, 2 completions each, 3 prompts per rank per round


def _rank_batches(repeat: int, ranks: int, rank: int) -> list[list[int]]:
    sampler = RepeatSampler(DATA, G, PROMPTS, repeat, seed=5, ranks=ranks)
    batches = BatchSampler(sampler, batch_size=PROMPTS * G, drop_last=False)
    return list(BatchSamplerShard(batches, num_processes=ranks, process_index=rank))


@pytest.mark.parametrize("repeat", [1, 2, 3])  # micro-steps per round: spg x num_iterations
def test_each_rank_draws_its_own_share_of_the_one_process_round(repeat):
    ranks = [_rank_batches(repeat, 2, r) for r in range(2)]
    one = RepeatSampler(DATA, G, 2 * PROMPTS, repeat, seed=5)  # one process drawing the global round
    rounds = list(BatchSampler(one, batch_size=2 * PROMPTS * G, drop_last=False))[::repeat]
    for k, whole in enumerate(rounds):
        mine = [ranks[r][k * repeat : (k + 1) * repeat] for r in range(2)]
        assert all(b == m[0] for m in mine for b in m)  # a rank's round, the same at each of its micro-steps
        assert mine[0][0] + mine[1][0] == whole  # rank 0 the first half, rank 1 the second
        assert not set(mine[0][0]) & set(mine[1][0])
        for r in range(2):  # what async GRPO reads ahead for rank r
            assert RepeatSampler(DATA, G, PROMPTS, repeat, seed=5, ranks=2).round_indices(k, r) == mine[r][0]


def test_one_rank_is_unchanged():
    a = list(RepeatSampler(DATA, G, PROMPTS, 2, seed=5))
    b = list(RepeatSampler(DATA, G, PROMPTS, 2, seed=5, ranks=1))
    assert a == b and a[: PROMPTS * G] == a[PROMPTS * G : 2 * PROMPTS * G]
