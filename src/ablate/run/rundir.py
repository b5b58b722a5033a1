"""The run directory contract, shared by training, resume, `ablate compare` and W&B.

    <run_dir>/
      .hydra/            Hydra's composed config, hydra config and overrides
      run.json           identity of the run: overrides, start time, versions, git sha, W&B run id
      metrics.jsonl      one JSON object per log event: {"step", "time", <metric names>...}
      summary.json       written at the end (also on failure): status, error, metrics, global_step, ...
      checkpoints/       Trainer checkpoints (checkpoint-<step>/), for resume
      model/             final model + tokenizer (safetensors), loadable with from_pretrained
      wandb/             offline W&B files when logger=wandb
      .lock              held (flock) by the process training in the dir: one run per dir at a time

A dir is used only when it is empty (Hydra's own .hydra/ and ablate.log aside) or holds an ablate
run (a readable run.json); a completed run is never trained further.

This module imports neither torch nor transformers: `ablate compare` uses it on a laptop.
"""

from __future__ import annotations

import fcntl
import json
import os
import platform
import re
import socket
import struct
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

from ablate.errors import RunDirError

SUMMARY, RUN, METRICS, CHECKPOINTS, MODEL = "summary.json", "run.json", "metrics.jsonl", "checkpoints", "model"
LOCK = ".lock"
# what Hydra writes into the run dir before ablate's code runs: a dir holding only these is "empty"
HYDRA_FILES = {".hydra", "ablate.log", LOCK}


def is_main_process() -> bool:
    """Rank 0, or not distributed. torchrun and SLURM (via submitit's export) set RANK before any
    torch.distributed init, so this works before the trainer exists."""
    return int(os.environ.get("RANK", "0")) == 0


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write atomically (tmp file + rename) so a reader never sees half a file. Only the main
    process writes: one run dir per job, not per rank."""
    if not is_main_process():
        return
    from ablate.run.secrets import mask

    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(mask(data), indent=2, default=str) + "\n")  # secrets: ablate.run.secrets
    os.replace(tmp, path)


def read_json(path: Path) -> dict[str, Any] | None:
    """The JSON object in `path`; None when it is missing *or* unreadable (see `read_json_checked`)."""
    try:
        data = json.loads(path.read_text())
    except (FileNotFoundError, NotADirectoryError, json.JSONDecodeError, UnicodeDecodeError):
        return None
    return data if isinstance(data, dict) else None


def read_json_checked(path: Path) -> dict[str, Any] | None:
    """Like `read_json`, but a file that exists and is not a JSON object raises RunDirError: a corrupt
    run.json must never pass for a missing one (the dir would be taken over as a fresh run)."""
    if not path.exists():
        return None
    data = read_json(path)
    if data is None:
        raise RunDirError(f"{path} is corrupt (not a JSON object); fix or remove it, or use another run dir")
    return data


def is_usable(run_dir: Path) -> None:
    """Raise RunDirError unless `run_dir` is empty (Hydra's own files aside) or an ablate run dir."""
    if not run_dir.exists():
        return
    if not run_dir.is_dir():
        raise RunDirError(f"run dir {run_dir} is a file, not a directory")
    if read_json_checked(run_dir / RUN) is not None:
        return
    foreign = sorted(p.name for p in run_dir.iterdir() if p.name not in HYDRA_FILES)
    if foreign:
        shown = ", ".join(foreign[:3]) + (", ..." if len(foreign) > 3 else "")
        raise RunDirError(f"run dir {run_dir} is not empty and holds no ablate run ({RUN} missing; found {shown}); "
                          "use an empty or new hydra.run.dir")


def check_unlocked(run_dir: Path) -> None:
    """Raise RunDirError when a live process holds `<run_dir>/.lock` (see `lock`). Only probes: an
    absent lock file is not created, and a free lock is let go at once. Run before Hydra writes
    `.hydra/` and ablate.log, so a dir in use is not touched; `lock` still guards the race after.
    Only the main process probes: other ranks share the dir their rank 0 may already hold."""
    if not is_main_process():
        return
    try:
        fd = os.open(run_dir / LOCK, os.O_RDONLY)
    except OSError:  # no lock file (or the dir): nobody holds it
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 200).decode(errors="replace").strip() or "another process"
        raise RunDirError(f"run dir {run_dir.resolve()} is in use by {holder}; wait for it to end, or use another "
                          "hydra.run.dir") from None
    finally:
        os.close(fd)  # closing drops a lock taken by the probe


_held: dict[Path, int] = {}  # lock fds, kept open (and so held) until the process exits


def lock(run_dir: Path) -> None:
    """Hold an exclusive flock on `<run_dir>/.lock` for the rest of this process's life, so two
    processes never train in one dir. Only the main process locks (other ranks share its dir). The
    kernel drops the lock when the process dies, kill -9 included: a stale lock file never blocks."""
    run_dir = run_dir.resolve()
    if not is_main_process() or run_dir in _held:
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(run_dir / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 200).decode(errors="replace").strip() or "another process"
        os.close(fd)
        raise RunDirError(f"run dir {run_dir} is in use by {holder}; wait for it to end, or use another "
                          "hydra.run.dir") from None
    os.ftruncate(fd, 0)
    os.write(fd, f"PID {os.getpid()} on host {socket.gethostname()}\n".encode())
    _held[run_dir] = fd


