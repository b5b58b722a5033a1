"""`ablate ls [DIR]`: what have I run? One line per run under outputs/ (or DIR), newest first.

Also `prepare`, called by `ablate.train` right after the run dir is claimed: sets torch's thread
count and records it, the run's tags and notes, and the process that runs it (so `ablate ls` can
tell a run still going from one whose process died) in run.json.

Reads the run directory contract only: imports neither torch nor transformers.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
from pathlib import Path
from typing import Any

from ablate import rundir
from ablate.compare import Run, find_runs

STATUSES = ("running", "completed", "failed", "interrupted", "preempted")
NOT_NAMING = {"sweep_name", "tags", "notes"}  # labels, shown in their own columns


def prepare(cfg: Any, run_dir: Path, info: dict[str, Any]) -> None:
    """Early in a run, before any heavy work: threads, malloc, tags, notes, pid -> run.json."""
    from hydra.core.hydra_config import HydraConfig

    from ablate import memory, threads

    launcher = HydraConfig.get().get("launcher") if HydraConfig.initialized() else None
    info.update(threads.apply(cfg.get("threads"), launcher))
    info.update(memory.apply(cfg.get("malloc_mmap_threshold")))  # before the model's first tensors
    info["tags"] = [str(t) for t in (cfg.get("tags") or [])]
    info["notes"] = cfg.get("notes")
    info["host"], info["pid"] = socket.gethostname(), os.getpid()
    # processes in the run (torchrun ranks, SLURM tasks): `ablate resume` refuses to continue a
    # several-process run as one (the batch per step would change, and with it the losses)
    info["world_size"] = int(os.environ.get("WORLD_SIZE", "1"))
    rundir.write_json(run_dir / rundir.RUN, info)


def tags_of(run: Run) -> list[str]:
    info = rundir.read_json(run.path / rundir.RUN) or {}
    return [str(t) for t in info.get("tags") or []]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: it exists
        return True
    return True


def status_of(run: Run, info: dict[str, Any]) -> str:
    """summary.json's status, refined: a Ctrl-C'd run, or a `running` one whose process on this host
    is gone (killed, machine rebooted), is `interrupted` (`ablate resume` continues it)."""
    status = run.status
    if status == "failed" and str(run.summary.get("error", "")).startswith("KeyboardInterrupt"):
        return "interrupted"
    if status == "running" and info.get("host") == socket.gethostname() and isinstance(info.get("pid"), int):
        if not _alive(info["pid"]):
            return "interrupted"
    return status


def key_metric(run: Run) -> tuple[str, float | None]:
    """The method's first compare metric (its YAML's `compare_metrics`, recorded in summary.json) and its final value."""
    name = run.default_metrics[0]
    return name, run.final(name)


def row(run: Run, root: Path) -> dict[str, Any]:
    info = rundir.read_json(run.path / rundir.RUN) or {}
    step = run.summary.get("global_step")
    if step is None and run.events:
        step = run.events[-1].get("step")
    metric, value = key_metric(run)
    try:
        rel = str(run.path.relative_to(root))
    except ValueError:
        rel = str(run.path)
    started = info.get("started")
    if started is None:  # a job Hydra launched before ablate wrote run.json: the dir's time
        import time

        started = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(run.path.stat().st_mtime))
    return {"started": started, "method": run.method if run.method != "?" else info.get("method", "?"),
            "name": " ".join(f"{k}={v}" for k, v in run.overrides.items() if k not in NOT_NAMING) or "(defaults)",
            "status": status_of(run, info), "step": step, "metric": metric, "value": value,
            "tags": [str(t) for t in info.get("tags") or []], "notes": info.get("notes"),
            "error": run.summary.get("error"), "path": rel}


def list_runs(root: Path, status: str | None = None, method: str | None = None,
              tags: list[str] | None = None) -> list[dict[str, Any]]:
    """Rows of every run under `root`, newest first, filtered (a run must carry every tag given)."""
    rows = [row(r, root) for r in find_runs([root])]
    rows = [r for r in rows if (status is None or r["status"] == status) and (method is None or r["method"] == method)
            and all(t in r["tags"] for t in tags or [])]
    return sorted(rows, key=lambda r: (r["started"], r["path"]), reverse=True)


def format_rows(rows: list[dict[str, Any]]) -> list[str]:
    """Aligned plain-text lines; the path comes last and is never cut or wrapped (pipes, `cut`, awk)."""
    header = ["started", "method", "status", "step", "metric", "tags", "name", "path"]
    cells = [[r["started"].replace("T", " "), r["method"], r["status"], "-" if r["step"] is None else str(r["step"]),
              f"{r['metric']}={r['value']:.4g}" if r["value"] is not None else f"{r['metric']}=-",
              ",".join(r["tags"]) or "-", r["name"], r["path"]] for r in rows]
    widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, h in enumerate(header)]
    return ["  ".join(c.ljust(w) for c, w in zip(line[:-1], widths)) + "  " + line[-1]
            for line in [header, *cells]]


def ls_cmd(argv: list[str]) -> None:
    """`ablate ls [DIR] [--status S] [--method M] [--tag T]... [--json]`."""
    parser = argparse.ArgumentParser(prog="ablate ls", description="list runs and sweep jobs, newest first")
    parser.add_argument("dir", nargs="?", type=Path, default=Path("outputs"), help="where to look (default: outputs/)")
    parser.add_argument("--status", choices=STATUSES, help="only runs with this status")
    parser.add_argument("--method", help="only runs of this method (dpo, sft, grpo, ...)")
    parser.add_argument("--tag", action="append", default=[], help="only runs tagged so (repeat: all of them)")
    parser.add_argument("--json", action="store_true", help="one JSON list of runs, for scripts")
    args = parser.parse_args(argv)
    if not args.dir.is_dir():
        print(f"ablate: error: no directory {args.dir} (run `ablate train` first, or give the outputs dir)",
              file=sys.stderr)
        sys.exit(2)
    root = args.dir.resolve()
    rows = list_runs(root, args.status, args.method, args.tag)
    if args.json:
        print(json.dumps([{**r, "path": str(root / r["path"])} for r in rows], indent=2))
        return
    if not rows:
        print(f"no runs under {args.dir}" + (" matching the filters" if args.status or args.method or args.tag else ""))
        return
    print("\n".join(format_rows(rows)))
    print(f"{len(rows)} run(s) under {root}")
