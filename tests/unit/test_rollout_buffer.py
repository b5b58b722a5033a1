"""The rollout buffer on its own: the generation schedule it serves (which micro-step generates, which
slice each trains on) for spg x num_iterations x accumulation, a resume that starts mid-round, and
its checkpoint files round-tripping bitwise."""

from __future__ import annotations

import json

import pytest
import torch

from ablate.methods.grpo import GRPOTrainer
from ablate.rollouts.buffer import GENERATION_BUFFER, GENERATION_STATE, Rollout, RolloutBuffer
from ablate.rollouts.schedule import Schedule
from ablate.rollouts.stats import ReportsRollouts

B = 4  # completions per micro-step


def _round(index: int, rows: int, keep_old: bool = True) -> Rollout:
    """A round whose every tensor tells where it came from: row r of round i holds 100 * i + r."""
    ids = 100 * index + torch.arange(rows)
    g = torch.Generator().manual_seed(index)
    return Rollout(
        prompt_ids=ids[:, None].repeat(1, 3),
        prompt_mask=torch.ones(rows, 3, dtype=torch.long),
        completion_ids=ids[:, None].repeat(1, 5),
        completion_mask=torch.randint(0, 2, (rows, 5), generator=g),
        advantages=torch.randn(rows, generator=g),
        num_items=torch.tensor(7.5),
        old_logps=-torch.rand(rows, 5, generator=g) if keep_old else None,
        ref_logps=-torch.rand(rows, 5, generator=g),
        policy_version=index,
    )


def _served(buffer: RolloutBuffer, global_step: int, micro_steps: int) -> list[tuple[int, list[int]]]:
    """Drive the buffer as GRPOTrainer does for `micro_steps` micro-steps from `global_step`; each
    micro-step's (round generated at it or -1, the rows it trained on)."""
    out = []
    buffer.start(global_step)
    for _ in range(micro_steps):
        buffer.start(global_step)  # every training step calls it; only the first places the count
        made = -1
        if buffer.needs_round():
            made = buffer.micro_step // buffer.schedule.micro_steps_per_round
            buffer.put(_round(made, buffer.schedule.round_size))
        out.append((made, buffer.serve().prompt_ids[:, 0].tolist()))
        buffer.advance()
    return out


