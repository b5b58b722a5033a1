"""Thread count: cores available to the process divided among the processes sharing them."""

from __future__ import annotations

import os

import pytest

from ablate.errors import ConfigError
from ablate.process import threads
from ablate.schema.nodes import Root


@pytest.fixture
def cores(monkeypatch: pytest.MonkeyPatch) -> int:
    """A clean environment on a pretend 8-core affinity mask."""
    for var in ("OMP_NUM_THREADS", "LOCAL_WORLD_SIZE", "SLURM_CPUS_PER_TASK"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    return 8


def test_all_available_cores_for_a_lone_process(cores: int) -> None:
    assert threads.choose(None) == (8, "8 cores available")


def test_torchrun_ranks_share_the_cores(cores: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    n, source = threads.choose(None)
    assert n == 2 and "LOCAL_WORLD_SIZE=4" in source


@pytest.mark.parametrize("n_jobs,expected", [(3, 2), (-1, 1), (16, 1), (1, 8)])
def test_parallel_sweep_jobs_share_the_cores(cores: int, n_jobs: int, expected: int) -> None:
    assert threads.choose(None, {"n_jobs": n_jobs})[0] == expected


def test_slurm_allotment_caps_the_cores(cores: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "3")
    assert threads.choose(None)[0] == 3


def test_user_setting_wins_then_omp_env(cores: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "5")
    assert threads.choose(None) == (5, "OMP_NUM_THREADS=5")
    assert threads.choose(3, {"n_jobs": 4}) == (3, "config threads")
    with pytest.raises(
        ConfigError, match=r"^threads=0: must be null \(the cores available\) or an integer >= 1$"
    ):
        Root(threads=0)  # the value's one check: its schema


def test_apply_sets_torch(cores: int) -> None:
    import torch

    before = torch.get_num_threads()
    try:
        assert threads.apply(2) == {"threads": 2, "threads_source": "config threads"}
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
