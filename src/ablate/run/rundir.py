"""The run directory contract, shared by training, resume, `ablate compare` and W&B.

    <run_dir>/
      .hydra/            Hydra's composed config, hydra config and overrides (written by ablate.run.lifecycle)
      run.json           identity of the run: overrides, start time, versions, git sha, W&B run id, data fingerprint
      metrics.jsonl      one JSON object per log event: {"step", "time", <metric names>...}
      summary.json       written at the end (also on failure): status, error, metrics, global_step, ...
      eval.json          `ablate eval`'s metrics (its latest eval)
      eval_examples.jsonl  `ablate eval`'s per-example scores: {"id", <metric>: score...} per example
      checkpoints/       Trainer checkpoints (checkpoint-<step>/, each sealed by manifest.json), for resume;
                         skipped/: the ones a resume passed over (incomplete or damaged)
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

from ablate.errors import RunDirError, chain

SUMMARY, RUN, METRICS, CHECKPOINTS, MODEL = "summary.json", "run.json", "metrics.jsonl", "checkpoints", "model"
LOCK, HYDRA = ".lock", ".hydra"
EXAMPLES = "eval_examples.jsonl"  # per-example eval scores, paired across arms by `ablate compare` (Miller 2024)
# what Hydra and the lock write into the run dir before ablate's code runs: a dir holding only these is "empty"
HYDRA_FILES = {HYDRA, "ablate.log", LOCK}


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

    write_text(path, json.dumps(mask(data), indent=2, default=str) + "\n")  # secrets: ablate.run.secrets


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
        raise RunDirError(f"{what} {run_dir} is in use by {holder}; wait for it to end, or {advice}") from None
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


def write_examples(run_dir: Path, rows: list[dict[str, Any]]) -> Path:
    """`eval_examples.jsonl`, one JSON object per example, written atomically by the main process."""
    path = run_dir / EXAMPLES
    if is_main_process():
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
        os.replace(tmp, path)
    return path


def read_examples(run_dir: Path) -> dict[str, dict[str, float]]:
    """`{example id: {metric: score}}` from `eval_examples.jsonl`; {} when absent. Lines that are not
    an object with an `id` are skipped, and so are non-numeric fields (true/false count as 1/0)."""
    out: dict[str, dict[str, float]] = {}
    path = run_dir / EXAMPLES
    if not path.is_file():
        return out
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and "id" in row:
            out[str(row["id"])] = {k: float(v) for k, v in row.items()
                                   if isinstance(v, (int, float)) and k not in ("id", "index")}
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


MANIFEST = "manifest.json"  # in each checkpoint, written last: every file with its size and sha256


def write_manifest(ckpt: Path) -> None:
    """Seal `ckpt`: `manifest.json` lists every file in it (Trainer's, the method's own, such as GRPO's
    generation buffer, whatever a trainer adds) with its size and sha256. Written last and atomically,
    once every file is in: a checkpoint is complete exactly when its manifest is there and matches."""
    files = {str(p.relative_to(ckpt)): {"size": p.stat().st_size, "sha256": _sha256(p)}
             for p in sorted(ckpt.rglob("*")) if p.is_file() and p.name != MANIFEST and not p.name.endswith(".tmp")}
    write_text(ckpt / MANIFEST, json.dumps({"files": files}, indent=1) + "\n")


def _sha256(path: Path) -> str:
    import hashlib

    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def checkpoint_problem(ckpt: Path) -> str | None:
    """Why `ckpt` cannot be resumed from, or None when it is complete: with a manifest (see
    `write_manifest`), every file it lists must be there with its size and sha256 (a file cut short,
    emptied, deleted or damaged is named); a checkpoint without one (saved by an older ablate, or cut
    short before its manifest) must at least have a readable trainer_state.json, which Trainer writes
    after its other files, and complete safetensors files."""
    manifest = ckpt / MANIFEST
    if manifest.exists():
        listed = (read_json(manifest) or {}).get("files")
        if not isinstance(listed, dict) or not listed:
            return f"{MANIFEST} is unreadable"
        for name, want in listed.items():
            path = ckpt / name
            if not path.is_file():
                return f"{name} is missing"
            size = path.stat().st_size
            if size != want.get("size"):
                return f"{name} is {'truncated' if size < want.get('size', 0) else 'changed'} ({size} of {want.get('size')} bytes)"
            if _sha256(path) != want.get("sha256"):
                return f"{name} is damaged (its sha256 differs from {MANIFEST}'s)"
        return None
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
    described in `skipped`. One sealed by a manifest wins over newer unsealed ones (a save cut short
    after Trainer's files, before the manifest); an unsealed one is used only when no sealed one is
    left (Trainer may have rotated the older ones away already), or from an older ablate."""
    seen: list[tuple[Path, str | None]] = []  # newest first, up to the first sealed complete one
    for _, p in checkpoints(run_dir):
        problem = checkpoint_problem(p)
        sealed = (p / MANIFEST).is_file()
        seen.append((p, problem if problem or sealed else f"no {MANIFEST} (save interrupted)"))
        if problem is None and sealed:
            break
    usable = [p for p, problem in seen if problem is None]
    usable += [p for p, problem in seen if problem == f"no {MANIFEST} (save interrupted)"]
    chosen = usable[0] if usable else None
    if skipped is not None:
        skipped += [f"{p.name}: {problem}" for p, problem in seen if p != chosen
                    and (chosen is None or checkpoint_step(p) > checkpoint_step(chosen))]
    return chosen


def set_aside(ckpt: Path) -> Path:
    """Move a checkpoint a resume passed over into `checkpoints/skipped/` (nothing is deleted): left in
    place, the save of the same step would mix its new files with the old ones. Returns where it is."""
    aside = ckpt.parent / "skipped" / ckpt.name
    n = 1
    while aside.exists():
        n += 1
        aside = ckpt.parent / "skipped" / f"{ckpt.name}.{n}"
    if is_main_process() and ckpt.is_dir():
        aside.parent.mkdir(exist_ok=True)
        os.replace(ckpt, aside)
    return aside


def checkpoint_step(ckpt: Path) -> int:
    return int(ckpt.name.split("-")[-1])


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
