"""hydra/launcher=ray without a cluster (no `ray` needed): its config, what each job's task is given
(resources, retries, the forwarded environment: never a secret by default), the one line when the
`ray` extra is missing, and how `ablate status` words a Ray sweep's jobs. The cluster itself:
tests/slow/test_ray.py."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import time
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from ablate.errors import ConfigError
from ablate.launchers import ray_jobs, slurm
from ablate.paths import conf_dir
from ablate.config import checks
from ablate.process import setup as process
from ablate.config.compose import register_resolvers
from hydra_plugins.ablate_launchers.ray_launcher import RayLauncher, RayLauncherConf

YAML = Path(conf_dir()) / "hydra" / "launcher" / "ray.yaml"


def launcher_config(*overrides: str):
    register_resolvers()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=conf_dir(), version_base="1.3"):
            return compose(
                "config", overrides=["hydra/launcher=ray", *overrides], return_hydra_config=True
            ).hydra.launcher
    finally:
        GlobalHydra.instance().clear()


def launcher(*overrides: str) -> RayLauncher:
    params = OmegaConf.to_container(launcher_config(*overrides), resolve=True)
    params.pop("_target_")
    return RayLauncher(**params)


def test_hydra_launcher_ray_is_ablates_launcher_with_safe_defaults():
    cfg = launcher_config()
    assert cfg._target_ == "hydra_plugins.ablate_launchers.ray_launcher.RayLauncher"
    assert cfg.address == "auto" and cfg.max_retries == 0 and cfg.max_calls == 1 and cfg.run_in_launch_dir
    assert cfg.num_cpus == 1 and cfg.num_gpus == 0 and cfg.check_feasible
    # every field of the schema is set, with a comment, in conf/hydra/launcher/ray.yaml
    text = YAML.read_text()
    keys = yaml.safe_load(text)
    for f in dataclasses.fields(RayLauncherConf):
        if f.name == "_target_":
            continue
        assert f.name in keys, f.name
        line = next(ln for ln in text.splitlines() if ln.startswith(f"{f.name}:"))
        assert "#" in line or f.name == "forward_env", line  # forward_env: the comment block above it


@dataclasses.dataclass
class OtherRayLauncherConf:  # the shape of hydra-ray-launcher 1.2.2's schema
    _target_: str = "hydra_plugins.hydra_ray_launcher.ray_launcher.RayLauncher"
    ray: dict = dataclasses.field(default_factory=lambda: {"init": {"address": None}, "remote": {}})


def test_ablates_ray_launcher_wins_over_hydra_ray_launchers_schema():
    """hydra-ray-launcher stores a schema `hydra/launcher/ray` in Hydra's ConfigStore; Hydra 1.3 would
    validate conf/hydra/launcher/ray.yaml against it and fail ("Error merging 'hydra/launcher/ray'
    with schema"). With it stored as that plugin does, `hydra/launcher=ray` is still ablate's."""
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    cs.store(group="hydra/launcher", name="ray", node=OtherRayLauncherConf, provider="ray_launcher")
    try:
        assert launcher_config()._target_ == "hydra_plugins.ablate_launchers.ray_launcher.RayLauncher"
    finally:
        cs.repo["hydra"]["launcher"].pop("ray.yaml", None)


def test_each_job_gets_resources_no_retries_and_the_forwarded_environment_without_secrets(monkeypatch):
    for k in list(os.environ):
        if k.startswith(("ABLATE_", "WANDB_", "HF_", "RAY_")) or k == "PYTHONPATH":
            monkeypatch.delenv(k)
    monkeypatch.setenv("PYTHONPATH", "/src")
    monkeypatch.setenv("ABLATE_LAUNCH_TIME", "2026-01-02T03:04:05")
    monkeypatch.setenv("ABLATE_RESUME_SWEEP", "1")
    monkeypatch.setenv("WANDB_MODE", "offline")
    for secret in ("WANDB_API_KEY", "HF_TOKEN", "RAY_AUTH_TOKEN"):
        monkeypatch.setenv(secret, "s3cret")
    opts = launcher(
        "hydra.launcher.memory_gb=2",
        "hydra.launcher.num_gpus=1",
        "+hydra.launcher.env.EXTRA=x",
        "+hydra.launcher.resources.A100=1",
    ).remote_options()
    env = opts.pop("runtime_env")["env_vars"]
    assert env == {
        "PYTHONPATH": "/src",
        "ABLATE_LAUNCH_TIME": "2026-01-02T03:04:05",
        "ABLATE_RESUME_SWEEP": "1",
        "WANDB_MODE": "offline",
        "EXTRA": "x",
    }
    assert opts == {
        "num_cpus": 1,
        "num_gpus": 1,
        "max_retries": 0,
        "memory": 2 * 1024**3,
        "resources": {"A100": 1},
    }
    spread = launcher("hydra.launcher.scheduling_strategy=SPREAD").remote_options()
    assert spread["scheduling_strategy"] == "SPREAD"


def test_missing_ray_is_one_line_naming_the_extra(monkeypatch):
    monkeypatch.setattr(checks, "installed", lambda module: module != "ray")
    with pytest.raises(ConfigError) as e:
        checks.check_launcher(OmegaConf.create({"launcher": {"_target_": RayLauncherConf._target_}}))
    assert (
        str(e.value)
        == "hydra/launcher=ray needs the optional package 'ray', not installed: pip install 'ablate[ray]'"
    )
    checks.check_launcher(
        OmegaConf.create(
            {"launcher": {"_target_": "hydra._internal.core_plugins.basic_launcher.BasicLauncher"}}
        )
    )


def _job(sweep: Path, name: str, summary: dict | None, steps: int = 0) -> Path:
    d = sweep / name
    d.mkdir(parents=True)
    (d / "run.json").write_text(
        json.dumps({"overrides": ["seed=1"], "config": {"method": {"args": {"max_steps": 6}}}})
    )
    if summary is not None:
        (d / "summary.json").write_text(json.dumps(summary))
    (d / "metrics.jsonl").write_text(
        "".join(json.dumps({"step": s + 1, "loss": 1.0}) + "\n" for s in range(steps))
    )
    return d


def test_status_words_when_the_launching_process_is_gone(tmp_path):
    running = _job(tmp_path, "0_seed=1", {"status": "running"}, steps=3)
    done = _job(tmp_path, "1_seed=2", {"status": "completed"})

    def state(run_dir, alive):
        return ray_jobs.job_state(slurm.job_state(run_dir, None), alive)

    assert state(running, True) == "running at step 3 of 6"
    assert state(None, True) == "pending"
    assert state(running, False).startswith("died with the sweep's launching process (at step 3 of 6)")
    assert state(None, False).startswith("died before it started")
    assert state(done, False) == "completed"
    assert state(running, None) == "running at step 3 of 6"  # driver on another machine: unknown
    exited = _job(tmp_path, "2_seed=3", {"status": "failed", "error": "SystemExit: 1"})
    assert state(exited, False).startswith("died with the sweep's launching process (SystemExit: 1)")
    assert state(exited, True) == "failed: SystemExit: 1"


def test_a_job_left_running_whose_lock_is_free_died_with_the_launching_process(tmp_path):
    """What a real job leaves when Ray ends it with its driver: summary `running`, its run-dir lock let
    go (rundir.state: interrupted). A job that recorded `interrupted` itself (the driver's SIGTERM
    cancelled it) is not one Ray killed with the driver."""
    killed = _job(tmp_path, "0_seed=1", {"status": "running"}, steps=2)
    (killed / ".lock").write_text("PID 1 on host gone\n")  # nobody holds it
    stopped = _job(tmp_path, "1_seed=2", {"status": "interrupted", "error": "SIGTERM"}, steps=4)

    def state(run_dir, alive):
        recorded = json.loads((run_dir / "summary.json").read_text())["status"]
        return ray_jobs.job_state(slurm.job_state(run_dir, None), alive, recorded)

    assert slurm.job_state(killed, None) == "interrupted at step 2 of 6"
    assert (
        state(killed, False)
        == "died with the sweep's launching process (at step 2 of 6); ablate sweep --resume"
    )
    assert (
        state(killed, None) == "interrupted at step 2 of 6"
    )  # driver on another machine: what the run dir says
    assert state(stopped, False) == "interrupted at step 4 of 6"


def test_ray_jobs_file_and_driver_liveness(tmp_path):
    ray_jobs.record(tmp_path, {"0": {"task_id": "ab", "overrides": ["seed=1"]}})
    ray_jobs.record(tmp_path, {"1": {"task_id": "cd", "overrides": ["seed=2"]}})  # a resumed launch adds
    driver, jobs = ray_jobs.read(tmp_path)
    assert sorted(jobs) == ["0", "1"] and driver["pid"] == os.getpid()
    assert ray_jobs.driver_alive(driver) is True
    assert (
        ray_jobs.driver_alive({**driver, "started": time.time() - 10**6}) is False
    )  # a later process with its pid
    assert ray_jobs.driver_alive({**driver, "host": socket.gethostname() + "-other"}) is None
    assert ray_jobs.read(tmp_path / "nothing") == (None, {})


def test_a_job_whose_process_died_is_recorded_failed(tmp_path):
    running = _job(tmp_path, "0_seed=1", {"status": "running"})
    done = _job(tmp_path, "1_seed=2", {"status": "completed"})
    crash = RuntimeError("The worker died unexpectedly while executing this task.\nmore")
    ray_jobs.record_death(tmp_path, 0, crash)
    ray_jobs.record_death(tmp_path, 1, crash)
    ray_jobs.record_death(tmp_path, 2, crash)  # never started: nothing to record
    assert json.loads((running / "summary.json").read_text()) == {
        "status": "failed",
        "error": "RuntimeError: The worker died unexpectedly while executing this task.",
    }
    assert json.loads((done / "summary.json").read_text()) == {"status": "completed"}


def test_run_json_names_no_ray_node_outside_ray():
    assert process.ray_node() is None


def test_the_local_clusters_jobs_are_not_reniced():
    """scripts/ray/local_cluster.py: Ray renices its workers to 15 unless RAY_worker_niceness says
    otherwise; on one shared machine such jobs starve (a 2-job sweep waited 9 minutes beside a test
    suite), so the nodes' environment sets 0, and a value the caller set is kept."""
    import importlib.util

    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("local_cluster", root / "scripts/ray/local_cluster.py")
    local = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(local)
    assert local.environment({})["RAY_worker_niceness"] == "0"
    assert local.environment({"RAY_worker_niceness": "15"})["RAY_worker_niceness"] == "15"
