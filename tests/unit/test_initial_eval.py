"""The initial policy's eval forwards as a cache entry (ablate.methods.initial_eval): recorded on a
miss, replayed bit for bit on a hit (dtypes and shapes kept), and a batch other than the recorded one
refused in one line. The whole path through a sweep: tests/integration/test_cache_losses.py."""

from __future__ import annotations

import pytest
import torch

from ablate.data.cache import Cache
from ablate.methods.initial_eval import Forwards, batch_digest


def _batch(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "input_ids": torch.randint(0, 50, (2, 7), generator=g),
        "attention_mask": torch.ones(2, 7, dtype=torch.long),
    }


def _output(seed: int, dtype: torch.dtype) -> tuple[torch.Tensor, dict]:
    g = torch.Generator().manual_seed(seed)
    stats = {
        "entropy": torch.rand(9, generator=g).to(dtype),
        "mean_logit": torch.randn(9, generator=g).to(dtype),
        "correct": torch.rand(9, generator=g) > 0.5,
    }
    return torch.randn(4, generator=g).to(dtype), {"stats": stats, "seq": torch.arange(9) % 4}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_recorded_forwards_replay_bit_for_bit_through_a_cache_entry(tmp_path, dtype) -> None:
    cache = Cache(dir=str(tmp_path))
    batches = [_batch(1), _batch(2)]
    key = lambda: {"k": 1}  # noqa: E731
    with cache.slot("initial_eval", "forwards", key) as slot:
        assert slot.found is None
        rec = Forwards(None)
        computed = [rec(b, lambda i=i: _output(i, dtype)) for i, b in enumerate(batches)]
        slot.store(rec.dataset())
    with cache.slot("initial_eval", "forwards", key) as slot:
        assert slot.found is not None and len(slot.found) == 2
        play = Forwards(slot.found)
        replayed = [play(b, lambda: pytest.fail("a hit must not compute")) for b in batches]
    for (lp, out), (lq, outq) in zip(computed, replayed):
        assert lq.dtype == lp.dtype and torch.equal(lq, lp)
        assert torch.equal(outq["seq"], out["seq"])
        for name in out["stats"]:
            assert outq["stats"][name].dtype == out["stats"][name].dtype
            assert torch.equal(outq["stats"][name], out["stats"][name])
    assert [(e["what"], e["hit"]) for e in cache.events] == [("forwards", False), ("forwards", True)]


def test_another_batch_than_the_recorded_one_is_refused(tmp_path) -> None:
    rec = Forwards(None)
    rec(_batch(1), lambda: _output(0, torch.float32))
    play = Forwards(rec.dataset())
    with pytest.raises(RuntimeError, match="eval batch 0 is not the one the initial_eval entry recorded"):
        play(_batch(2), lambda: _output(0, torch.float32))
    assert batch_digest(_batch(1)) == batch_digest(_batch(1)) != batch_digest(_batch(2))


def test_a_slot_with_the_cache_off_finds_nothing_and_stores_nothing(tmp_path) -> None:
    cache = Cache(enabled=False, dir=str(tmp_path))
    with cache.slot("initial_eval", "forwards", lambda: pytest.fail("no key when off")) as slot:
        assert slot.found is None
        rec = Forwards(None)
        rec(_batch(1), lambda: _output(0, torch.float32))
        slot.store(rec.dataset())
    assert not any(tmp_path.iterdir()) and cache.events == []
