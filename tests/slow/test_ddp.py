"""Multi-process training on CPU (torchrun, gloo): one run dir and one metrics log per job, not per rank."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import ROOT, TESTS, metrics, summary

pytestmark = pytest.mark.slow


def test_torchrun_two_ranks_share_one_run_dir(tmp_path):
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",  # the ablate under test (PYTHONPATH), not the installed one
        "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
    }
    out = tmp_path / "outputs"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node=2",
            "-m",
            "ablate",
            "train",
            "method.args.use_cpu=true",  # CPU processes join a gloo process group only with use_cpu
            "method.args.max_steps=6",
            "method.args.logging_steps=1",
            f"hydra.run.dir={out}/run",
            # the optimizer group reaches the trainer under DDP too (AblateTrainer): SGD, halved every step
            "optimizer=sgd",
            "optimizer/scheduler=step",
            "optimizer.scheduler.step_size=1",
            "optimizer.scheduler.gamma=0.5",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    run_dirs = [p for p in out.iterdir() if p.is_dir()]
    assert run_dirs == [out / "run"]
    s = summary(out / "run")
    assert s["status"] == "completed" and s["global_step"] == 6
    # 2 ranks x 8 pairs per step: 6 steps consume 96 of the 512 pairs (a single process: 48)
    assert s["metrics"]["epoch"] == pytest.approx(6 * 16 / 512)
    steps = [e["step"] for e in metrics(out / "run") if "loss" in e]
    assert steps == [1, 2, 3, 4, 5, 6]  # rank 1 wrote nothing
    lrs = [e["learning_rate"] for e in metrics(out / "run") if "learning_rate" in e]
    assert lrs == pytest.approx([0.05 * 0.5**k for k in range(6)])  # conf/optimizer/sgd.yaml's lr 0.05
    assert (out / "run" / "model" / "model.safetensors").is_file()
    assert r.stdout.count("run dir:") == 1  # only rank 0 prints the result
    # distributed.ddp_find_unused_parameters=false: every parameter trains, so no DDP warning per rank (issue 37)
    assert "find_unused_parameters" not in r.stdout + r.stderr, r.stderr[-3000:]


def test_torchrun_default_run_dir_is_the_same_for_every_rank(tmp_path):
    """Without hydra.run.dir each rank composes its own config; the launch time comes from the shared
    torchrun agent, so both name the same dir."""
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",  # the ablate under test (PYTHONPATH), not the installed one
        "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
    }
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
            "method.args.max_steps=2",
            "method.args.save_strategy=no",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    runs = list((tmp_path / "outputs" / "runs").glob("*/*"))
    assert len(runs) == 1 and summary(runs[0])["status"] == "completed"
