"""Sweeps on a Ray cluster (`hydra/launcher=ray`), on a 2-node Ray cluster that this module starts on
this machine and stops after it (scripts/ray/local_cluster.py): head on 127.0.0.2, a worker node on
127.0.0.3, one CPU each, ports of their own, token authentication with a token made for the run
(the nodes and every driver get it through RAY_AUTH_TOKEN; the GCS listens on all interfaces).
Only this cluster's processes are stopped (by its dir), never other Ray clusters on the machine.

- the dpo_loss sweep runs with its jobs on both nodes (each job's run.json names its Ray node); a job
  that raises and a job whose process is SIGKILLed (as the OOM killer would) do not stop the other,
  the table shows both failed (exit 1), the killed one ran once (no silent Ray retry), and `ablate
  status` reads the sweep (one sweep proves all of it: the cluster's jobs are the slow part);
- the launching process killed with -9 mid-sweep takes its running jobs with it; `ablate status`
  says so; `ablate sweep ... --resume` completes the sweep, completed jobs skipped;
- SIGTERM to the launching process: every running job records `interrupted`, exit 143, no job
  process left on the cluster;
- Hydra's own launcher test suite, and `hydra.job.chdir` honoured as Hydra's BasicLauncher does.

Run with `python -m pytest -m slow tests/slow/test_ray.py -n 0` (needs `pip install 'ablate[ray]'`,
which `.[dev]` includes, so CI runs it): the cluster's start, 10 short ablate jobs in 3 sweeps, then
Hydra's suite on tiny jobs: ~9 minutes on 2 CPU cores at load average 10-13 (most of it each job's
fresh worker process starting torch), a few on a machine of its own.
"""

from __future__ import annotations

import importlib.util
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("ray") is None, reason="ray is not installed: pip install 'ablate[ray]'"
    ),
]
REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"
COMMON = ["method.args.logging_steps=1", "hydra/launcher=ray", "hydra.launcher.scheduling_strategy=SPREAD"]
TIMEOUT = 900  # one sweep, at most


