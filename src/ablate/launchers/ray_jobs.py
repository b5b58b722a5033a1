"""Following a Ray sweep (`hydra/launcher=ray`) from its files, as `ablate status SWEEP_DIR` does.

The launcher (hydra_plugins/ablate_launchers/ray_launcher.py) records `<sweep dir>/ray_jobs.json`
when it has submitted the jobs: each job's number, overrides and Ray task id, and the launching
process (the driver: host, pid). A job's dir appears only when its task starts, so the file is what
shows the jobs still waiting for a free node as `pending`. Ray ends a sweep's tasks when their
driver dies (kill -9, a lost login node), leaving `running` in their summaries: a driver known to be
gone turns those into `died ...`, and `ablate sweep --resume` continues them.

No torch import here, and no `ray` import: `ablate status` needs neither.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from ablate.record import rundir

JOBS_FILE = "ray_jobs.json"


def record(sweep_dir: Path, jobs: dict[str, dict[str, Any]]) -> None:
    """Add `jobs` (job number -> {task_id, overrides}) to the sweep's ray_jobs.json, with this
    process as the driver (a resumed sweep's launch replaces the earlier driver)."""
    path = sweep_dir / JOBS_FILE
    _, recorded = read(sweep_dir)
    recorded.update(jobs)
    driver = {"host": socket.gethostname(), "pid": os.getpid(), "started": time.time()}
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps({"driver": driver, "jobs": recorded}, indent=2) + "\n")
    tmp.replace(path)


def read(sweep_dir: Path) -> tuple[dict[str, Any] | None, dict[str, dict[str, Any]]]:
    """(driver, jobs) of a Ray sweep; (None, {}) for any other sweep."""
    data = rundir.read_json(sweep_dir / JOBS_FILE) or {}
    return data.get("driver"), dict(data.get("jobs") or {})


def driver_alive(driver: dict[str, Any] | None) -> bool | None:
    """Whether the sweep's launching process still runs; None when that cannot be told from here
    (it ran on another machine)."""
    if not driver or driver.get("host") != socket.gethostname():
        return None
    import psutil

    try:  # the same process, not a later one that got its pid
        return psutil.Process(int(driver["pid"])).create_time() <= float(driver.get("started", 0)) + 1
    except (psutil.NoSuchProcess, ValueError, KeyError):
        return False


def job_state(state: str, alive: bool | None, recorded: str | None = None) -> str:
    """One Ray job in words, from its run dir's `state` (launchers.slurm.job_state: pending /
    running at step N of M / interrupted at step N of M / completed / failed: ...), whether the
    driver runs, and the status its summary.json `recorded`. With the driver gone, a job can no
    longer be running or pending; a job that recorded `running` and whose process is gone (its lock
    let go: `rundir.state` says interrupted) was ended by Ray with the driver, as is one that
    recorded a SystemExit. A job that recorded `interrupted` itself (the driver's SIGTERM/Ctrl-C
    cancelled it) stays `interrupted`."""
    left_running = state.startswith("running") or (recorded == "running" and state.startswith("interrupted "))
    if alive is False and left_running:
        at = state.split(" ", 1)[1] if " " in state else state
        return f"died with the sweep's launching process ({at}); ablate sweep --resume"
    if alive is False and state.startswith("failed: SystemExit"):  # Ray tells a dead driver's workers to exit
        return f"died with the sweep's launching process ({state[len('failed: ') :]}); ablate sweep --resume"
    if alive is False and state == "pending":
        return "died before it started: the sweep's launching process is gone; ablate sweep --resume"
    return state


def record_death(sweep_dir: Path, num: int, error: BaseException) -> None:
    """A job whose Ray task ended without a result (its process killed: OOM, a signal, a lost node)
    left `running` in its summary, if it got that far: record it as failed, with Ray's reason, so the
    end-of-sweep table and `ablate status` say so (and `--resume` continues it from its checkpoint)."""
    from ablate.launchers.sweep_resume import job_dir

    d = job_dir(sweep_dir, num)
    summary = rundir.read_json(d / rundir.SUMMARY) if d else None
    if summary is None or summary.get("status") != "running":
        return
    first = next((line.strip() for line in str(error).splitlines() if line.strip()), "")
    summary.update(status="failed", error=f"{type(error).__name__}: {first}"[:300])
    rundir.write_json(d / rundir.SUMMARY, summary)
