"""`hydra/launcher=ray`: each job of a multirun is one Ray task on a running Ray cluster.

A Hydra Launcher on Ray's public API (ray.init / ray.remote / .options / ray.wait / ray.get /
ray.cancel / ray.nodes), the recipe of Hydra's own joblib and ray launchers: the launching process
(the driver) builds each job's sweep config, the task restores Hydra's globals
(`setup_globals`, `Singleton.set_state`) and calls `hydra.core.utils.run_job`.

Why not hydra-ray-launcher 1.2.2 (the `ray` launcher on PyPI), measured with ray 2.60 / hydra 1.3.8:
  - it cannot be installed next to ablate: it pins cloudpickle<3, joblib 1.6 (hydra/launcher=
    local_parallel) needs cloudpickle>=3 (pip: ResolutionImpossible);
  - it passes object_store_memory to ray.init, which Ray refuses when joining a running cluster;
  - its jobs run in the raylet's cwd (where `ray start` ran), so a relative sweep dir splits between
    the driver (multirun.yaml, the end-of-sweep table: "0/0 jobs completed") and the jobs;
  - Ray workers do not inherit the driver's environment (ABLATE_LAUNCH_TIME, the resume flag, PYTHONPATH);
  - a job whose process dies (OOM kill, segfault) is re-run 3 times from scratch, then the launcher
    aborts and the other jobs' results are lost; resources no node has wait forever.
This launcher: no ray.init extras; the sweep dir resolved once on the driver and made absolute, jobs
in the driver's cwd (a filesystem shared by the nodes at the same path, as under SLURM); chosen
environment variables forwarded; max_retries=0 and a dead job becomes a FAILED JobReturn (the other
jobs still run, the table shows it); infeasible resources fail at launch; a fresh worker process per
job (max_calls=1: no CUDA memory or state carried over); Ctrl-C / SIGTERM of the driver interrupts
the running jobs (KeyboardInterrupt in each: `interrupted`, resumable), then kills them after a grace.

`ray` is imported only when a sweep launches: Hydra imports every plugin module at each start-up.
"""

# no `from __future__ import annotations`: Hydra executes plugin modules outside sys.modules at
# discovery, where a dataclass with string annotations cannot be built
import fnmatch
import logging
import os
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.config_search_path import ConfigSearchPath
from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, configure_log, filter_overrides, run_job, setup_globals
from hydra.plugins.launcher import Launcher
from hydra.plugins.search_path_plugin import SearchPathPlugin
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf, open_dict

log = logging.getLogger(__name__)
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@dataclass
class RayLauncherConf:
    """The schema of conf/hydra/launcher/ray.yaml (each field is commented there)."""

    _target_: str = "hydra_plugins.ablate_launchers.ray_launcher.RayLauncher"
    address: str | None = "auto"
    num_cpus: float = 1
    num_gpus: float = 0
    memory_gb: float | None = None
    resources: dict[str, float] = field(default_factory=dict)
    max_retries: int = 0
    max_calls: int | None = 1
    scheduling_strategy: str | None = None
    forward_env: list[str] = field(default_factory=lambda: ["PYTHONPATH", "ABLATE_*"])
    env: dict[str, str] = field(default_factory=dict)
    run_in_launch_dir: bool = True
    check_feasible: bool = True
    cancel_grace_s: float = 60.0
    runtime_env: dict[str, Any] = field(default_factory=dict)
    init: dict[str, Any] = field(default_factory=dict)
    remote: dict[str, Any] = field(default_factory=dict)


# `ablate_ray`, not `ray`: `hydra/launcher=ray` is conf/hydra/launcher/ray.yaml, with this schema as its
# default.
ConfigStore.instance().store(
    group="hydra/launcher", name="ablate_ray", node=RayLauncherConf, provider="ablate"
)


