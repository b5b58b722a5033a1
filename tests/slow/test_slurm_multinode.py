"""One run across two SLURM nodes (hydra/launcher=slurm hydra.launcher.nodes=2 tasks_per_node=1) on a
real two-node cluster: one run dir written by global rank 0 only, per-step losses equal to the
single-node 2-task run's (tasks_per_node=2), a 2-node job preempted with USR2 is requeued and
resumes on both nodes to the same losses, and when one node's task dies the other ends in seconds
with one line and the same command resumes.

The cluster: the running one when it has two usable nodes; else scripts/slurm/start.sh with
SLURM_NODES=2 (two `slurmd -N lab-nI` on this machine, SLURM's multiple-slurmd mode, 127.0.0.1 each),
which also turns a running one-node cluster of that script into two nodes; afterwards it is put
back as found (one node again, or stopped). Both nodes share this machine's filesystem and loopback,
as a real cluster's nodes share theirs; what differs is per node: the slurmd, the job step's task,
SLURM_NODEID. Run: `python -m pytest -m slow tests/slow/test_slurm_multinode.py -n 0` (about 12
minutes on 2 loaded CPU cores once the cluster is up).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_slurm import (
    DDP_STEPS,
    START,
    STOP,
    _ablate,
    _assert_no_job_processes,
    _cluster_state,
    _ddp_args,
    _job_dirs,
    _job_logs,
    _job_name,
    _losses,
    _preempted_then_finished,
    _sacct_states,
    _sh,
    _wait,
)

from ablate.record.checkpoints import MANIFEST

pytestmark = pytest.mark.slow
MARK = "written by scripts/slurm/start.sh"  # the first line of the config start.sh writes


def _usable_nodes() -> set[str]:
    out = _sh("sinfo", "-h", "-N", "-o", "%N %T").stdout
    return {
        line.split()[0] for line in out.splitlines() if line.split()[-1] in ("idle", "mixed", "allocated")
    }


def _start(nodes: int) -> None:
    start = subprocess.run(
        ["bash", str(START)],
        env={**os.environ, "SLURM_NODES": str(nodes)},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert start.returncode == 0, (
        f"SLURM_NODES={nodes} scripts/slurm/start.sh failed:\n{start.stdout[-3000:]}\n{start.stderr[-3000:]}"
    )


@pytest.fixture(scope="module")
def two_node_cluster() -> Iterator[None]:
    """Two usable nodes with accounting for this module, left as found afterwards."""
    missing, deadline = _cluster_state(), time.monotonic() + 60
    while missing and not missing.startswith("no SLURM") and time.monotonic() < deadline:
        time.sleep(1)  # a node still `completing` the previous module's last job
        missing = _cluster_state()
    if missing is None and len(_usable_nodes()) >= 2:
        yield
        return
    conf = Path("/etc/slurm/slurm.conf")
    ours = missing is None and conf.is_file() and MARK in conf.read_text()  # a one-node cluster start.sh made
    can_start = os.geteuid() == 0 and (shutil.which("apt-get") or shutil.which("slurmctld"))
    if not (can_start and (ours or (missing or "").startswith("no SLURM"))):
        pytest.skip(
            f"no two-node SLURM cluster ({missing or f'nodes: {sorted(_usable_nodes())}'}); scripts/slurm/start.sh "
            "makes one only as root with apt-get, and changes only a cluster it started itself"
        )
    _start(2)
    try:
        assert _cluster_state() is None and len(_usable_nodes()) == 2, _sh("sinfo").stdout
        yield
    finally:
        if ours:
            _start(1)  # back to the one-node cluster this session found
        else:
            _sh("bash", str(STOP), timeout=180)


def _two_node_args(name: str, sweep_dir: Path) -> list[str]:
    """The 2-task DPO job of test_slurm.py, as 2 nodes x 1 task instead of 1 node x 2 tasks."""
    args = [a for a in _ddp_args(name, sweep_dir) if not a.startswith("hydra.launcher.tasks_per_node=")]
    return [*args, "hydra.launcher.nodes=2", "hydra.launcher.tasks_per_node=1"]


def _job_folder(sweep_dir: Path) -> Path:
    """submitit's folder of the sweep's one SLURM job (named by its job id)."""
    (job,) = (p for p in (sweep_dir / ".submitit").iterdir() if p.is_dir())
    return job


def _sacct_nodes(job_id: str) -> list[str]:
    """Nodes per attempt of the job's allocation (-D: every attempt of a requeued job)."""
    out = _sh("sacct", "-n", "-P", "-X", "-D", "-j", job_id, "-o", "NNodes").stdout
    return out.split()


