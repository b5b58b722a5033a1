"""How many CPU threads torch may use in this process.

torch's default pool takes every core of the machine, per process. When processes share cores
(parallel sweep jobs, torchrun ranks, several SLURM tasks on a node) the pools oversubscribe: on a
2-core machine a tiny run took 34-70 s under load and 6.7 s with one thread. ablate therefore gives
each process the cores it may actually run on (`os.sched_getaffinity`, which cgroups, taskset and
SLURM's binding narrow) divided among the processes that share them on this machine.

Imports no torch at module level; `apply` imports it (the run needs it anyway).
"""

from __future__ import annotations

import os
from typing import Any


def available_cores() -> int:
    """Cores this process may run on: its CPU affinity (Linux), SLURM's per-task allotment, else all."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # macOS, Windows
        cores = os.cpu_count() or 1
    slurm = os.environ.get("SLURM_CPUS_PER_TASK", "")
    if slurm.isdigit() and int(slurm) > 0:  # without task binding the affinity is the whole node
        cores = min(cores, int(slurm))
    return max(cores, 1)


def local_jobs(launcher: Any = None) -> tuple[int, str]:
    """Processes sharing these cores, and why: torchrun's ranks on this node (LOCAL_WORLD_SIZE), or
    the joblib launcher's parallel jobs (`launcher`: Hydra's hydra.launcher node, `n_jobs`)."""
    local = os.environ.get("LOCAL_WORLD_SIZE", "")
    if local.isdigit() and int(local) > 1:
        return int(local), f"LOCAL_WORLD_SIZE={local}"
    n_jobs = _get(launcher, "n_jobs")
    if isinstance(n_jobs, int) and n_jobs != 1:
        # joblib: -1 = one job per core, -2 = all but one, ...
        jobs = n_jobs if n_jobs > 0 else max(available_cores() + 1 + n_jobs, 1)
        return jobs, f"hydra.launcher.n_jobs={n_jobs}"
    return 1, ""


def _get(node: Any, key: str) -> Any:
    try:
        return node.get(key) if node is not None else None
    except Exception:  # a launcher node of any shape: no n_jobs
        return None


def choose(setting: int | None, launcher: Any = None) -> tuple[int, str]:
    """The thread count and where it came from: the `threads` config key, else OMP_NUM_THREADS
    (the user's environment), else available cores // local jobs (at least 1)."""
    if setting is not None:  # checked by its schema (ablate.schema.nodes.Root)
        if int(setting) > 4 * available_cores():  # the machine, not the value: known only where the run runs
            from ablate.errors import ConfigError

            raise ConfigError(
                f"threads={setting}: this machine gives the run {available_cores()} cores; more than "
                f"4 threads per core only slows torch down (null: one per core)"
            )
        return int(setting), "config threads"
    omp = os.environ.get("OMP_NUM_THREADS", "")
    if omp.isdigit() and int(omp) > 0:
        # joblib's loky workers (hydra/launcher=local_parallel) get cores // n_jobs here unless the user set
        # it
        return int(omp), f"OMP_NUM_THREADS={omp}"
    cores = available_cores()
    jobs, why = local_jobs(launcher)
    return max(cores // jobs, 1), f"{cores} cores available" + (
        f" / {jobs} local jobs ({why})" if jobs > 1 else ""
    )


def apply(setting: int | None, launcher: Any = None) -> dict[str, Any]:
    """Set torch's intra-op thread count; returns what run.json records."""
    import torch

    n, source = choose(setting, launcher)
    torch.set_num_threads(n)
    return {"threads": n, "threads_source": source}
