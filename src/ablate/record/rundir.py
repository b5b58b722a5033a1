"""The run directory contract, shared by training, resume, `ablate compare` and W&B.

    <run_dir>/
      .hydra/            Hydra's composed config, hydra config, overrides (written by ablate.record.lifecycle)
      run.json           identity: overrides, start time, versions, git sha, W&B run id, data fingerprint
      metrics.jsonl      one JSON object per log event: {"step", "time", <metric names>...}
      summary.json       written at the end (also on failure): status, error, metrics, global_step, ...
      eval.json          `ablate eval`'s metrics (its latest eval)
      eval_examples.jsonl  `ablate eval`'s per-example scores: {"id", <metric>: score...} per example
      checkpoints/       Trainer checkpoints (checkpoint-<step>/, each sealed by manifest.json), for resume;
                         skipped/: the ones a resume passed over (incomplete or damaged)
      model/             final model + tokenizer (safetensors), loadable with from_pretrained
      wandb/             offline W&B files when logger=wandb
      .lock              held (flock) by the process training in the dir: one run per dir at a time

A dir is used only when it is empty (an ablate.log and ablate's .lock aside: a launch refused or killed
before it wrote run.json) or holds an ablate run (a readable run.json, ablate's marker); a completed run
is never trained further. A `.hydra/` is never taken for ablate's: Hydra writes none here (ablate writes
it after run.json), so one without run.json is another application's.

This module imports neither torch nor transformers: `ablate compare` uses it on a laptop.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import platform
import re
import socket
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from ablate.errors import RunDirError, chain

SUMMARY, RUN, METRICS, CHECKPOINTS, MODEL = (
    "summary.json",
    "run.json",
    "metrics.jsonl",
    "checkpoints",
    "model",
)
LOCK, HYDRA = ".lock", ".hydra"
EXAMPLES = (
    "eval_examples.jsonl"  # per-example eval scores, paired across arms by `ablate compare` (Miller 2024)
)
EVAL = "eval.json"  # `ablate eval`'s held-out metrics, which `ablate compare` prefers to the training ones
# what Hydra's log and the lock write into the run dir before run.json: a dir holding only these is "empty"
HYDRA_FILES = {"ablate.log", LOCK}


def is_main_process() -> bool:
    """Rank 0, or not distributed. torchrun and SLURM (via submitit's export) set RANK before any
    torch.distributed init, so this works before the trainer exists."""
    return int(os.environ.get("RANK", "0")) == 0


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write atomically (tmp file + rename) so a reader never sees half a file. Only the main
    process writes: one run dir per job, not per rank."""
    if not is_main_process():
        return
    from ablate.record.secrets import mask

    write_text(path, json.dumps(mask(data), indent=2, default=str) + "\n")  # secrets: ablate.record.secrets


def write_text(path: Path, text: str) -> None:
    """Replace `path` by `text` atomically (tmp file + rename); the tmp file never outlives a failed
    write. On a full disk (no room for the tmp file) a file already there is overwritten in place when
    `text` fits in the blocks it holds (a summary rewritten as `failed`); else the error is raised and
    the file kept as it was."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        data = text.encode()
        if not (disk_full(e) and path.is_file() and len(data) <= path.stat().st_blocks * 512):
            raise
        with path.open("r+b") as f:  # writes into blocks the file already has: no new space needed
            f.write(data)
            f.truncate(len(data))


def mount_of(path: Path) -> str:
    """The mount point holding `path`, with its device and filesystem type when /proc/mounts says."""
    mount = path.resolve()
    while not os.path.ismount(mount):
        mount = mount.parent
    device = ""
    try:
        with open("/proc/mounts") as f:
            for line in f:  # the last mount on a mount point is the visible one
                dev, where, fstype = line.split()[:3]
                if where.replace("\\040", " ") == str(mount):
                    device = f" ({dev}, {fstype})" if dev != fstype else f" ({fstype})"
    except (OSError, ValueError):
        pass
    return f"{mount}{device}"


def disk_full(e: BaseException | None) -> bool:
    """Whether `e` (or an error it was raised from) is a full disk or an exceeded quota. torch and
    safetensors report a failed write in their own words: those are matched by their text."""
    import errno

    for c in chain(e):
        if isinstance(c, OSError) and c.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if "No space left on device" in str(c) or "Disk quota exceeded" in str(c):
            return True
    return False


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


def check_readable(path: Path) -> None:
    """RunDirError when `path` (a run or sweep dir given on the command line) exists but cannot be read."""
    if path.exists() and not os.access(path, os.R_OK | os.X_OK if path.is_dir() else os.R_OK):
        raise RunDirError(f"{path}: permission denied (cannot read it); check its permissions: ls -ld {path}")


def check_given(path: Path, run: bool = True) -> None:
    """A run dir named on the command line (`ablate eval`, `generate`): RunDirError at once, before any
    heavy import, when it does not exist, is not a directory, or (`run`) holds no run.json."""
    check_readable(path)
    if not path.exists():
        raise RunDirError(f"{path} does not exist (`ablate ls` lists your runs, newest first)")
    if not path.is_dir():
        raise RunDirError(f"{path} is a file, not a run dir (`ablate ls` lists your runs)")
    if run and not (path / RUN).is_file():
        raise RunDirError(f"{path} is not an ablate run dir (no {RUN}; `ablate ls` lists your runs)")


OUTPUTS = Path("outputs")  # where `last` looks: the default hydra.run.dir and hydra.sweep.dir's root
LAST = "last"  # a run dir argument naming the newest run under OUTPUTS (`ablate eval last`)


def run_json_problem(run_dir: Path) -> str | None:
    """Why `run_dir`'s run.json cannot name a run (`last` skips the dir, `ablate ls` lists it `unreadable`
    saying so), or None when it is a JSON object."""
    path = run_dir / RUN
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        return f"no {RUN} (ablate writes it first: removed since?)"
    except OSError as e:
        return f"{RUN} cannot be read ({e.strerror})"
    try:
        data = json.loads(text)
    except ValueError:  # UnicodeDecodeError too
        return f"its {RUN} is not JSON ({len(text)} bytes: cut short?)"
    return None if isinstance(data, dict) else f"its {RUN} is a JSON {type(data).__name__}, not an object"


def newest_run(root: Path = OUTPUTS) -> tuple[Path | None, list[tuple[Path, str]]]:
    """The newest ablate run under `root` (a dir holding run.json, ablate's marker; runs and sweep jobs
    alike): by run.json's `started`, then by path (a day's runs are named by their time, a launch's jobs by
    number); and the dirs newer than it (by their modification time) that look like runs but cannot be one
    (a summary.json without run.json, a run.json that is not JSON: `run_json_problem`), each with why. Dirs
    below a run and hidden ones (.replaced/, .submitit/) are not searched."""
    best: tuple[str, str] | None = None
    broken: list[tuple[str, Path, str]] = []
    for here, dirs, files in os.walk(root):
        if RUN in files or SUMMARY in files:
            dirs[:] = []  # a run holds no run below it (checkpoints/, model/)
            info = read_json(Path(here) / RUN)
            if info is not None:
                best = max(best or ("", ""), (str(info.get("started", "")), here))
            else:  # dated as `ablate ls` dates it: by its last write
                when = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(os.stat(here).st_mtime))
                broken.append((when, Path(here), run_json_problem(Path(here)) or f"{RUN} is unreadable"))
            continue
        dirs[:] = [d for d in dirs if not d.startswith(".")]
    newer = sorted((b for b in broken if best is None or b[0] > best[0]), key=lambda b: b[0], reverse=True)
    return (None if best is None else Path(best[1])), [(path, why) for _, path, why in newer]


def given_run(path: Path) -> Path:
    """A run dir named on the command line: `last` (unless a file or dir of that name is here) is the newest
    run under outputs/ (`newest_run`), said on stderr with the newer dirs it skipped and why; RunDirError in
    one line when there is none."""
    if str(path) != LAST or path.exists():
        return path
    found, skipped = newest_run()
    if found is None:
        why = f" ({skipped[0][0]} skipped: {skipped[0][1]})" if skipped else ""
        raise RunDirError(
            f"`last` is the newest ablate run under {OUTPUTS}/ and there is none here (no {RUN} "
            f"under {OUTPUTS.resolve()}){why}; run `ablate train` first, or give a run dir"
        )
    n = len(skipped)
    some = "a newer dir," if n == 1 else f"{n} newer dirs (`ablate ls` says why), the newest"
    said = f" (skipped {some} {skipped[0][0]}: {skipped[0][1]})" if skipped else ""
    if is_main_process():  # torchrun's ranks each resolve it: said once
        print(f"last: {found}{said}", file=sys.stderr)
    return found


def is_usable(run_dir: Path) -> None:
    """Raise RunDirError unless `run_dir` is empty (Hydra's own files aside) or an ablate run dir."""
    if not run_dir.exists():
        return
    if not run_dir.is_dir():
        raise RunDirError(f"run dir {run_dir} is a file, not a directory")
    if read_json_checked(run_dir / RUN) is not None:
        return
    foreign = sorted(p.name for p in run_dir.iterdir() if p.name not in HYDRA_FILES or not _ours(p))
    if foreign:
        shown = ", ".join(foreign[:3]) + (", ..." if len(foreign) > 3 else "")
        raise RunDirError(
            f"run dir {run_dir} is not empty and holds no ablate run ({RUN} missing; found {shown}); "
            "use an empty or new hydra.run.dir"
        )


def _ours(path: Path) -> bool:
    """An ablate.log, or a .lock holding nothing or `lock`'s line (another program's lock is not ours)."""
    if path.name != LOCK:
        return path.is_file()
    try:
        text = path.read_text(errors="replace")[:200]
    except OSError:
        return False
    return not text.strip() or bool(re.fullmatch(r"PID \d+ on host \S*\n?", text))


_held: dict[Path, int] = {}  # lock fds, kept open (and so held) until the process exits


def _forget_locks_in_child() -> None:
    """A forked child (async GRPO's generation worker, a dataloader worker) closes its copies of the lock
    fds: a flock lives while any fd of it is open, so a child still dying after its trainer was killed
    -9 would otherwise hold the run dir against the resume that follows. Closing (not LOCK_UN, which
    would unlock the parent's too) leaves the parent's lock held."""
    for fd in _held.values():
        try:
            os.close(fd)
        except OSError:
            pass
    _held.clear()


os.register_at_fork(after_in_child=_forget_locks_in_child)


def lock(run_dir: Path, what: str = "run dir", advice: str = "use another hydra.run.dir") -> None:
    """Hold an exclusive flock on `<run_dir>/.lock` for the rest of this process's life, so two
    processes never train in one dir (or launch into one sweep dir). Only the main process locks
    (other ranks share its dir). The kernel drops the lock when the process dies, kill -9 included:
    a stale lock file never blocks."""
    run_dir = run_dir.resolve()
    if not is_main_process() or run_dir in _held:
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(run_dir / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(fd)
        os.close(fd)
        raise RunDirError(
            f"{what} {run_dir} is in use by {holder}; wait for it to end, or {advice}"
        ) from None
    os.ftruncate(fd, 0)
    os.write(fd, f"PID {os.getpid()} on host {socket.gethostname()}\n".encode())
    _held[run_dir] = fd


def _holder(fd: int) -> str:
    """The holder's line in a lock file; a holder that has just taken the lock writes it a moment later."""
    import time

    for _ in range(40):
        line = os.pread(fd, 200, 0).decode(errors="replace").strip()
        if line:
            return line
        time.sleep(0.05)
    return "another process"


def claim_new_dir(path: Path) -> Path:
    """Create `path` as a new directory owned by this process: if it exists (a launch of the same
    second, a dir left by an earlier one), `path_2`, `path_3`, ... instead. Returns the dir created.
    mkdir is atomic: two processes never get the same dir, whatever their timing."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for n in range(1, 10_000):
        candidate = path if n == 1 else path.with_name(f"{path.name}_{n}")
        try:
            candidate.mkdir()
        except FileExistsError:
            continue
        return candidate
    raise RunDirError(f"{path}: 10000 dirs of that name exist already; choose another hydra.sweep.dir")


def completed_summary(run_dir: Path) -> dict[str, Any] | None:
    """The summary of a run that completed (it never changes again), else None."""
    summary = read_json(run_dir / SUMMARY)
    return summary if summary and summary.get("status") == "completed" else None


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
    if info.get("host") == socket.gethostname() and isinstance(info.get("pid"), int):
        import psutil  # ~0.1 s to import: only for run dirs without a lock file

        return status if psutil.pid_exists(info["pid"]) else "interrupted"
    return status


def _json_lines(path: Path) -> list[Any]:
    """Each line of a JSON-lines file that parses (a half-written last line of a running writer does not)."""
    out = []
    for line in path.read_text().splitlines() if path.is_file() else []:
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """All log events of a run; a half-written last line (run still going) is skipped."""
    return _json_lines(run_dir / METRICS)


def write_examples(run_dir: Path, rows: list[dict[str, Any]]) -> Path:
    """`eval_examples.jsonl`, one JSON object per example, written atomically by the main process."""
    path = run_dir / EXAMPLES
    if is_main_process():
        write_text(path, "".join(json.dumps(r) + "\n" for r in rows))
    return path


def example_rows(run_dir: Path) -> list[dict[str, Any]]:
    """`eval_examples.jsonl`'s rows as written (text fields too); lines that are not an object with an `id`
    are skipped; [] when absent."""
    return [r for r in _json_lines(run_dir / EXAMPLES) if isinstance(r, dict) and "id" in r]


def read_examples(run_dir: Path) -> dict[str, dict[str, float]]:
    """`{example id: {metric: score}}` from `eval_examples.jsonl`; {} when absent. Non-numeric fields are
    skipped (true/false count as 1/0)."""
    return {
        str(row["id"]): {
            k: float(v) for k, v in row.items() if isinstance(v, (int, float)) and k not in ("id", "index")
        }
        for row in example_rows(run_dir)
    }


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
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5
        )
        if sha.returncode != 0:
            return None
        dirty = subprocess.run(
            ["git", "status", "--porcelain"], cwd=here, capture_output=True, text=True, timeout=5
        )
        return sha.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.TimeoutExpired):
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
        write_text(path, "".join(k + "\n" for k in keep))


def check_shared_run_dir(run_dir: Path) -> None:
    """Every rank of the job names the same run dir, and sees the run.json rank 0 just wrote in it:
    checkpoints hold a file per rank, and a resume reads them all. Two nodes that each took their
    own default dir (relative to their working dir, named by their own launch time), or a dir on a
    filesystem only one node sees, would train on but leave a run that cannot resume."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    dirs: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(dirs, str(run_dir.resolve()))  # after rank 0's run.json: a barrier too
    if len(set(dirs)) > 1 or not (run_dir / RUN).is_file():
        from ablate.errors import ConfigError

        what = (
            f"the ranks name different run dirs ({', '.join(sorted(set(dirs)))})"
            if len(set(dirs)) > 1
            else f"rank {dist.get_rank()} does not see rank 0's files in {run_dir}"
        )
        raise ConfigError(
            f"{what}: give every node the same hydra.run.dir, on a filesystem all nodes share "
            "(docs/distributed.md: several nodes)"
        )


def stop_logging_into(run_dir: Path) -> None:
    """Remove the log file handlers writing into `run_dir` (Hydra's ablate.log, opened at its first line)."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        if (
            isinstance(handler, logging.FileHandler)
            and Path(handler.baseFilename).parent == run_dir.resolve()
        ):
            root.removeHandler(handler)
            handler.close()
