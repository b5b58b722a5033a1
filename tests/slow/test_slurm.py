"""SLURM through Hydra's submitit launcher (hydra/launcher=slurm), on a real one-node cluster:
a 2-job sweep runs as SLURM jobs, and a job sent USR2 mid-training checkpoints, is requeued and
resumes from that checkpoint in the same run dir and W&B run (offline), finishing with every step
logged exactly once. A 2-task job (tasks_per_node=2, one DDP run) is one run dir; preempted, it
resumes to the per-step losses of an uninterrupted 2-task run with every rank stopped cleanly, and a
crashed one continues from its checkpoint when the same command is run again.

The session fixture uses the cluster answering `sinfo` (with accounting: `sacct`), else starts one with
scripts/slurm/start.sh (root + apt-get: installs slurm-wlm, munge, mariadb) and stops it at the end;
elsewhere the tests skip with the reason. Run: `python -m pytest -m slow tests/slow/test_slurm.py`
(about 10 minutes on 2 loaded CPU cores once the cluster is up).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
START, STOP = REPO / "scripts" / "slurm" / "start.sh", REPO / "scripts" / "slurm" / "stop.sh"
ENV = {**os.environ, "COLUMNS": "250", "WANDB_MODE": "disabled"}


def _sh(*cmd: str, timeout: float = 60) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        return subprocess.CompletedProcess(list(cmd), 127, "", str(e))


def _cluster_state() -> str | None:
    """None when a cluster with accounting answers, else what is missing."""
    sinfo = _sh("sinfo", "-h", "-o", "%T")
    if sinfo.returncode != 0:
        return "no SLURM cluster answering `sinfo`"
    if not {"idle", "mixed", "allocated"} & set(sinfo.stdout.split()):
        return f"the SLURM node is not usable (sinfo: {sinfo.stdout.split()})"
    if _sh("sacct", "-n", "-X", "-S", "now").returncode != 0:
        return (
            "SLURM answers but has no accounting (`sacct` fails; a cancelled job would hang the multirun): "
            "if it is ours, rerun scripts/slurm/start.sh"
        )
    return None


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[None]:
    """A usable cluster for the session: the running one, else one started here (and stopped after)."""
    missing = _cluster_state()
    if missing is None:
        yield
        return
    if (
        missing.startswith("no SLURM")
        and os.geteuid() == 0
        and (shutil.which("apt-get") or shutil.which("slurmctld"))
    ):
        start = _sh("bash", str(START), timeout=900)
        assert start.returncode == 0, (
            f"scripts/slurm/start.sh failed:\n{start.stdout[-3000:]}\n{start.stderr[-3000:]}"
        )
        try:
            missing = _cluster_state()
            assert missing is None, f"started by scripts/slurm/start.sh, yet {missing}"
            yield
        finally:
            _sh("bash", str(STOP), timeout=180)
        return
    pytest.skip(
        f"{missing}; scripts/slurm/start.sh can start one only as root with apt-get (this is "
        f"{'root' if os.geteuid() == 0 else 'not root'}, apt-get {'found' if shutil.which('apt-get') else 'missing'})"
    )


def _job_name(tag: str) -> str:
    """A SLURM job name of our own, so squeue/sacct never pick up someone else's jobs."""
    return f"ablate-test-{os.getpid()}-{tag}"