def lock_held(run_dir: Path) -> bool | None:
    """Whether a live process holds `<run_dir>/.lock` (see `lock`): True or False, None when the dir
    has no lock file (a run from before the lock, or a job not started). Probes with a shared lock,
    let go at once: it never blocks the training process, and two probes never block each other."""
    try:
        fd = os.open(run_dir / LOCK, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:  # a filesystem without flock: cannot tell
        return None
    finally:
        os.close(fd)  # closing drops a lock taken by the probe
    return False


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: it exists
        return True
    return True


def state(run_dir: Path, summary: dict[str, Any] | None = None, info: dict[str, Any] | None = None) -> str:
    """A run's state, the one answer `ablate ls` and `ablate status` both give: summary.json's status,
    refined by who is still alive. A `running` summary whose process is gone (kill -9, OOM killer, a
    reboot) and a Ctrl-C'd run are `interrupted` (`ablate resume` continues either).

    The lock tells: the kernel drops it when its process dies, kill -9 included. A lock held means
    running; a lock let go means dead, where this host can see the holder: the run's host (run.json),
    or any host when run.json names none. On another host a free lock proves nothing (flock on some
    network filesystems is local to a node), so the run stays `running` there (`ablate status` then
    asks SLURM). Run dirs without a lock file fall back to run.json's pid on this host."""
    summary = read_json(run_dir / SUMMARY) if summary is None else summary
    status = str((summary or {}).get("status", "running"))
    if status == "failed" and str((summary or {}).get("error", "")).startswith("KeyboardInterrupt"):
        return "interrupted"
    if status != "running":
        return status
    info = read_json(run_dir / RUN) if info is None else info
    info = info or {}
    here = info.get("host") in (None, socket.gethostname())
    held = lock_held(run_dir)
    if held is not None:
        return "running" if held or not here else "interrupted"
    if info.get("host") == socket.gethostname() and isinstance(info.get("pid"), int) and not _pid_alive(info["pid"]):
        return "interrupted"
    return status


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """All log events of a run; a half-written last line (run still going) is skipped."""
    out = []
    path = run_dir / METRICS
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return out


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for pkg in ("ablate", "torch", "transformers", "datasets", "accelerate", "hydra-core"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            pass
    return out


def git_sha() -> str | None:
    """The sha of the ablate checkout, when it is one (with `-dirty` if it has local changes)."""
    here = Path(__file__).resolve().parent
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5)
        if sha.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=here, capture_output=True, text=True, timeout=5)
        return sha.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.TimeoutExpired):
        return None


def checkpoint_problem(ckpt: Path) -> str | None:
    """Why `ckpt` cannot be resumed from, or None when it is complete. Trainer writes
    trainer_state.json last, so a checkpoint interrupted mid-save has none; a truncated
    trainer_state.json or safetensors file (disk full, a copy cut short) is caught here too."""
    state = ckpt / "trainer_state.json"
    if not state.is_file():
        return "no trainer_state.json (save interrupted)"
    if read_json(state) is None:
        return "trainer_state.json is unreadable"
    for weights in ckpt.glob("*.safetensors"):
        if not _safetensors_complete(weights):
            return f"{weights.name} is truncated"
    return None


def _safetensors_complete(path: Path) -> bool:
    """A safetensors file is an 8-byte header length, a JSON header, then the tensors' bytes; it is
    complete when it is as long as its header says."""
    try:
        with path.open("rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
        end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
        return path.stat().st_size == 8 + n + end
    except (OSError, struct.error, ValueError, KeyError, TypeError, IndexError):
        return False


def checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
    """`(step, path)` of every checkpoint dir, newest first."""
    out = []
    for p in (run_dir / CHECKPOINTS).glob("checkpoint-*"):
        m = re.fullmatch(r"checkpoint-(\d+)", p.name)
        if m and p.is_dir():
            out.append((int(m.group(1)), p))
    return sorted(out, reverse=True)


def latest_checkpoint(run_dir: Path, skipped: list[str] | None = None) -> Path | None:
    """The newest *complete* checkpoint (see `checkpoint_problem`); each newer one passed over is
    described in `skipped`."""
    for _, p in checkpoints(run_dir):
        problem = checkpoint_problem(p)
        if problem is None:
            return p
        if skipped is not None:
            skipped.append(f"{p.name}: {problem}")
    return None


def fix_permissions(path: Path) -> None:
    """Files under `path` get the mode the umask gives any new file (safetensors writes 0600)."""
    umask = os.umask(0)
    os.umask(umask)
    for f in [path, *path.rglob("*")] if path.exists() else []:
        os.chmod(f, (0o777 if f.is_dir() else 0o666) & ~umask)


def truncate_metrics(run_dir: Path, after_step: int) -> None:
    """On resume, drop log events past the checkpoint (all of them without one): those steps run
    again and log again."""
    path = run_dir / METRICS
    if path.is_file() and is_main_process():
        keep = [json.dumps(e) for e in read_metrics(run_dir) if e.get("step", 0) <= after_step]
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text("".join(k + "\n" for k in keep))
        os.replace(tmp, path)