def _run_job(args: list[str], name: str, sweep_dir: Path, cwd: Path) -> Path:
    """Launch one SLURM job through ablate, wait for it (cancelled if the wait fails), assert it
    succeeded; its submitit folder."""
    proc = _ablate(args, cwd=cwd)
    try:
        out = _wait(proc, 420, sweep_dir)
    finally:
        _sh("scancel", f"--name={name}")
    assert proc.returncode == 0, out[-4000:] + _job_logs(sweep_dir)
    return _job_folder(sweep_dir)


@pytest.fixture(scope="module")
def single_node_reference(
    two_node_cluster: None, tmp_path_factory: pytest.TempPathFactory
) -> dict[int, float]:
    """Per-step losses of the uninterrupted one-node 2-task run (tasks_per_node=2), on the same cluster."""
    tmp = tmp_path_factory.mktemp("single_node")
    sweep_dir, name = tmp / "sweep", _job_name("onenode")
    job = _run_job(_ddp_args(name, sweep_dir), name, sweep_dir, tmp)
    assert _sacct_nodes(job.name) == ["1"]  # really on one node
    (run_dir,) = _job_dirs(sweep_dir)
    losses = _losses(run_dir)
    assert sorted(losses) == list(range(1, DDP_STEPS + 1))
    return losses


def test_two_node_job_is_one_run_with_the_single_node_losses(
    single_node_reference: dict[int, float], tmp_path: Path
) -> None:
    sweep_dir, name = tmp_path / "sweep", _job_name("twonode")
    job = _run_job(_two_node_args(name, sweep_dir), name, sweep_dir, tmp_path)
    script = (job / f"{job.name}_submission.sh").read_text()
    assert "#SBATCH --nodes=2" in script and "#SBATCH --ntasks-per-node=1" in script
    assert _sacct_nodes(job.name) == ["2"]
    logs = {
        rank: (job / f"{job.name}_{rank}_log.out").read_text()
        + (job / f"{job.name}_{rank}_log.err").read_text()
        for rank in (0, 1)
    }
    for rank in (0, 1):  # submitit's view of each task: node `rank` of 2, global rank `rank` of 2
        assert f"node={rank}(2), global_rank={rank}(2)" in logs[rank], logs[rank][-3000:]

    (run_dir,) = _job_dirs(sweep_dir)  # one run dir for both nodes
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["global_step"] == DDP_STEPS, summary
    assert json.loads((run_dir / "run.json").read_text())["world_size"] == 2
    # bit-equal, as measured: the same 2 ranks, batches and gloo all-reduce, only the nodes differ
    assert _losses(run_dir) == single_node_reference
    steps = [
        e["step"]
        for e in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
        if "loss" in e
    ]
    assert steps == list(range(1, DDP_STEPS + 1))  # each step logged once: rank 1 wrote nothing
    assert "run dir:" in logs[0] and "run dir:" not in logs[1]  # only global rank 0 reports the run
    _assert_no_job_processes(sweep_dir, name)


def test_two_node_job_preempted_resumes_on_both_nodes_to_the_same_losses(
    single_node_reference: dict[int, float], tmp_path: Path
) -> None:
    """USR2 to the 2-node job reaches the task on each node; both agree on a step, save it and stop;
    the job is requeued onto two nodes again and both ranks resume from that checkpoint."""
    sweep_dir, name = tmp_path / "sweep", _job_name("twonodepreempt")
    proc = _ablate(_two_node_args(name, sweep_dir), cwd=tmp_path)
    job_id, run_dir, stopped_at = _preempted_then_finished(proc, sweep_dir, name)

    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["global_step"] == DDP_STEPS, summary
    assert _losses(run_dir) == pytest.approx(
        single_node_reference, rel=1e-5, abs=1e-6
    )  # no step lost, repeated or changed
    assert _sacct_states(["-X", "-D", "-j", job_id], ["REQUEUED", "COMPLETED"])
    assert _sacct_nodes(job_id) == ["2", "2"]  # both attempts on two nodes
    logs = {p.name: p.read_text() for p in (sweep_dir / ".submitit").glob("*/*_log.*")}
    for rank in (0, 1):  # each node's task stopped at the agreed step and resumed from it
        log = logs[f"{job_id}_{rank}_log.out"] + logs[f"{job_id}_{rank}_log.err"]
        assert f"checkpoint-{stopped_at} saved; the job is requeued" in log, f"rank {rank}:\n{log[-3000:]}"
        assert f"resuming from {run_dir}/checkpoints/checkpoint-{stopped_at}" in log, (
            f"rank {rank}:\n{log[-3000:]}"
        )
        assert "run failed" not in log and "Connection closed by peer" not in log, (
            f"rank {rank}:\n{log[-3000:]}"
        )
    _assert_no_job_processes(sweep_dir, name)


