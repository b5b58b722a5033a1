"""Submit and walk away: `ablate sweep NAME hydra/launcher=slurm --detach`, then `ablate status SWEEP_DIR`.

Hydra's submitit launcher submits a sweep as one SLURM job array and then blocks on every job's
result (hydra#2479), so the launching process must live as long as the sweep. `DetachedSlurmLauncher`
(hydra_plugins/ablate_launchers/: Hydra instantiates launchers only from that namespace) is that
launcher without the wait: it submits the same array (same sbatch script, same pickled job,
so preemption and requeue work as before), records each job's SLURM id in
`<sweep dir>/slurm_jobs.json`, and returns. `status` reads the run dirs (summary.json, metrics.jsonl,
run.json) plus the scheduler's view (squeue, then sacct once a job left the queue).

No torch import here.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from ablate.record import rundir

JOBS_FILE = "slurm_jobs.json"


def read_jobs(sweep_dir: Path) -> dict[str, dict[str, Any]]:
    return rundir.read_json(sweep_dir / JOBS_FILE) or {}


def scheduler_states(job_ids: list[str]) -> dict[str, str]:
    """SLURM's state of each job id (`123_0`): squeue while queued or running, else sacct; {} without it."""
    if not job_ids:
        return {}
    states: dict[str, str] = {}
    arrays = sorted({j.split("_")[0] for j in job_ids})
    try:
        q = subprocess.run(
            ["squeue", "-h", "-r", "-o", "%i|%T", "-j", ",".join(arrays)],
            capture_output=True,
            text=True,
            timeout=30,
        )
        states.update(line.split("|", 1) for line in q.stdout.split() if "|" in line)
        missing = [j for j in job_ids if j not in states]
        if missing:
            a = subprocess.run(
                ["sacct", "-n", "-P", "-X", "-o", "JobID,State", "-j", ",".join(arrays)],
                capture_output=True,
                text=True,
                timeout=30,
            )
            for line in a.stdout.split():
                job, _, state = line.partition("|")
                if job in missing:
                    states[job] = state.split(" ")[0]  # "CANCELLED by 0" -> CANCELLED
    except (OSError, subprocess.TimeoutExpired):
        pass
    return states


def _max_steps(run_dir: Path) -> int | None:
    config = (rundir.read_json(run_dir / rundir.RUN) or {}).get("config") or {}
    steps = config.get("method", {}).get("args", {}).get("max_steps")
    return steps if isinstance(steps, int) and steps > 0 else None


def job_state(run_dir: Path | None, slurm: str | None) -> str:
    """One job in words: pending / running at step N of M / completed / failed: <error> /
    interrupted at step N of M / preempted, requeued (<SLURM state>) / <SLURM state> for a job that
    died before ablate wrote. The run dir's state is `rundir.state`'s, the one `ablate ls` shows: a
    `running` job whose process is gone (its lock let go: kill -9, OOM) is interrupted, not running."""
    summary = rundir.read_json(run_dir / rundir.SUMMARY) if run_dir else None
    status = rundir.state(run_dir, summary) if run_dir is not None and summary is not None else None
    if status == "completed":
        return "completed"
    if status == "pruned":  # a study's pruner stopped the trial (hydra/sweeper=optuna): done, not failed
        return f"pruned at step {summary.get('pruned_at', summary.get('global_step', '?'))}"
    if status == "failed":
        return f"failed: {summary.get('error', '?')}"
    alive = slurm in (
        "PENDING",
        "RUNNING",
        "REQUEUED",
        "CONFIGURING",
        "COMPLETING",
        "REQUEUE_HOLD",
        "SUSPENDED",
    )
    if status == "preempted":
        return (
            f"preempted, requeued ({(slurm or '?').lower()})"
            if alive or slurm is None
            else f"preempted ({slurm})"
        )
    if status in ("running", "interrupted"):
        if status == "running" and slurm is not None and not alive:
            return f"died ({slurm}, no summary)"
        events = rundir.read_metrics(run_dir) if run_dir else []
        step = events[-1]["step"] if events else 0
        total = _max_steps(run_dir) if run_dir else None
        return f"{status} at step {step} of {total or '?'}"
    if status is not None:  # unreadable, or a status of a newer ablate
        return status
    if slurm is None or slurm == "PENDING":
        return "pending"
    return "starting" if alive else f"{slurm.lower()} (before ablate started)"


def status(sweep_dir: Path, note: str = "") -> bool:
    """One table of each job's state (with its key metric once it has one, and the scheduler's view
    where a scheduler ran it); once all are done, how to compare them. True when all are done."""
    from rich.console import Console
    from rich.table import Table

    from ablate.launchers import ray_jobs, sweep

    recorded = read_jobs(sweep_dir)
    # hydra/launcher=ray: no scheduler to ask, its driver instead
    driver, ray_recorded = ray_jobs.read(sweep_dir)
    dirs = {p.name.split("_")[0]: p for p in sweep_dir.iterdir() if p.is_dir() and p.name[0].isdigit()}
    nums = sorted(set(recorded) | set(ray_recorded) | set(dirs), key=int)
    slurm = scheduler_states([recorded[n]["job_id"] for n in nums if n in recorded])
    alive = ray_jobs.driver_alive(driver)
    metrics = {r["job"]: r["metric"] for r in sweep.job_rows(sweep_dir)}
    table = Table()
    columns = (
        ("Ray task", "launching process")
        if ray_recorded
        else ("SLURM job", "SLURM state")
        if recorded
        else ()
    )
    for col in ("job", "overrides", "state", "key metric", *columns):
        table.add_column(col, overflow="fold")
    known = {**ray_recorded, **recorded}
    overrides = {
        n: known[n]["overrides"]
        if n in known
        else (rundir.read_json(dirs[n] / rundir.RUN) or {}).get("overrides", [])
        for n in nums
    }
    varying = {
        o
        for n in nums
        for o in overrides[n]
        if sum(o in overrides[m] for m in nums) < len(nums) or len(nums) == 1
    }
    done, completed = True, 0
    for n in nums:
        if ray_recorded:
            recorded_status = (
                (rundir.read_json(dirs[n] / rundir.SUMMARY) or {}).get("status") if n in dirs else None
            )
            state = ray_jobs.job_state(job_state(dirs.get(n), None), alive, recorded_status)
            task = ray_recorded.get(n, {}).get("task_id", "-")
            scheduler = [
                task[:16],
                {True: "running", False: "ended", None: f"on {driver.get('host')}" if driver else "-"}[alive],
            ]
        elif recorded:
            job_id = recorded.get(n, {}).get("job_id")
            state = job_state(dirs.get(n), slurm.get(job_id) if job_id else None)
            scheduler = [job_id or "-", slurm.get(job_id or "", "-")]
        else:  # a local launch: no scheduler to ask
            state, scheduler = job_state(dirs.get(n), None), []
        done &= (
            state == "completed"
            or state.startswith(("failed", "died", "preempted (", "interrupted", "pruned"))
            or "before ablate" in state
        )
        completed += state == "completed" or state.startswith("pruned")
        shown = " ".join(o for o in overrides[n] if o in varying and not o.startswith("+sweep="))
        table.add_row(n, shown, state, metrics.get(n, "-"), *scheduler)
    counts = f"{completed}/{len(nums)} jobs completed" if done and nums else f"{len(nums)} jobs"
    print(f"sweep {sweep_dir}{note}: {counts}")
    Console(width=200).print(table)
    if done and nums:
        sweep.print_next_steps(sweep_dir)
    return done