def _ablate(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "ablate", *args],
        cwd=cwd,
        env={**ENV, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _wait(proc: subprocess.Popen, timeout: float, sweep_dir: Path) -> str:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        pytest.fail(f"multirun still running after {timeout} s\n{out[-3000:]}\n{_job_logs(sweep_dir)}")
    return out


def _job_logs(sweep_dir: Path) -> str:
    """The tail of every SLURM job's stdout/stderr (submitit folder), for failure messages."""
    logs = sorted((sweep_dir / ".submitit").glob("*/*_log.*"))
    return "\n".join(f"--- {p}\n{p.read_text()[-2000:]}" for p in logs)


def _sacct_states(args: list[str], expected: list[str], timeout: float = 60) -> list[str]:
    """The jobs' states from accounting, polled until they are `expected` (slurmdbd may lag a little);
    returns them (asserting on the result shows what sacct said)."""
    deadline = time.monotonic() + timeout
    while True:
        states = _sh("sacct", "-n", "-P", "-o", "State", *args).stdout.split()
        if states == expected or time.monotonic() > deadline:
            assert states == expected, f"sacct {' '.join(args)}: {states}, expected {expected}"
            return states
        time.sleep(1)


def _job_dirs(sweep_dir: Path) -> list[Path]:
    return sorted(
        (p for p in sweep_dir.iterdir() if p.is_dir() and p.name[0].isdigit()),
        key=lambda p: int(p.name.split("_")[0]),
    )


def _preempt_after_first_checkpoint(proc: subprocess.Popen, sweep_dir: Path, name: str) -> list[str]:
    """Wait until job 0 is training and has written a checkpoint, then preempt it with USR2; its SLURM job id."""
    deadline = time.monotonic() + 300
    while not list(sweep_dir.glob("0*/checkpoints/checkpoint-*/trainer_state.json")):
        assert proc.poll() is None, f"multirun ended before a checkpoint\n{proc.stdout.read()[-3000:]}"
        assert time.monotonic() < deadline, f"no checkpoint after 300 s\n{_job_logs(sweep_dir)}"
        time.sleep(0.2)
    job_id = _sh("squeue", "-h", f"--name={name}", "-t", "RUNNING", "-o", "%i").stdout.split()
    assert len(job_id) == 1, f"expected our one running job, squeue says {job_id}"
    assert _sh("scancel", "--signal=USR2", job_id[0]).returncode == 0
    return job_id


def _preempted_then_finished(proc: subprocess.Popen, sweep_dir: Path, name: str) -> tuple[str, Path, int]:
    """USR2 after the job's first checkpoint: the run dir says `preempted` at a step before the last,
    with that step's checkpoint saved; then the requeued job runs to its end. (job id, run dir, step)."""
    try:
        (job_id,) = _preempt_after_first_checkpoint(proc, sweep_dir, name)
        run_dir = _job_dirs(sweep_dir)[0]
        deadline = time.monotonic() + 120
        while json.loads((run_dir / "summary.json").read_text())["status"] != "preempted":
            assert time.monotonic() < deadline, f"not preempted 120 s after USR2\n{_job_logs(sweep_dir)}"
            time.sleep(0.1)
        stopped_at = max(_losses(run_dir))
        assert stopped_at < DDP_STEPS, "finished before the signal: nothing was preempted"
        assert (run_dir / "checkpoints" / f"checkpoint-{stopped_at}" / "trainer_state.json").is_file()
    except BaseException:
        _sh("scancel", f"--name={name}")
        proc.kill()
        raise
    out = _wait(proc, 420, sweep_dir)
    assert proc.returncode == 0, out[-4000:] + _job_logs(sweep_dir)
    return job_id, run_dir, stopped_at


def _loss_steps(run_dir: Path) -> list[int]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [e["step"] for e in map(json.loads, lines) if "loss" in e]


TWO_SEEDS = """# @package _global_
# two seeds, 10 steps each
sweep_name: two_seeds  # outputs/sweeps/two_seeds/
method:
  args:
    max_steps: 10  # steps per job
hydra:
  sweeper:
    params:
      seed: 1,2  # two jobs
"""


def test_sweep_runs_as_slurm_jobs(slurm_cluster: None, tmp_path: Path) -> None:
    sweep_file = tmp_path / "mysweeps" / "two_seeds.yaml"  # a sweep config of the user's own
    sweep_file.parent.mkdir()
    sweep_file.write_text(TWO_SEEDS)
    sweep_dir, name = tmp_path / "out", _job_name("sweep")
    proc = _ablate(
        [
            "sweep",
            str(sweep_file),
            "hydra/launcher=slurm",
            f"hydra.launcher.name={name}",
            "method.args.logging_steps=5",
            f"hydra.sweep.dir={sweep_dir}",
        ],
        cwd=tmp_path,
    )
    out = _wait(proc, 420, sweep_dir)
    assert proc.returncode == 0, out[-4000:] + _job_logs(sweep_dir)
    assert "2/2 jobs completed" in out

    jobs = _job_dirs(sweep_dir)
    assert [j.name.split("_")[0] for j in jobs] == ["0", "1"]
    for job, seed in zip(jobs, ("1", "2")):  # each job dir follows the run directory contract
        summary = json.loads((job / "summary.json").read_text())
        assert summary["status"] == "completed" and summary["global_step"] == 10, summary
        assert f"seed={seed}" in summary["overrides"]
        assert _loss_steps(job) == [5, 10]
        assert (job / "model" / "model.safetensors").is_file() and (job / "run.json").is_file()
        assert (job / ".hydra" / "config.yaml").is_file()

    # they really ran as SLURM jobs: submitit's folder in the sweep dir, sbatch script, sacct records
    scripts = list((sweep_dir / ".submitit").glob("*/*_submission.sh"))
    assert len(scripts) == 1 and "#SBATCH --partition=debug" in scripts[0].read_text()
    assert len(list((sweep_dir / ".submitit").glob("*/*_result.pkl"))) == 2
    assert _sacct_states(["-X", f"--name={name}", "-S", "now-1hour"], ["COMPLETED", "COMPLETED"])


def test_preempted_job_requeues_and_resumes_from_its_checkpoint(slurm_cluster: None, tmp_path: Path) -> None:
    max_steps = 400
    sweep_dir, name = tmp_path / "sweep", _job_name("preempt")
    proc = _ablate(
        [
            "train",
            "-m",
            "seed=1",
            f"method.args.max_steps={max_steps}",
            "method.args.save_steps=20",
            "method.args.logging_steps=1",
            "logger=wandb",
            "hydra/launcher=slurm",
            f"hydra.launcher.name={name}",
            f"hydra.sweep.dir={sweep_dir}",
        ],
        cwd=tmp_path,
        env={"WANDB_MODE": "offline"},
    )
    try:
        # 1. wait until the job is training and has written a checkpoint, then preempt it with USR2
        job_id = _preempt_after_first_checkpoint(proc, sweep_dir, name)

        # 2. the first attempt checkpoints at the end of its step and exits with status preempted
        run_dir = _job_dirs(sweep_dir)[0]
        deadline = time.monotonic() + 120
        while json.loads((run_dir / "summary.json").read_text())["status"] != "preempted":
            assert time.monotonic() < deadline, f"not preempted 120 s after USR2\n{_job_logs(sweep_dir)}"
            time.sleep(0.1)
        before = _loss_steps(run_dir)
        stopped_at = before[-1]
        assert before == list(range(1, stopped_at + 1)) and stopped_at < max_steps
        assert (run_dir / "checkpoints" / f"checkpoint-{stopped_at}" / "trainer_state.json").is_file(), (
            "no checkpoint at the step the preempted job stopped"
        )
    except BaseException:
        _sh("scancel", f"--name={name}")  # leave nothing running on the shared cluster
        proc.kill()
        raise
    out = _wait(proc, 420, sweep_dir)
    assert proc.returncode == 0, out[-4000:] + _job_logs(sweep_dir)

    # 3. the requeued job resumed from that checkpoint in the same run dir and finished
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["global_step"] == max_steps, summary
    assert _loss_steps(run_dir) == list(range(1, max_steps + 1))  # no step lost, none logged twice
    assert (
        f"resuming from {run_dir}/checkpoints/checkpoint-{stopped_at}" in (run_dir / "ablate.log").read_text()
    )
    assert _sacct_states(["-X", "-D", "-j", job_id[0]], ["REQUEUED", "COMPLETED"])  # -D: every attempt
    # ... and continued the same W&B run: one offline run dir per attempt, both with the id in run.json
    run_id = json.loads((run_dir / "run.json").read_text())["wandb_run_id"]
    attempts = sorted(p.name for p in (run_dir / "wandb").glob("offline-run-*"))
    assert len(attempts) == 2 and all(a.endswith(f"-{run_id}") for a in attempts), (run_id, attempts)


def test_detached_sweep_returns_at_once_and_status_follows_it(slurm_cluster: None, tmp_path: Path) -> None:
    """`--detach`: the launching process returns once the array is submitted (default sweep dir);
    `ablate status` shows the jobs pending/running, then completed with the end-of-sweep table."""
    sweep_file = tmp_path / "mysweeps" / "two_seeds.yaml"
    sweep_file.parent.mkdir()
    sweep_file.write_text(TWO_SEEDS.replace("max_steps: 10", "max_steps: 60"))
    name = _job_name("detach")
    t0 = time.monotonic()
    proc = _ablate(
        [
            "sweep",
            str(sweep_file),
            "hydra/launcher=slurm",
            f"hydra.launcher.name={name}",
            "method.args.logging_steps=5",
            "--detach",
        ],
        cwd=tmp_path,
    )
    try:
        out = _wait(proc, 120, tmp_path)
        submitted_in = time.monotonic() - t0
        assert proc.returncode == 0, out[-4000:]
        (sweep_dir,) = (tmp_path / "outputs" / "sweeps" / "two_seeds").iterdir()
        assert f"ablate status {sweep_dir}" in out and "submitted 2 SLURM jobs" in out
        finished = [
            p for p in sweep_dir.glob("*/summary.json") if json.loads(p.read_text())["status"] == "completed"
        ]
        assert len(finished) < 2, (
            f"returned after {submitted_in:.0f} s, when the jobs had finished"
        )  # no waiting

        first = subprocess.run(
            [sys.executable, "-m", "ablate", "status", str(sweep_dir)],
            cwd=tmp_path,
            env=ENV,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert first.returncode == 0, first.stderr
        rows = [line for line in first.stdout.splitlines() if line.startswith("│")]
        assert len(rows) == 2 and all(
            ("pending" in r or "running at step" in r or "starting" in r or "completed" in r) for r in rows
        ), first.stdout
        seen, deadline = {first.stdout}, time.monotonic() + 300
        while True:
            now = subprocess.run(
                [sys.executable, "-m", "ablate", "status", str(sweep_dir)],
                cwd=tmp_path,
                env=ENV,
                capture_output=True,
                text=True,
                timeout=60,
            )
            seen.add(now.stdout)
            if (
                "2/2 jobs completed" in now.stdout and now.stdout.count("COMPLETED") == 2
            ):  # + SLURM's view (sacct)
                break
            assert time.monotonic() < deadline, f"{now.stdout}\n{_job_logs(sweep_dir)}"
            time.sleep(2)
        assert any("of 60" in s for s in seen) or any("pending" in s for s in seen), seen  # states were shown
    finally:
        _sh("scancel", f"--name={name}")


def test_two_tasks_per_node_are_one_ddp_run_with_one_run_dir(slurm_cluster: None, tmp_path: Path) -> None:
    """hydra.launcher.tasks_per_node=2 (CPU, gloo): one job, two processes, one run dir written by
    rank 0, as under torchrun (tests/slow/test_ddp.py); default sweep dir."""
    name = _job_name("ddp")
    proc = _ablate(
        [
            "train",
            "-m",
            "seed=1",
            "hydra/launcher=slurm",
            f"hydra.launcher.name={name}",
            "hydra.launcher.tasks_per_node=2",
            "hydra.launcher.cpus_per_task=1",
            "method.args.use_cpu=true",
            "method.args.max_steps=6",
            "method.args.logging_steps=1",
        ],
        cwd=tmp_path,
    )
    try:
        out = _wait(proc, 420, tmp_path)
    finally:
        _sh("scancel", f"--name={name}")
    (sweep_dir,) = (tmp_path / "outputs" / "sweeps" / "multirun").iterdir()
    assert proc.returncode == 0, out[-4000:] + _job_logs(sweep_dir)
    (run_dir,) = _job_dirs(sweep_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["global_step"] == 6, summary
    assert summary["metrics"]["epoch"] == pytest.approx(6 * 16 / 512)  # 2 ranks x 8 pairs per step
    assert _loss_steps(run_dir) == [1, 2, 3, 4, 5, 6]  # rank 1 wrote nothing
    logs = "".join(p.read_text() for p in (sweep_dir / ".submitit").glob("*/*_log.out"))
    assert logs.count("run dir:") == 1, logs[-3000:]  # only rank 0 prints the result


# --- several tasks per job (hydra.launcher.tasks_per_node=2): preemption and resume ------------------
DDP_STEPS = 200  # ~20 s of training at 2 tasks; the signal lands after the first checkpoint (step 10)


def _ddp_args(name: str, sweep_dir: Path, *extra: str) -> list[str]:
    """One 2-task DPO job (CPU, gloo), a checkpoint every 10 steps, the loss logged every step."""
    return [
        "train",
        "-m",
        "seed=1",
        "hydra/launcher=slurm",
        f"hydra.launcher.name={name}",
        "hydra.launcher.tasks_per_node=2",
        "hydra.launcher.cpus_per_task=1",
        "method.args.use_cpu=true",
        f"method.args.max_steps={DDP_STEPS}",
        "method.args.save_steps=10",
        "method.args.logging_steps=1",
        f"hydra.sweep.dir={sweep_dir}",
        *extra,
    ]


def _losses(run_dir: Path) -> dict[int, float]:
    return {
        e["step"]: e["loss"]
        for e in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
        if "loss" in e
    }


def _job_processes(sweep_dir: Path) -> list[str]:
    """Processes still running for a sweep dir's jobs (srun, the tasks): none once the job is over."""
    import psutil

    found = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if str(sweep_dir) in cmd and p.info["pid"] != os.getpid():
            found.append(f"{p.info['pid']}: {cmd[:200]}")
    return found


def _assert_no_job_processes(sweep_dir: Path, name: str) -> None:
    deadline = time.monotonic() + 30  # srun and the tasks exit within moments of the result
    while _job_processes(sweep_dir) or _sh("squeue", "-h", f"--name={name}").stdout.strip():
        assert time.monotonic() < deadline, (
            f"left running: {_job_processes(sweep_dir)}; "
            f"squeue: {_sh('squeue', '-h', f'--name={name}').stdout}"
        )
        time.sleep(0.5)


@pytest.fixture(scope="module")
def ddp_reference(slurm_cluster: None, tmp_path_factory: pytest.TempPathFactory) -> dict[int, float]:
    """The per-step losses of an uninterrupted 2-task run: what every interrupted one must reproduce."""
    tmp = tmp_path_factory.mktemp("ddp_reference")
    sweep_dir, name = tmp / "sweep", _job_name("ddpref")
    proc = _ablate(_ddp_args(name, sweep_dir), cwd=tmp)
    try:
        out = _wait(proc, 420, sweep_dir)
    finally:
        _sh("scancel", f"--name={name}")
    assert proc.returncode == 0, out[-4000:] + _job_logs(sweep_dir)
    (run_dir,) = _job_dirs(sweep_dir)
    losses = _losses(run_dir)
    assert sorted(losses) == list(range(1, DDP_STEPS + 1))
    return losses


def test_two_task_job_preempted_resumes_to_the_same_losses(
    ddp_reference: dict[int, float], tmp_path: Path
) -> None:
    """USR2 to a 2-task job: both ranks agree on the step, save it, stop (no rank left training or
    dying in a collective), the job is requeued, both ranks resume from that checkpoint, and the
    per-step losses equal the uninterrupted run's."""
    sweep_dir, name = tmp_path / "sweep", _job_name("ddppreempt")
    proc = _ablate(_ddp_args(name, sweep_dir), cwd=tmp_path)  # USR2 reaches both tasks (srun forwards it)
    job_id, run_dir, stopped_at = _preempted_then_finished(proc, sweep_dir, name)

    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["global_step"] == DDP_STEPS, summary
    assert _losses(run_dir) == pytest.approx(
        ddp_reference, rel=1e-5, abs=1e-6
    )  # no step lost, repeated or changed
    assert _sacct_states(["-X", "-D", "-j", job_id], ["REQUEUED", "COMPLETED"])
    logs = {p.name: p.read_text() for p in (sweep_dir / ".submitit").glob("*/*_log.*")}
    task_logs = [logs[f"{job_id}_{rank}_log.out"] + logs[f"{job_id}_{rank}_log.err"] for rank in (0, 1)]
    for rank, log in enumerate(task_logs):  # each rank stopped at the agreed step and resumed from it
        assert f"checkpoint-{stopped_at} saved; the job is requeued" in log, f"rank {rank}:\n{log[-3000:]}"
        assert f"resuming from {run_dir}/checkpoints/checkpoint-{stopped_at}" in log, (
            f"rank {rank}:\n{log[-3000:]}"
        )
        assert "run failed" not in log and "Connection closed by peer" not in log, (
            f"rank {rank}:\n{log[-3000:]}"
        )
    _assert_no_job_processes(sweep_dir, name)


def test_crashed_two_task_job_rerun_continues_from_its_checkpoint(
    ddp_reference: dict[int, float], tmp_path: Path
) -> None:
    """Both ranks crash at step 37 (after checkpoint-30): the multirun fails, leaving status failed;
    the same command again resumes both ranks from checkpoint-30 and ends on the reference losses."""
    sweep_dir, name = tmp_path / "sweep", _job_name("ddpcrash")
    args = _ddp_args(name, sweep_dir, "+callbacks.crash._target_=crashing.CrashAt")
    env = {"PYTHONPATH": os.pathsep.join([str(REPO / "tests"), os.environ.get("PYTHONPATH", "")])}
    proc = _ablate(args, cwd=tmp_path, env={**env, "ABLATE_TEST_CRASH_AT": "37"})
    try:
        out = _wait(proc, 420, sweep_dir)
    finally:
        _sh("scancel", f"--name={name}")
    assert proc.returncode != 0 and "simulated crash at step 37" in out + _job_logs(sweep_dir), out[-3000:]
    (run_dir,) = _job_dirs(sweep_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed" and "simulated crash at step 37" in summary["error"], summary
    _assert_no_job_processes(sweep_dir, name)  # rank 1 did not hang in a collective

    proc = _ablate(args, cwd=tmp_path, env=env)  # the same command, without the crash
    try:
        out = _wait(proc, 420, sweep_dir)
    finally:
        _sh("scancel", f"--name={name}")
    assert proc.returncode == 0, out[-4000:] + _job_logs(sweep_dir)
    assert _job_dirs(sweep_dir) == [run_dir]  # the same run dir, continued
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["global_step"] == DDP_STEPS, summary
    assert f"resuming from {run_dir}/checkpoints/checkpoint-30" in (run_dir / "ablate.log").read_text()
    assert _losses(run_dir) == pytest.approx(ddp_reference, rel=1e-5, abs=1e-6)
    _assert_no_job_processes(sweep_dir, name)
