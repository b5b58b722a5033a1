"""A SLURM job over 2 nodes, 1 task each (hydra.launcher.nodes=2): each task exports torchrun's
variables from SLURM's, so the two tasks are one run of 2 ranks (the same path as tasks_per_node=2,
which tests/slow/test_slurm.py runs; tests/slow/test_slurm_multinode.py runs a real 2-node job on
two local nodes of one host, which this covers for distinct hosts: MASTER_ADDR, one MASTER_PORT)."""

from __future__ import annotations

import os

import pytest

from ablate.process import setup as process
from ablate.config.machine import check_distributed, job_processes

TORCH_VARS = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "CUDA_VISIBLE_DEVICES",
)


def _slurm_task(monkeypatch: pytest.MonkeyPatch, node: int) -> None:
    """The environment SLURM gives the task on node `node` (0 or 1) of job 4242, nodes=2, ntasks-per-node=1."""
    for k in TORCH_VARS:  # set then unset: the test's undo removes what the export adds
        monkeypatch.setenv(k, "x")
        monkeypatch.delenv(k)
    monkeypatch.setenv("SUBMITIT_EXECUTOR", "slurm")
    for k, v in {
        "SLURM_JOB_ID": "4242",
        "SLURM_NTASKS": "2",
        "SLURM_NNODES": "2",
        "SLURM_JOB_NUM_NODES": "2",
        "SLURM_NODEID": str(node),
        "SLURM_PROCID": str(node),
        "SLURM_LOCALID": "0",
        "SLURM_JOB_NODELIST": "gpu[07-08]",
        "SLURM_STEP_NODELIST": "gpu[07-08]",
    }.items():
        monkeypatch.setenv(k, v)


@pytest.mark.parametrize("node", [0, 1])
def test_each_node_of_a_two_node_slurm_job_is_one_rank_of_one_run(
    monkeypatch: pytest.MonkeyPatch, node: int
) -> None:
    _slurm_task(monkeypatch, node)
    assert job_processes() == 2  # distributed=fsdp is not refused as a single process, before the export
    process.export_torch_distributed()
    assert {
        k: os.environ[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR")
    } == {
        "RANK": str(node),
        "WORLD_SIZE": "2",
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
        "MASTER_ADDR": "gpu07",
    }
    first = os.environ["MASTER_PORT"]
    _slurm_task(monkeypatch, 1 - node)
    process.export_torch_distributed()
    assert os.environ["MASTER_PORT"] == first  # both nodes derive the same port from the job id
    assert job_processes() == 2


def test_fsdp_in_one_process_is_refused_and_two_are_not(monkeypatch: pytest.MonkeyPatch) -> None:
    """One process is refused unless torchrun started it (`--nproc_per_node=1`, LOCAL_RANK set): a sharded
    checkpoint resumed on one rank (tests/slow/test_fsdp.py)."""
    from omegaconf import OmegaConf

    from ablate.errors import ConfigError

    node = OmegaConf.create({"fsdp": True})
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    with pytest.raises(ConfigError, match="several processes"):
        check_distributed(node, processes=1)
    monkeypatch.setenv("LOCAL_RANK", "0")
    check_distributed(node, processes=1)
    monkeypatch.delenv("LOCAL_RANK")
    check_distributed(node, processes=2)
    check_distributed(node, processes=None)  # a sweep's driver: each job decides
    assert check_distributed(OmegaConf.create({"fsdp": False}), processes=1) == {"fsdp": False}
    # the trainer's key is not a TrainingArguments one
    assert check_distributed(OmegaConf.create({"fsdp": False, "sequence_parallel": 2}), 2) == {"fsdp": False}


def test_launch_time_shared_by_nodes_as_unix_seconds_or_iso(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nodes' torchrun agents start apart: the same ABLATE_LAUNCH_TIME on each names the same default run dir."""
    from datetime import datetime

    from ablate.config.compose import _launch_time

    monkeypatch.setenv("ABLATE_LAUNCH_TIME", "1796166550.25")
    assert _launch_time() == datetime.fromtimestamp(1796166550.25)
    monkeypatch.setenv("ABLATE_LAUNCH_TIME", "1796166550")
    assert _launch_time() == datetime.fromtimestamp(1796166550)
    monkeypatch.setenv("ABLATE_LAUNCH_TIME", "2026-01-02T03:04:05")
    assert _launch_time() == datetime(2026, 1, 2, 3, 4, 5)


def test_a_lost_peer_is_one_line_naming_the_checkpoint_to_resume_from(
    monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    """gloo's error when another rank's process died (its connection reset), wrapped as Trainer may wrap it."""
    from ablate.errors import PeerLostError, user_error
    from ablate.record.checkpoints import MANIFEST, peer_lost

    for step, sealed in ((2, True), (4, False)):  # checkpoint-4 was being written: not resumable
        (tmp_path / "checkpoints" / f"checkpoint-{step}").mkdir(parents=True)
        if sealed:
            (tmp_path / "checkpoints" / f"checkpoint-{step}" / MANIFEST).write_text("{}")
    gloo = RuntimeError(
        "[../third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:4242: "
        "Connection reset by peer"
    )
    try:
        try:
            raise gloo
        except RuntimeError as inner:
            raise ValueError("during the step") from inner
    except ValueError as e:
        wrapped = e
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert peer_lost(tmp_path, wrapped) is None  # one process: no peer to lose
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    err = peer_lost(tmp_path, wrapped)
    assert isinstance(err, PeerLostError) and user_error(err) is err
    assert str(err) == (
        "rank 0 lost another rank of this job (connection reset by peer: it died, or hung past "
        "distributed.ddp_timeout); the run resumes from checkpoint-2: start the same command again "
        "on every node"
    )
    assert peer_lost(tmp_path, RuntimeError("CUDA out of memory")) is None
