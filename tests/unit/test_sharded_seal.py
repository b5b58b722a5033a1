"""The seal of a sharded FSDP checkpoint (distributed=fsdp's default, SHARDED_STATE_DICT): its DCP dirs'
`.distcp` files and `.metadata` are in the manifest like any file, so a cut or damaged shard passes the
checkpoint over for the previous one. Files laid out as accelerate writes them on 2 ranks (the real ones:
tests/slow/test_fsdp.py, which also resumes past a truncated shard on 4 ranks)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ablate.record import checkpoints


def _sharded(run: Path, step: int) -> Path:
    ckpt = run / "checkpoints" / f"checkpoint-{step}"
    for part in ("pytorch_model_fsdp_0", "optimizer_0"):
        (ckpt / part).mkdir(parents=True)
        (ckpt / part / ".metadata").write_bytes(os.urandom(300))
        for rank in range(2):
            (ckpt / part / f"__{rank}_0.distcp").write_bytes(os.urandom(4000 + step))
    for name in ("rng_state_0.pth", "rng_state_1.pth", "scheduler.pt"):
        (ckpt / name).write_bytes(os.urandom(100))
    (ckpt / "trainer_state.json").write_text('{"global_step": %d}' % step)
    checkpoints.write_manifest(ckpt)
    return ckpt


def _cut(p: Path) -> None:
    os.truncate(p, p.stat().st_size // 2)


def _flip(p: Path) -> None:
    data = bytearray(p.read_bytes())
    data[len(data) // 2] ^= 0xFF
    p.write_bytes(bytes(data))


@pytest.mark.parametrize(
    "name,damage,why",
    [
        ("pytorch_model_fsdp_0/__1_0.distcp", _cut, "pytorch_model_fsdp_0/__1_0.distcp is truncated"),
        ("optimizer_0/__0_0.distcp", _flip, "optimizer_0/__0_0.distcp is damaged"),
        ("pytorch_model_fsdp_0/.metadata", Path.unlink, "pytorch_model_fsdp_0/.metadata is missing"),
    ],
)
def test_a_damaged_shard_falls_back_to_the_previous_checkpoint(
    tmp_path: Path, name: str, damage, why: str
) -> None:
    older, newer = _sharded(tmp_path, 2), _sharded(tmp_path, 4)
    assert checkpoints.latest_checkpoint(tmp_path) == newer  # sealed and whole: the newest
    damage(newer / name)
    skipped: list[str] = []
    assert checkpoints.latest_checkpoint(tmp_path, skipped) == older
    assert len(skipped) == 1 and skipped[0].startswith(f"checkpoint-4: {why}"), skipped