def _reference(spg: int, mu: int, micro_steps: int) -> list[tuple[int, list[int]]]:
    """The schedule as GRPOTrainer's `_prepare_inputs` computed it inline before the buffer: generate
    when step % (spg * mu) == 0, then train on slice step % spg (rows [k * B, (k + 1) * B))."""
    out = []
    for step in range(micro_steps):
        made = step // (spg * mu) if step % (spg * mu) == 0 else -1
        k = step % spg
        out.append((made, [100 * (step // (spg * mu)) + r for r in range(k * B, (k + 1) * B)]))
    return out


@pytest.mark.parametrize("ga", [1, 2, 3])
@pytest.mark.parametrize("mu", [1, 2])
@pytest.mark.parametrize("spg", [1, 2, 4])
def test_schedule_served_as_before(spg, mu, ga):
    schedule = Schedule(
        batch_size=B, num_generations=2, steps_per_generation=spg, num_iterations=mu, accumulation=ga
    )
    steps = 12 * ga  # 12 optimizer steps
    assert _served(RolloutBuffer(schedule), 0, steps) == _reference(spg, mu, steps)
    # pi_old kept exactly when the old inline condition said so
    assert schedule.keeps_old_logps == (mu > 1 or ga % spg != 0)


def test_spg2_mu2_by_hand():
    """spg 2, mu 2, B 4: a round of 8 rows feeds 4 micro-steps as slices 0, 1, 0, 1 (rows 0-3, 4-7)."""
    buffer = RolloutBuffer(
        Schedule(batch_size=4, num_generations=2, steps_per_generation=2, num_iterations=2)
    )
    a, b = [0, 1, 2, 3], [4, 5, 6, 7]
    c, d = [100, 101, 102, 103], [104, 105, 106, 107]
    assert _served(buffer, 0, 6) == [(0, a), (-1, b), (-1, a), (-1, b), (1, c), (-1, d)]


@pytest.mark.parametrize(
    ("spg", "mu", "ga", "global_step"), [(4, 1, 1, 2), (2, 2, 1, 3), (4, 1, 2, 1), (3, 2, 2, 4)]
)
def test_resume_mid_round_serves_the_same_slices(tmp_path, spg, mu, ga, global_step):
    """Saved after `global_step` optimizer steps (mid-round in every case), loaded into a new buffer:
    it serves the rest of the saved round without generating, then the next rounds, as the
    uninterrupted buffer does; the slices come back bitwise, None fields stay None."""
    schedule = Schedule(
        batch_size=B, num_generations=2, steps_per_generation=spg, num_iterations=mu, accumulation=ga
    )
    done = global_step * ga
    assert done % schedule.micro_steps_per_round != 0  # the cases are mid-round
    full = RolloutBuffer(schedule)
    expected = _served(full, 0, 3 * schedule.micro_steps_per_round)
    first = RolloutBuffer(schedule)
    _served(first, 0, done)
    first.stats.rounds, first.stats.generation_seconds, first.stats.num_tokens = 5, 1.25, 321
    first.save(str(tmp_path))
    assert (tmp_path / GENERATION_BUFFER).is_file()
    resumed = RolloutBuffer(schedule)
    resumed.load(str(tmp_path), "cpu")
    assert (resumed.stats.rounds, resumed.stats.generation_seconds, resumed.stats.num_tokens) == (
        5,
        1.25,
        321,
    )
    for saved, loaded in zip(first.slices, resumed.slices, strict=True):
        for name in (
            "prompt_ids",
            "prompt_mask",
            "completion_ids",
            "completion_mask",
            "advantages",
            "num_items",
            "old_logps",
            "ref_logps",
        ):
            x, y = getattr(saved, name), getattr(loaded, name)
            assert x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y), name
        assert loaded.sampling_logps is None and loaded.policy_version == saved.policy_version
    rest = _served(resumed, global_step, len(expected) - done)
    assert rest[0][0] == -1  # the saved round is served, not generated again
    assert rest == expected[done:]


def test_checkpoint_at_a_round_boundary_holds_no_round(tmp_path):
    """spg 2: after 2 micro-steps the round is used up; the checkpoint keeps only the counters, and
    the resumed buffer generates at its first micro-step."""
    schedule = Schedule(batch_size=B, num_generations=2, steps_per_generation=2)
    buffer = RolloutBuffer(schedule)
    _served(buffer, 0, 2)
    buffer.save(str(tmp_path))
    assert not (tmp_path / GENERATION_BUFFER).exists()
    assert json.loads((tmp_path / GENERATION_STATE).read_text()) == {
        "rounds": 0,
        "seconds": 0.0,
        "num_tokens": 0,
    }
    resumed = RolloutBuffer(schedule)
    resumed.load(str(tmp_path), "cpu")
    resumed.start(1)
    assert resumed.slices is None and resumed.needs_round()


def test_buffer_saved_before_the_rollout_class_loads(tmp_path):
    """A checkpoint's generation_buffer.pt from before `Rollout` (a list of per-slice dicts of tensors,
    no policy version, no old_logps when on-policy) loads as the slices it held."""
    old = [
        {
            "prompt_ids": torch.tensor([[1, 2]]),
            "prompt_mask": torch.ones(1, 2, dtype=torch.long),
            "completion_ids": torch.tensor([[3]]),
            "completion_mask": torch.ones(1, 1, dtype=torch.long),
            "advantages": torch.tensor([0.5]),
            "num_items": torch.tensor(1.0),
        }
    ] * 2
    torch.save(old, tmp_path / GENERATION_BUFFER)
    (tmp_path / GENERATION_STATE).write_text(json.dumps({"rounds": 3, "seconds": 2.0}))  # before num_tokens
    buffer = RolloutBuffer(Schedule(batch_size=1, num_generations=1, steps_per_generation=2))
    buffer.load(str(tmp_path), "cpu")
    assert (
        len(buffer.slices) == 2
        and buffer.slices[1].policy_version == 0
        and buffer.slices[1].old_logps is None
    )
    assert torch.equal(buffer.slices[1].prompt_ids, old[1]["prompt_ids"])
    assert (buffer.stats.rounds, buffer.stats.generation_seconds, buffer.stats.num_tokens) == (3, 2.0, 0)


def test_split_partitions_the_rows():
    """Slices are consecutive rows that concatenate back to the round; 0-dim tensors are shared."""
    r = _round(2, 8, keep_old=False)
    parts = r.split(4)
    assert [p.prompt_ids.size(0) for p in parts] == [2, 2, 2, 2]
    for name in ("prompt_ids", "completion_mask", "advantages", "ref_logps"):
        assert torch.equal(torch.cat([getattr(p, name) for p in parts]), getattr(r, name))
    assert all(p.num_items is r.num_items and p.old_logps is None and p.policy_version == 2 for p in parts)
    assert set(r.tokens()) == {"prompt_ids", "prompt_mask", "completion_ids", "completion_mask"}


def test_grpo_trainer_declares_its_rollout_stats():
    """The throughput callback finds GRPO's counters through the declared interface, not by name."""
    assert issubclass(GRPOTrainer, ReportsRollouts)
    assert not isinstance(object(), ReportsRollouts)
