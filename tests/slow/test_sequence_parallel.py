"""Sequence parallelism (`distributed.sequence_parallel=N`, ablate.speed.ulysses) end to end: torchrun, gloo
ranks, the tiny model, fp32, 2 steps. Each sequence split over 2 and over 4 ranks gives the one-process
run's per-step losses and gradient norms (1e-5) for SFT, DPO (sigmoid), GRPO and distillation; 2 sequence
groups of 2 ranks (4 ranks) give 2-rank DDP's; FSDP2 under it, one process's. The ranks' logs say the
forwards were split."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, TESTS, metrics

pytestmark = pytest.mark.slow

STEPS = ["method.args.max_steps=2", "method.args.logging_steps=1", "method.args.save_strategy=no"]
METHODS = ["method=sft", "method=dpo", "method=grpo", "method=distill"]


def _env() -> dict[str, str]:
    return {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "WANDB_MODE": "offline",
        "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
    }


def _train(run_dir: Path, *overrides: str, ranks: int = 1) -> subprocess.CompletedProcess:
    launch = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}"] if ranks > 1 else []
    r = subprocess.run(
        [sys.executable, *launch, "-m", "ablate", "train", *STEPS, *overrides, f"hydra.run.dir={run_dir}"],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return r


def _steps(run_dir: Path) -> list[tuple[float, float]]:
    return [(e["loss"], e["grad_norm"]) for e in metrics(run_dir) if "loss" in e]


def _assert_equal(got: Path, want: Path) -> None:
    a, b = _steps(got), _steps(want)
    assert len(a) == len(b) == 2, (a, b)
    for (loss, norm), (loss0, norm0) in zip(a, b):
        assert abs(loss - loss0) <= 1e-5 * max(1.0, abs(loss0)), (a, b)
        assert abs(norm - norm0) <= 1e-5 * max(1.0, norm0), (a, b)


def _split_forwards(run_dir: Path, scored_locally: bool = False) -> int:
    """The forwards rank 0 split (each rank logs its count to ablate.log: the largest is rank 0's too), or
    of those, the ones scored on each rank's own positions (the chunked head: DPO, GRPO)."""
    lines = [ln for ln in (run_dir / "ablate.log").read_text().splitlines() if "forwards split" in ln]
    assert lines, "no 'forwards split' line: the run did not split its sequences"
    if scored_locally:
        return max(int(ln.split("forwards split (")[1].split()[0]) for ln in lines)
    return max(int(ln.split("sequence parallelism: ")[1].split()[0]) for ln in lines)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("sequence_parallel")


@pytest.fixture(scope="module")
def one_process(runs: Path) -> dict[str, Path]:
    """Each method's one-process run (the reference the split runs must equal)."""
    out = {}
    for method in METHODS:
        out[method] = runs / f"one_{method.split('=')[1]}"
        _train(out[method], method)
        losses = [loss for loss, _ in _steps(out[method])]
        assert len(set(losses)) == 2 or method == "method=dpo", losses  # DPO's first loss is ln 2 always
    return out


@pytest.mark.parametrize("ranks", [2, 4])
@pytest.mark.parametrize("method", METHODS)
def test_a_sequence_split_over_n_ranks_equals_one_process(runs, one_process, method, ranks):
    run = runs / f"sp{ranks}_{method.split('=')[1]}"
    _train(run, method, "method.args.use_cpu=true", f"distributed.sequence_parallel={ranks}", ranks=ranks)
    _assert_equal(run, one_process[method])
    assert _split_forwards(run) >= 2  # at least the training forwards of both steps
    # SFT, DPO and GRPO score through the chunked head: each rank projects its own positions (no all-gather);
    # distillation reads the model's logits (gathered)
    local = _split_forwards(run, scored_locally=True)
    assert local >= 2 if method != "method=distill" else local == 0
    log = (run / "ablate.log").read_text()
    assert f"sequence parallelism: {ranks} ranks per sequence, 1 data-parallel group(s)" in log


def test_two_sequence_groups_of_two_equal_ddp_on_two_ranks(runs):
    """A 2 x 2 mesh: the groups draw different batches (data parallel), the ranks of a group the same."""
    ddp, mesh = runs / "ddp2_dpo", runs / "mesh2x2_dpo"
    _train(ddp, "method.args.use_cpu=true", ranks=2)
    _train(mesh, "method.args.use_cpu=true", "distributed.sequence_parallel=2", ranks=4)
    _assert_equal(mesh, ddp)
    assert json.loads((mesh / "summary.json").read_text())["metrics"]["epoch"] == pytest.approx(
        json.loads((ddp / "summary.json").read_text())["metrics"]["epoch"]
    )  # the same rows consumed: 2 groups x 8 pairs a step


def test_fsdp_with_sequences_split_equals_one_process(runs, one_process):
    run = runs / "fsdp_sp2_dpo"
    _train(run, "distributed=fsdp", "distributed.sequence_parallel=2", ranks=2)
    _assert_equal(run, one_process["method=dpo"])
    assert _split_forwards(run) >= 2
    assert _split_forwards(run, scored_locally=True) >= 2  # FSDP's head scores this rank's positions


def test_more_ranks_per_sequence_than_the_job_has_is_one_line(tmp_path):
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=2",
            "-m",
            "ablate",
            "train",
            "method.args.use_cpu=true",
            "distributed.sequence_parallel=4",
            f"hydra.run.dir={tmp_path / 'run'}",
        ],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode != 0
    assert (
        "distributed.sequence_parallel=4: splits each sequence over 4 ranks, but this job has 2" in r.stderr
    )
    assert not (tmp_path / "run").exists()  # refused before the run dir was made
