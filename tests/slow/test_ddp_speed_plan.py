"""The speed paths under DDP (torchrun, 2 gloo ranks on CPU): the plan keeps every path, each running
through DDP's forward (so its hooks all-reduce the gradients): the layouts as they are, the backbone/head
split with the LM head passing the hidden states through DDP's forward (ablate.speed.split). Losses
equal the unwrapped single process's on the same global batch, and the plain path's (speed=off) under
DDP, step for step. Without the all-reduce they would not: a split that bypassed DDP's forward moved the
second step's loss from 0.6545 to 0.6573 (checked by hand)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, TESTS, ablate, metrics

pytestmark = pytest.mark.slow

STEPS = ["method.args.max_steps=4", "method.args.logging_steps=1", "method.args.save_strategy=no"]
ENV = {"OMP_NUM_THREADS": "1"}


def _torchrun(run_dir: Path, *overrides: str) -> Path:
    env = {**os.environ, **ENV, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node=2",
            "-m",
            "ablate",
            "train",
            "method.args.use_cpu=true",
            *STEPS,
            *overrides,
            f"hydra.run.dir={run_dir}",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.count("speed plan: policy") == 1  # rank 0 prints it (one line; the table: speed_plan.txt)
    return run_dir


def _losses(run_dir: Path) -> list[float]:
    return [e["loss"] for e in metrics(run_dir) if "loss" in e]  # the end-of-training event has train_loss


def _paths(run_dir: Path) -> dict[str, dict]:
    plan = json.loads((run_dir / "run.json").read_text())["speed_plan"]["policy"]
    assert plan["setting"]["wrapper"] == ("ddp" if "ddp" in run_dir.name else None)
    return plan["paths"]


def test_dpo_speed_paths_through_ddp_equal_the_unwrapped_run(tmp_path):
    ddp = _torchrun(tmp_path / "ddp_on")
    paths = _paths(ddp)
    assert {n for n, p in paths.items() if p["on"]} == {
        "dpo_pair_rows",
        "padding_free",
        "completion_only_logits",
        "lean_layers",
    }
    plain = _torchrun(tmp_path / "ddp_off", "speed=off")
    assert not any(p["on"] for p in _paths(plain).values())
    # one process, the same 16 pairs per step (2 ranks x 8): no wrapper, every path on
    r = ablate(
        "train",
        *STEPS,
        "method.args.per_device_train_batch_size=16",
        f"hydra.run.dir={tmp_path / 'single'}",
        env=ENV,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert all(p["on"] for p in _paths(tmp_path / "single").values())
    single = _losses(tmp_path / "single")
    assert len(single) == 4 and len(set(single)) == 4
    assert _losses(ddp) == pytest.approx(single, rel=1e-5, abs=1e-6)
    assert _losses(plain) == pytest.approx(single, rel=1e-5, abs=1e-6)


def test_grpo_speed_paths_through_ddp_equal_the_plain_path(tmp_path):
    """GRPO's group rows (packed) run through DDP's forward: rewards (the same samples: the shared-prefill
    generator draws what model.generate draws) and losses equal speed=off's under DDP."""
    grpo = ["method=grpo", "method.args.per_device_train_batch_size=16"]
    fast = _torchrun(tmp_path / "ddp_on", *grpo)
    paths = _paths(fast)
    assert paths["grpo_group_rows"]["on"] and paths["padding_free"]["on"] and paths["shared_prefill"]["on"]
    assert paths["completion_only_logits"]["on"]
    plain = _torchrun(tmp_path / "ddp_off", *grpo, "speed=off")
    pick = lambda run, k: [e[k] for e in metrics(run) if k in e]  # noqa: E731
    assert len(pick(fast, "reward")) == 4 and pick(fast, "reward") == pick(plain, "reward")
    # the logged loss is ~0 early on (rounded to 4 decimals); the entropy comes from the same log-probs
    assert len(set(pick(fast, "entropy"))) == 4
    for key in ("loss", "entropy"):
        assert pick(fast, key) == pytest.approx(pick(plain, key), rel=1e-5, abs=1e-6), key