class AblateRayLauncherFirst(SearchPathPlugin):
    """With hydra-ray-launcher installed too, `hydra/launcher=ray` would fail in ablate: that plugin
    stores a schema named `hydra/launcher/ray` in the ConfigStore, and Hydra 1.3 still validates a
    config file against a ConfigStore schema of the same name (its deprecated "automatic schema
    matching"), which rejects ablate's fields ("Error merging 'hydra/launcher/ray' with schema").
    Hydra calls this once every plugin is imported and before any config is loaded: for ablate's app
    only (its conf/ is on the search path), that schema is dropped, so `hydra/launcher=ray` is
    ablate's launcher. The other plugin's `hydra/launcher=ray_aws` stays; other apps are untouched."""

    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        from ablate.paths import conf_dir

        conf = conf_dir()
        if not any(e.path in (conf, f"file://{conf}") for e in search_path.get_path()):
            return
        launchers = ConfigStore.instance().repo.get("hydra", {}).get("launcher", {})
        node = launchers.get("ray.yaml")
        if node is not None and getattr(node, "provider", None) != "ablate":
            del launchers["ray.yaml"]


def _execute(
    hydra_context: HydraContext,
    sweep_config: DictConfig,
    task_function: TaskFunction,
    singleton_state: dict[Any, Any],
    cwd: str | None,
) -> JobReturn:
    """Runs in a Ray worker process: one Hydra job."""
    import ray

    setup_globals()
    Singleton.set_state(singleton_state)
    with open_dict(sweep_config):
        sweep_config.hydra.job.id = f"ray_{ray.get_runtime_context().get_task_id()}"
    HydraConfig.instance().set_config(sweep_config)
    old_cwd = os.getcwd()
    if cwd is not None:
        os.chdir(cwd)  # FileNotFoundError here: this node does not share the driver's filesystem
    try:  # run_job honours hydra.job.chdir from here, as Hydra's BasicLauncher does (ablate's conf: false)
        return run_job(
            hydra_context=hydra_context,
            task_function=task_function,
            config=sweep_config,
            job_dir_key="hydra.sweep.dir",
            job_subdir_key="hydra.sweep.subdir",
        )
    finally:
        os.chdir(old_cwd)