def _local_cluster():
    spec = importlib.util.spec_from_file_location("local_cluster", REPO / "scripts/ray/local_cluster.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _free_base_port() -> int:
    """A base port whose whole block (GCS, each node's ports, worker ports: base .. base+399) is free
    on every interface (Ray's servers bind 0.0.0.0)."""
    for base in range(21000, 60000, 1000):
        try:
            for port in [*range(base, base + 30), *range(base + 100, base + 400, 37)]:
                with socket.socket() as s:
                    s.bind(("0.0.0.0", port))
            return base
        except OSError:
            continue
    raise RuntimeError("no free block of ports for the Ray cluster")


@pytest.fixture(scope="module")
def cluster():
    """(address, env, base): a 2-node Ray cluster on loopback, the environment its drivers need, its dir."""
    local = _local_cluster()
    base = Path(tempfile.mkdtemp(prefix="ablray", dir="/tmp"))  # short: Ray's socket paths live under it
    auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
    saved = {k: os.environ.get(k) for k in auth}
    # this process too: Ray reads the auth settings once, when this process first loads it (the
    # cluster's start does, and TestHydrasLauncherContract drives the cluster from here)
    os.environ.update(auth)
    env = {
        **os.environ,
        "RAY_USAGE_STATS_ENABLED": "0",
        "COLUMNS": "250",
        "WANDB_MODE": "disabled",
        "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
    }
    env.pop("RAY_ADDRESS", None)
    try:
        address = local.start(base, _free_base_port(), nodes=2, cpus=1, env=env)
        yield address, env, base
    finally:
        local.stop(base)
        left = local.cluster_pids(base)
        shutil.rmtree(base, ignore_errors=True)
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
        assert not left, f"Ray processes of the test cluster left running: {left}"


def start(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.Popen:
    cwd.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(
        [sys.executable, "-m", "ablate", *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def run(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    proc = start(args, cwd, env)
    try:
        out, _ = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise AssertionError(f"ablate {' '.join(args)} did not end in {TIMEOUT}s:\n{out[-5000:]}") from None
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, "")


def sweep_dir(cwd: Path, name: str = "dpo_loss") -> Path:
    (d,) = (cwd / "outputs" / "sweeps" / name).iterdir()
    return d


def jobs(sweep: Path) -> dict[str, Path]:
    return {p.name.split("_")[0]: p for p in sweep.iterdir() if p.is_dir() and p.name[0].isdigit()}


def read(path: Path) -> dict:
    return json.loads(path.read_text())


def rows(stdout: str, table: int = 0) -> dict[str, str]:
    """The rows, by job number, of a table the command printed (`ablate status`: 0 = its own, 1 =
    the end-of-sweep table; a sweep: -1 = the end-of-sweep table; the jobs' own output, streamed by
    Ray with a prefix, is no table here)."""
    tables: list[dict[str, list[str]]] = []
    last = None
    for line in stdout.splitlines():
        cells = [c.strip() for c in line.split("│")[1:-1]] if line.startswith("│") else []
        if line.startswith("┏"):
            tables.append({})
        elif cells and tables and cells[0].isdigit():
            last = tables[-1][cells[0]] = cells
        elif cells and tables and not cells[0] and last is not None and len(cells) == len(last):
            # a cell too long for the terminal wraps onto lines of its own: joined back, word by word
            last[:] = [f"{a} {b}".strip() for a, b in zip(last, cells)]
    return {k: "│ " + " │ ".join(v) + " │" for k, v in tables[table].items()} if tables else {}


def test_dpo_loss_sweep_on_both_nodes_failing_and_killed_jobs_do_not_stop_the_others(
    cluster, tmp_path: Path
) -> None:
    """One sweep of 3 jobs, one per node at a time: the first completes, the second raises, the third's
    process is SIGKILLed (as the OOM killer would). The table shows both failed (exit 1), the killed one
    ran once (no silent Ray retry), each job's run.json names its Ray node (both nodes used), and
    `ablate status` reads the sweep."""
    address, env, _ = cluster
    env = {
        **env,
        "ABLATE_TEST_CRASH_AT": "2",
        "ABLATE_TEST_CRASH_SEED": "2",  # reach the jobs: ABLATE_* is forwarded
        "ABLATE_TEST_KILL_AT": "2",
        "ABLATE_TEST_KILL_SEED": "3",
    }
    r = run(
        [
            "sweep",
            "dpo_loss",
            "method/dpo_loss=sigmoid",
            "seed=1,2,3",
            "method.args.max_steps=3",
            *COMMON,
            "+callbacks.crash._target_=crashing.CrashAt",
            "+callbacks.kill._target_=crashing.KillAt",
            f"hydra.launcher.address={address}",
        ],
        tmp_path,
        env,
    )
    assert r.returncode == 1, r.stdout[-5000:]
    assert "1/3 jobs completed" in r.stdout and "2 sweep job(s) failed" in r.stdout, r.stdout[-5000:]
    table = rows(r.stdout, -1)
    assert "completed" in table["0"], r.stdout[-5000:]
    assert "failed" in table["1"] and "simulated crash at step 2" in table["1"], r.stdout[-5000:]
    assert "failed" in table["2"] and "WorkerCrashedError" in table["2"], r.stdout[-5000:]
    sweep = sweep_dir(tmp_path)  # the default relative sweep dir, where the driver printed it: one launch
    killed = jobs(sweep)["2"]
    assert len(list(killed.glob("killed.*"))) == 1, "the killed job ran again (Ray's retries are on)"
    assert read(killed / "summary.json")["status"] == "failed"

    nodes = {}
    for num, job in jobs(sweep).items():
        info = read(job / "run.json")
        nodes[num] = info["ray"]
        assert info["threads"] == 1, info  # Ray gives the job OMP_NUM_THREADS = its num_cpus
    assert {n["node_ip"] for n in nodes.values()} == {"127.0.0.2", "127.0.0.3"}, nodes  # jobs on each node
    assert len({n["node_id"] for n in nodes.values()}) == 2 and all(n["task_id"] for n in nodes.values()), (
        nodes
    )
    recorded = read(sweep / "ray_jobs.json")
    assert sorted(recorded["jobs"]) == ["0", "1", "2"] and recorded["driver"]["pid"] > 0

    status = subprocess.run(
        [sys.executable, "-m", "ablate", "status", str(sweep)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert status.returncode == 0, status.stderr
    table = rows(status.stdout)
    assert sorted(table) == ["0", "1", "2"] and all("ended" in row for row in table.values()), status.stdout
    assert "completed" in table["0"] and "failed" in table["1"] and "failed" in table["2"], status.stdout
    assert "Ray task" in status.stdout and "1/3 jobs completed" in status.stdout  # the end-of-sweep table too


def _steps_logged(cwd: Path) -> int:
    n = 0
    for metrics in cwd.glob("outputs/sweeps/dpo_loss/*/*/metrics.jsonl"):
        try:
            n += sum('"loss"' in line for line in metrics.read_text().splitlines())
        except OSError:
            pass
    return n


def _completed(cwd: Path) -> int:
    n = 0
    for s in cwd.glob("outputs/sweeps/dpo_loss/*/*/summary.json"):
        try:
            n += read(s)["status"] == "completed"
        except (OSError, ValueError):
            pass
    return n


def test_killed_driver_then_resume_completes_the_sweep(cluster, tmp_path: Path) -> None:
    address, env, _ = cluster
    args = [
        "sweep",
        "dpo_loss",
        "method/dpo_loss=sigmoid",
        "seed=1,2,3",
        "method.args.max_steps=6",
        "method.args.save_steps=2",
        *COMMON,
        f"hydra.launcher.address={address}",
    ]
    proc = start(args, tmp_path, env)
    try:
        deadline = time.monotonic() + TIMEOUT
        while proc.poll() is None and _completed(tmp_path) < 1:  # 3 jobs on 2 CPUs: the third waits
            assert time.monotonic() < deadline, "no job completed in time"
            time.sleep(0.2)
        assert proc.poll() is None, f"the sweep ended before the kill:\n{proc.stdout.read()[-5000:]}"
        sweep = sweep_dir(tmp_path)
        alive = subprocess.run(
            [sys.executable, "-m", "ablate", "status", str(sweep)],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert alive.returncode == 0 and len(rows(alive.stdout)) == 3, alive.stdout + alive.stderr
        assert all(
            s in ("completed", "pending") or s.startswith("running at step")
            for s in (row.split("│")[3].strip() for row in rows(alive.stdout).values())
        ), alive.stdout
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the driver (its own session): Ray ends its tasks
        proc.communicate()
    done = _completed(tmp_path)
    assert done < 3

    time.sleep(3)  # Ray ends a dead driver's tasks within ~2 s
    after = subprocess.run(
        [sys.executable, "-m", "ablate", "status", str(sweep)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    states = [row.split("│")[3].strip() for row in rows(after.stdout).values()]
    assert len(states) == 3 and all(s == "completed" or s.startswith("died") for s in states), after.stdout

    resumed = run([*args, "--resume"], tmp_path, env)
    assert resumed.returncode == 0, resumed.stdout[-5000:]
    assert "3/3 jobs completed" in resumed.stdout and "this launch" in resumed.stdout, resumed.stdout[-5000:]
    assert resumed.stdout.count("skipped") >= done, resumed.stdout[-5000:]
    assert sweep_dir(tmp_path) == sweep  # resumed in place
    for job in jobs(sweep).values():
        summary = read(job / "summary.json")
        assert summary["status"] == "completed" and summary["global_step"] == 6, (job, summary)
        steps = [
            e["step"]
            for e in map(json.loads, (job / "metrics.jsonl").read_text().splitlines())
            if "loss" in e
        ]
        assert steps == [1, 2, 3, 4, 5, 6], (job, steps)  # each step logged once across the kill


def test_sigterm_to_the_launching_process_interrupts_every_job(cluster, tmp_path: Path) -> None:
    """SIGTERM (docker stop, a scheduler's kill) or Ctrl-C of the driver: each running job gets a
    KeyboardInterrupt and records `interrupted` (resumable), the table is printed, exit 143, and
    no job's process is left on the cluster."""
    address, env, base = cluster
    proc = start(
        [
            "sweep",
            "dpo_loss",
            "seed=1",
            "method.args.max_steps=400",
            *COMMON,
            f"hydra.launcher.address={address}",
        ],
        tmp_path,
        env,
    )
    try:
        deadline = time.monotonic() + TIMEOUT
        while (
            proc.poll() is None and len(list(tmp_path.glob("outputs/sweeps/dpo_loss/*/*/metrics.jsonl"))) < 2
        ):
            assert time.monotonic() < deadline, "the jobs did not start training in time"
            time.sleep(0.2)
        assert proc.poll() is None, proc.stdout.read()[-5000:]
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 143, out[-5000:]
    assert "0/2 jobs completed" in out and "interrupted" in out, out[-5000:]
    for job in jobs(sweep_dir(tmp_path)).values():
        summary = read(job / "summary.json")
        assert summary["status"] == "interrupted" and "SIG" in summary["error"], summary
    assert not _job_processes(base)


def _job_processes(base: Path) -> list[str]:
    """The cluster's processes running a job (Ray names a worker `ray::<task name>` while it runs one)."""
    import psutil

    names = []
    for pid in _local_cluster().cluster_pids(base):
        try:
            names.append(psutil.Process(pid).name())
        except psutil.NoSuchProcess:
            pass
    return [n for n in names if "hydra_job" in n]


@pytest.fixture
def driver_env(cluster, monkeypatch):
    """This process as a Ray driver of the test cluster (hydra.launcher.address=auto reads RAY_ADDRESS)."""
    address, env, _ = cluster
    monkeypatch.setenv("RAY_ADDRESS", address)
    monkeypatch.setenv("PYTHONPATH", env["PYTHONPATH"])
    yield
    import ray

    ray.shutdown()  # each test connects afresh: Hydra's fixtures reset its singletons between tests


from hydra.test_utils.launcher_common_tests import LauncherTestSuite  # noqa: E402

import hydra_plugins.ablate_launchers.ray_launcher  # noqa: E402,F401  (its ConfigStore entry survives Hydra's test fixtures)


@pytest.fixture
def hydra_version_base(request):
    """This process's Hydra version_base for one test: None = unset, as in a fresh process (Hydra's
    1.1 defaults: a job runs in its output dir unless hydra.job.chdir=False), or "1.3" (ablate's:
    it stays in the launching dir unless hydra.job.chdir=True). Hydra keeps it in a process-wide
    singleton that nothing resets: once any test of this process composed ablate's config
    (initialize_config_dir(version_base="1.3"): tests/unit/test_ray_launcher.py,
    tests/slow/test_sweep_resume.py) it is 1.3, and Hydra's launcher suite, which assumes unset,
    fails for every launcher, Hydra's own BasicLauncher included (no `a_module.log` in the job's
    working dir). The launcher carries the driver's value to each job (Singleton state)."""
    from hydra.version import _UNSPECIFIED_, VersionBase, setbase

    saved = VersionBase.instance().getbase()
    wanted = getattr(request, "param", None)
    if wanted is None:
        VersionBase.instance().version_base = _UNSPECIFIED_
    else:
        setbase(wanted)
    yield
    VersionBase.instance().version_base = saved


@pytest.mark.usefixtures("driver_env", "hydra_version_base")
@pytest.mark.parametrize("launcher_name, overrides", [("ablate_ray", [])])
class TestHydrasLauncherContract(LauncherTestSuite):
    """Hydra's own test suite for launcher plugins (job dirs, overrides, return values, batches),
    run in this process against the 2-node cluster, in the process state it assumes (no version_base
    set: jobs run in their output dirs)."""


@pytest.mark.usefixtures("driver_env")
@pytest.mark.parametrize(
    "hydra_version_base, chdir, in_output_dir",
    [
        (
            "1.3",
            False,
            False,
        ),  # ablate's version_base and conf/config.yaml's hydra.job.chdir: the launching dir
        ("1.3", True, True),  # a user's hydra.job.chdir=True wins over run_in_launch_dir
    ],
    indirect=["hydra_version_base"],
)  # unset version_base, chdir unset: the output dir (Hydra's suite above)
def test_each_job_runs_where_hydra_job_chdir_says(
    hydra_sweep_runner, hydra_version_base, chdir, in_output_dir, tmp_path: Path, monkeypatch
) -> None:
    """hydra.job.chdir as Hydra's BasicLauncher honours it (hydra.core.utils.run_job), on both nodes:
    the job's cwd is its output dir or, with `run_in_launch_dir`, the driver's cwd, never the raylet's."""
    launch = tmp_path / "launch"
    launch.mkdir()
    monkeypatch.chdir(launch)
    sweep = hydra_sweep_runner(
        calling_file=None,
        calling_module="hydra.test_utils.a_module",
        config_path="configs",
        config_name="compose.yaml",
        task_function=lambda cfg: os.getcwd(),
        temp_dir=tmp_path / "sweep",
        overrides=[
            "hydra/launcher=ablate_ray",
            "hydra.launcher.scheduling_strategy=SPREAD",
            "+a=0,1",
            f"hydra.job.chdir={chdir}",
        ],
    )
    with sweep:
        returns = sweep.returns[0]
        assert len(returns) == 2
        for ret in returns:
            out = os.path.realpath(ret.hydra_cfg.hydra.runtime.output_dir)
            expected = out if in_output_dir else os.path.realpath(launch)
            assert os.path.realpath(ret.return_value) == expected, (chdir, ret.return_value)
            assert os.path.realpath(ret.working_dir) == expected
            assert (Path(out) / "a_module.log").is_file()  # the job's log is in its output dir either way