def _task_pid(sweep_dir: Path, rank: int) -> int:
    """The process of the job's task `rank` (on node `rank`): its environment says which."""
    import psutil

    for p in psutil.process_iter(["pid", "name", "cmdline"]):
        try:
            cmd = " ".join(p.info["cmdline"] or [])
            if (
                "submitit.core._submit" in cmd
                and str(sweep_dir) in cmd
                and p.info["name"].startswith("python")
                and p.environ().get("SLURM_PROCID") == str(rank)
            ):
                return p.info["pid"]
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    raise AssertionError(f"no process for task {rank}: {_job_logs(sweep_dir)}")


def test_a_node_whose_task_dies_ends_the_job_in_one_line_and_the_rerun_resumes(
    single_node_reference: dict[int, float], tmp_path: Path
) -> None:
    """The task on the second node SIGKILLed after the first checkpoint (its node as good as gone):
    rank 0 on the first node ends at once with the one line that names the checkpoint to resume
    from, the job ends within seconds (no wait for ddp_timeout, 600 s), the multirun fails, and the
    same command again resumes both nodes from that checkpoint to the one-node run's losses."""
    sweep_dir, name = tmp_path / "sweep", _job_name("twonodecrash")
    args = _two_node_args(name, sweep_dir)
    proc = _ablate(args, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 300
        # a sealed checkpoint (its manifest is written last): killed while one is still being written,
        # rank 0 rightly names none to resume from (failed so once in CI-like load)
        while not list(sweep_dir.glob(f"0*/checkpoints/checkpoint-*/{MANIFEST}")):
            assert proc.poll() is None and time.monotonic() < deadline, _job_logs(sweep_dir)
            time.sleep(0.2)
        os.kill(_task_pid(sweep_dir, 1), 9)
        killed = time.monotonic()
        (run_dir,) = _job_dirs(sweep_dir)
        while json.loads((run_dir / "summary.json").read_text())["status"] != "failed":  # rank 0's end
            assert time.monotonic() - killed < 30, (
                f"rank 0 still running 30 s after its peer died\n{_job_logs(sweep_dir)}"
            )
            time.sleep(0.2)
        while _sh("squeue", "-h", f"--name={name}").stdout.strip():  # the job's end: srun ends the step
            assert time.monotonic() - killed < 60, (
                f"the job still runs 60 s after a task died\n{_job_logs(sweep_dir)}"
            )
            time.sleep(0.5)
        out = _wait(proc, 300, sweep_dir)  # submitit sees it at its next state check (at least once a minute)
    finally:
        _sh("scancel", f"--name={name}")
    assert proc.returncode != 0, out[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    error = summary["error"]
    assert summary["status"] == "failed" and error.startswith("PeerLostError: rank 0 lost another rank"), (
        summary
    )
    assert "\n" not in error and "start the same command again on every node" in error, error
    step = int(error.split("resumes from checkpoint-")[1].split(":")[0])
    assert (run_dir / "checkpoints" / f"checkpoint-{step}" / "trainer_state.json").is_file()
    _assert_no_job_processes(sweep_dir, name)  # rank 0 did not stay behind in a collective

    proc = _ablate(args, cwd=tmp_path)  # the same command again
    try:
        out = _wait(proc, 420, sweep_dir)
    finally:
        _sh("scancel", f"--name={name}")
    assert proc.returncode == 0, out[-4000:] + _job_logs(sweep_dir)
    assert _job_dirs(sweep_dir) == [run_dir]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["global_step"] == DDP_STEPS, summary
    assert f"resuming from {run_dir}/checkpoints/checkpoint-{step}" in (run_dir / "ablate.log").read_text()
    assert _losses(run_dir) == pytest.approx(single_node_reference, rel=1e-5, abs=1e-6)
    _assert_no_job_processes(sweep_dir, name)
