"""Every examples/ dir runs with its one documented command (PYTHONPATH=<dir>, --config-dir <dir>)."""

from __future__ import annotations

import math
import os

import pytest
import torch
from conftest import ROOT, TESTS, ablate, metrics, summary

FAST = ("method.args.max_steps=3", "method.args.logging_steps=1", "data.max_train_samples=32")


def _example(name: str, tmp_path, *overrides: str):
    # the caller's PYTHONPATH stays last: a worktree run tests its own src/, not an installed copy
    env = {
        "PYTHONPATH": os.pathsep.join(
            [str(ROOT / "examples" / name), str(TESTS), os.environ.get("PYTHONPATH", "")]
        )
    }
    r = ablate(
        "train",
        "-m",
        "--config-dir",
        f"examples/{name}",
        *overrides,
        *FAST,
        f"hydra.sweep.dir={tmp_path}",
        "hydra.sweep.subdir=${hydra.job.num}",
        env=env,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return [
        [e for e in metrics(tmp_path / str(i)) if "loss" in e]
        for i in range(len(list(tmp_path.glob("[0-9]*"))))
    ]


def _losses(events):
    return [e["loss"] for e in events]


def test_hinge_subclass_equals_dpo_hinge(tmp_path):
    mine, builtin = _example("hinge_subclass", tmp_path, "method=my_hinge,dpo_hinge")
    assert summary(tmp_path / "0")["method"] == "my_hinge"
    assert _losses(mine) == pytest.approx(_losses(builtin), rel=1e-6)
    assert _losses(mine)[0] == 1.0 and _losses(mine)[-1] < 1.0  # hinge at zero margin is 1, then it learns


def test_custom_batch_keeps_dataset_and_matches_dpo(tmp_path):
    mine, builtin = _example("custom_batch", tmp_path, "method=dpo_custom_batch,dpo")
    cfg = (tmp_path / "0" / ".hydra" / "config.yaml").read_text()
    assert "my_batch.pretokenized" in cfg and "my_batch.PadToMultipleCollator" in cfg
    # same token ids, only extra right padding (masked): the same losses
    assert _losses(mine) == pytest.approx(_losses(builtin), rel=1e-5)


def test_final_token_po(tmp_path):
    (events,) = _example("final_token_po", tmp_path, "method=final_token_po", "method.args.max_steps=8")
    assert events[0]["loss"] == pytest.approx(math.log(2), abs=1e-6)  # live reference == policy at step 1
    assert events[0]["final_token/rewards/margins"] == 0.0
    assert min(_losses(events)[1:]) < math.log(2) - 0.05  # the single-token preference is learned


def test_final_token_helpers():
    import sys

    sys.path.insert(0, str(ROOT / "examples" / "final_token_po"))
    from final_token_po import divergence_index, final_token_logps

    j, valid = divergence_index(
        torch.tensor([[5, 6, 7, 0], [5, 6, 0, 0]]), torch.tensor([[5, 6, 8, 9], [5, 6, 0, 0]])
    )
    assert j.tolist() == [2, 0] and valid.tolist() == [True, False]
    per_token = torch.tensor([[-1.0, -2.0, -3.0]])  # per_token[:, t] scores token t+1
    assert final_token_logps(per_token, torch.tensor([2])).tolist() == [-2.0]