class RayLauncher(Launcher):
    def __init__(self, **params: Any) -> None:
        self.params = OmegaConf.create(params)
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None
        self.task_function: TaskFunction | None = None
        self._cancelled: set = set()

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config = config
        self.hydra_context = hydra_context
        self.task_function = task_function

    def _init_ray(self) -> None:
        import ray

        if ray.is_initialized():
            return
        init = OmegaConf.to_container(self.params.init, resolve=True)
        kwargs: dict[str, Any] = dict(init)  # type: ignore[arg-type]
        kwargs.setdefault("address", self.params.address)
        kwargs.setdefault("logging_level", logging.WARNING)
        t0 = time.time()
        try:
            ray.init(**kwargs)
        except ConnectionError as e:  # no cluster there: a one-line error, not Ray's traceback
            from ablate.errors import ConfigError

            first = next((line.strip() for line in str(e).splitlines() if line.strip()), type(e).__name__)
            raise ConfigError(
                f"hydra/launcher=ray: no Ray cluster at address {kwargs['address']!r} ({first}); start one "
                "(`ray start --head`) or set hydra.launcher.address=HOST:PORT of its head"
            ) from None
        nodes = [n for n in ray.nodes() if n["Alive"]]
        log.info(
            f"Ray: connected in {time.time() - t0:.1f}s to {len(nodes)} node(s), resources "
            f"{ray.cluster_resources()}"
        )

    def job_env(self) -> dict[str, str]:
        """The driver's variables the jobs get: `forward_env` patterns, then `env` (Ray workers are the
        raylet's children, on whichever node: they do not inherit the driver's environment)."""
        p = self.params
        env = {
            k: v for k, v in os.environ.items() if any(fnmatch.fnmatchcase(k, pat) for pat in p.forward_env)
        }
        env.update({str(k): str(v) for k, v in p.env.items()})
        return env

    def remote_options(self) -> dict[str, Any]:
        """Each job's task options: resources, retries, placement, runtime_env (env vars included)."""
        p = self.params
        opts: dict[str, Any] = {"num_cpus": p.num_cpus, "num_gpus": p.num_gpus, "max_retries": p.max_retries}
        if p.memory_gb is not None:
            opts["memory"] = int(float(p.memory_gb) * 1024**3)
        if p.resources:
            opts["resources"] = dict(p.resources)
        if p.scheduling_strategy is not None:
            opts["scheduling_strategy"] = p.scheduling_strategy
        env = OmegaConf.to_container(p.runtime_env, resolve=True)
        runtime_env: dict[str, Any] = dict(env)  # type: ignore[arg-type]
        env_vars = {**self.job_env(), **runtime_env.get("env_vars", {})}
        if env_vars:
            runtime_env["env_vars"] = env_vars
        if runtime_env:
            opts["runtime_env"] = runtime_env
        opts.update(OmegaConf.to_container(p.remote, resolve=True))  # type: ignore[arg-type]
        return opts

    def _check_feasible(self, opts: dict[str, Any]) -> None:
        """Ray keeps a task that no node could ever fit pending forever: refuse at launch instead."""
        import ray

        need = {
            "CPU": float(opts.get("num_cpus") or 0),
            "GPU": float(opts.get("num_gpus") or 0),
            "memory": float(opts.get("memory") or 0),
            **{k: float(v) for k, v in opts.get("resources", {}).items()},
        }
        need = {k: v for k, v in need.items() if v > 0}
        nodes = [n["Resources"] for n in ray.nodes() if n["Alive"]]
        if not any(all(res.get(k, 0.0) >= v for k, v in need.items()) for res in nodes):
            from ablate.errors import ConfigError

            have = [{k: v for k, v in res.items() if k in need} for res in nodes]
            raise ConfigError(
                f"hydra/launcher=ray: no node of the Ray cluster has {need} for one job "
                f"(the nodes have {have}); Ray would keep the jobs pending forever"
            )

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        try:
            import ray
        except ImportError:
            from ablate.errors import missing_extra

            raise missing_extra("ray", "ray", "hydra/launcher=ray") from None

        assert self.config is not None and self.hydra_context is not None and self.task_function is not None
        setup_globals()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        p = self.params
        # resolved here, once: a resolver such as ${now:...} must not run again on another node, later
        sweep_dir = Path(str(self.config.hydra.sweep.dir)).absolute()
        sweep_dir.mkdir(parents=True, exist_ok=True)
        previous = {s: signal.getsignal(s) for s in STOP_SIGNALS}  # before ray.init, which replaces SIGTERM's
        self._init_ray()
        opts = self.remote_options()
        if p.check_feasible:
            self._check_feasible(opts)
        # max_calls is accepted by ray.remote() only, not by .options()
        remote = (
            ray.remote(max_calls=p.max_calls)(_execute) if p.max_calls is not None else ray.remote(_execute)
        )
        shown = {k: v for k, v in opts.items() if k != "runtime_env"}
        log.info(
            f"Ray launcher: {len(job_overrides)} jobs, sweep dir {sweep_dir}, task options {shown}, "
            f"max_calls={p.max_calls}, env {sorted(opts.get('runtime_env', {}).get('env_vars', {}))}"
        )
        refs: list[Any] = []
        overrides_of: dict[Any, list[str]] = {}
        results: dict[Any, JobReturn] = {}
        started = time.time()
        # Ctrl-C / SIGTERM while the jobs run: noted here, acted on between waits. A handler that raises
        # (ablate's sweep parent's, interrupts.forward_to_workers) would raise inside Ray's C code,
        # which turns anything but KeyboardInterrupt into a SystemError or loses it; and ray.init put
        # its own SIGTERM handler (sys.exit, and a C-level one that can abort the process) in place.
        caught: list[int] = []
        for s in STOP_SIGNALS:
            signal.signal(s, lambda signum, frame: caught.append(signum))
        try:
            self._submit(remote, opts, job_overrides, initial_job_idx, sweep_dir, caught, refs, overrides_of)
            pending = list(refs)
            while pending and not caught:
                done, pending = ray.wait(pending, num_returns=1, timeout=0.5)
                for ref in done:
                    results[ref] = self._result(
                        ref, overrides_of[ref], sweep_dir, initial_job_idx + refs.index(ref)
                    )
                    log.info(
                        f"job {' '.join(filter_overrides(overrides_of[ref]))}: {results[ref].status.name} "
                        f"({len(results)}/{len(job_overrides)} done, {time.time() - started:.1f}s)"
                    )
            if caught:
                self._cancel([ref for ref in refs if ref not in results])
                for s, handler in previous.items():
                    signal.signal(s, handler if handler is not None else signal.SIG_DFL)
                # the signal again, now to the handler from before: ablate's raises Interrupted /
                # KeyboardInterrupt (the sweep table, exit 143 / 130), the default one ends the process
                os.kill(os.getpid(), caught[0])
                time.sleep(1)
                raise KeyboardInterrupt
        except BaseException:  # Ray's own errors while submitting or waiting; the re-raised signal
            self._cancel([ref for ref in refs if ref not in results])
            raise
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler if handler is not None else signal.SIG_DFL)
        return [results[ref] for ref in refs]

    def _submit(
        self,
        remote: Any,
        opts: dict[str, Any],
        job_overrides: Sequence[Sequence[str]],
        first: int,
        sweep_dir: Path,
        caught: list[int],
        refs: list[Any],
        overrides_of: dict[Any, list[str]],
    ) -> None:
        """Submit each job as a Ray task until a stop signal is caught, its ref appended to `refs` at once
        (the caller cancels what was submitted if this raises); then record the task ids for `ablate
        status`."""
        from ablate.launchers import ray_jobs

        assert self.config is not None and self.hydra_context is not None and self.task_function is not None
        state = Singleton.get_state()
        cwd = os.getcwd() if self.params.run_in_launch_dir else None
        for i, overrides in enumerate(job_overrides):
            if caught:
                break
            idx = first + i
            log.info(f"\t#{idx} : {' '.join(filter_overrides(overrides))}")
            sweep_config = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
            with open_dict(sweep_config):
                sweep_config.hydra.job.num = idx
                sweep_config.hydra.sweep.dir = str(sweep_dir)
            ref = remote.options(name=f"hydra_job_{idx}", **opts).remote(
                self.hydra_context, sweep_config, self.task_function, state, cwd
            )
            refs.append(ref)
            overrides_of[ref] = list(overrides)
        jobs = {
            str(first + i): {"task_id": ref.task_id().hex(), "overrides": overrides_of[ref]}
            for i, ref in enumerate(refs)
        }
        ray_jobs.record(sweep_dir, jobs)

    def _result(self, ref: Any, overrides: list[str], sweep_dir: Path, num: int) -> JobReturn:
        """A finished task's JobReturn; a task that ended without one (its process killed: OOM, a
        signal, a lost node) is a FAILED JobReturn, recorded in its run dir too."""
        import ray

        from ablate.launchers import ray_jobs

        try:
            return ray.get(ref)
        except Exception as e:  # RayTaskError, WorkerCrashedError, OutOfMemoryError, NodeDiedError, ...
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            log.error(f"job {' '.join(overrides)} did not finish: {type(e).__name__}: {first}")
            ray_jobs.record_death(sweep_dir, num, e)
            return JobReturn(overrides=overrides, status=JobStatus.FAILED, _return_value=e)

    def _cancel(self, refs: list[Any]) -> None:
        """Interrupt the unfinished jobs: KeyboardInterrupt inside each running task first (the job
        records `interrupted`), then, after cancel_grace_s, kill the worker processes (a task blocked
        in one long C call only sees the KeyboardInterrupt when that call returns)."""
        import ray

        refs = [ref for ref in refs if ref not in self._cancelled]
        self._cancelled.update(refs)
        if not refs:
            return
        log.warning(f"interrupted: cancelling {len(refs)} Ray task(s), grace {self.params.cancel_grace_s}s")
        for ref in refs:
            ray.cancel(ref, force=False)
        _, alive = ray.wait(refs, num_returns=len(refs), timeout=float(self.params.cancel_grace_s))
        for ref in alive:
            ray.cancel(ref, force=True)
