"""Which checkpoint a resume may use. Each is sealed by `manifest.json`, written last: every file with
its size and sha256; a checkpoint is complete exactly when its manifest is there and matches. And what
a stopped run tells the user about them: the one line Ctrl-C (or SIGTERM) prints below the bar, which
earlier run of the same command has a checkpoint to continue, a rank that lost its peers with where
the run resumes, a write that failed (disk full, the file-size limit, the run dir deleted) as one line.
No torch import."""

from __future__ import annotations

import json
import logging
import os
import re
import struct
from pathlib import Path
from typing import Any

from ablate.errors import DiskFullError, PeerLostError, RunDirError, chain
from ablate.record import rundir, secrets
from ablate.record.rundir import CHECKPOINTS, is_main_process, read_json, write_text

MANIFEST = "manifest.json"  # in each checkpoint, written last: every file with its size and sha256


def write_manifest(ckpt: Path) -> None:
    """Seal `ckpt`: `manifest.json` lists every file in it (Trainer's, the method's own, such as GRPO's
    generation buffer, whatever a trainer adds) with its size and sha256. Written last and atomically,
    once every file is in: a checkpoint is complete exactly when its manifest is there and matches."""
    files = {
        str(p.relative_to(ckpt)): {"size": p.stat().st_size, "sha256": _sha256(p)}
        for p in sorted(ckpt.rglob("*"))
        if p.is_file() and p.name != MANIFEST and not p.name.endswith(".tmp")
    }
    write_text(ckpt / MANIFEST, json.dumps({"files": files}, indent=1) + "\n")


def _sha256(path: Path) -> str:
    import hashlib

    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


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
                how = "truncated" if size < want.get("size", 0) else "changed"
                return f"{name} is {how} ({size} of {want.get('size')} bytes)"
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
        skipped += [
            f"{p.name}: {problem}"
            for p, problem in seen
            if p != chosen and (chosen is None or checkpoint_step(p) > checkpoint_step(chosen))
        ]
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


log = logging.getLogger("ablate")


def interrupted_line(hc: Any, why: str) -> str:
    """What Ctrl-C (or SIGTERM) leaves, in one line: for a single run, the step reached and how to go on."""
    run_dir = Path(hc.runtime.output_dir)
    from hydra.types import RunMode

    if hc.mode != RunMode.RUN or not rundir.is_main_process() or not (run_dir / rundir.RUN).is_file():
        return f"ablate: interrupted ({why})"
    events = rundir.read_metrics(run_dir) if (run_dir / rundir.METRICS).is_file() else []
    ckpt = latest_checkpoint(run_dir)
    where = f" at step {events[-1]['step']}" if events else ""
    start = f"from {ckpt.name}" if ckpt is not None else "from step 0 (no checkpoint was saved yet)"
    return f"ablate: interrupted ({why}){where}; `ablate resume {run_dir}` continues it {start}"


def earlier_unfinished(run_dir: Path, overrides: list[str], newest: int = 200) -> tuple[Path, str] | None:
    """A run of the same command (the same overrides) beside a new default-named run dir
    (outputs/runs/<date>/<time>_...), interrupted or failed with a checkpoint to continue from: the
    newest such dir and its state, else None. Rerunning a command names a new dir, so the rerun does
    not continue it; the run says so, and how (`ablate resume`). The newest `newest` dirs are read."""
    root = run_dir.parent.parent
    siblings = sorted(
        (p for p in root.glob("*/*") if p.is_dir() and p != run_dir), key=lambda p: (p.parent.name, p.name)
    )
    for other in reversed(siblings[-newest:]):
        info = rundir.read_json(other / rundir.RUN)
        if not info or sorted(info.get("overrides", [])) != sorted(secrets.mask(overrides)):
            continue
        state = rundir.state(other)
        if state in ("interrupted", "failed", "preempted") and latest_checkpoint(other) is not None:
            return other, state
    return None


def warn_if_rerun(run_dir: Path, overrides: list[str], hc: Any) -> None:
    """A single run in a new default dir whose command (the same overrides) ran before and stopped
    with a checkpoint: say that this run starts from step 0, and how to continue that one instead."""
    if not rundir.is_main_process() or _given_run_dir(hc) or checkpoints(run_dir):
        return
    earlier = earlier_unfinished(run_dir, overrides)
    if earlier is not None:
        log.warning(
            "the same command's run in %s is %s with a checkpoint; this is a new run from step 0 "
            "(to continue that one instead: ablate resume %s)",
            earlier[0],
            earlier[1],
            earlier[0],
        )


def _given_run_dir(hc: Any) -> bool:
    """Whether the command line chose the run dir (hydra.run.dir=...): then a rerun resumes it."""
    return any(str(o).lstrip("+").startswith("hydra.run.dir=") for o in hc.overrides.hydra)


# what gloo says when a peer process died (its TCP connections reset) or hung past distributed.ddp_timeout
PEER_LOST = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "Timed out waiting")


def peer_lost(run_dir: Path, e: BaseException) -> PeerLostError | None:
    """`e` as one line when a collective failed because another rank of the job died or hung (a node
    crashed, was killed or partitioned), with the checkpoint to resume from; else None."""
    if int(os.environ.get("WORLD_SIZE", "1")) < 2:
        return None
    cause = next(
        (c for c in chain(e) if isinstance(c, RuntimeError) and any(m in str(c) for m in PEER_LOST)), None
    )
    if cause is None:
        return None
    what = next(m for m in PEER_LOST if m in str(cause))
    sealed = [p for _, p in checkpoints(run_dir) if (p / MANIFEST).exists()]  # newest first
    where = f"from {sealed[0].name}" if sealed else "from the start (no checkpoint yet)"
    return PeerLostError(
        f"rank {os.environ.get('RANK', '?')} lost another rank of this job ({what.lower()}: it died, "
        f"or hung past distributed.ddp_timeout); the run resumes {where}: start the same command "
        "again on every node"
    )


def disk_full(run_dir: Path, resumed_from: int, e: BaseException) -> DiskFullError | None:
    """`e` as one line naming the disk and the dir when it is a write that found the run dir's disk
    full (or over quota: torch and safetensors report it in words of their own, so a disk left with
    under 1 MiB free counts too), else None. The checkpoint being written (unsealed, newer than the
    resume point) is removed: it could never be resumed from, and its space lets the record be written."""
    import shutil

    if not isinstance(e, Exception):  # Ctrl-C, SIGTERM, a SLURM preemption
        return None
    too_large = _file_too_large(e)
    try:
        full = too_large or rundir.disk_full(e) or shutil.disk_usage(run_dir).free < 1 << 20
    except OSError:
        return None
    if not full:
        return None
    logging.raiseExceptions = False  # a log line finding no room is dropped, not a traceback on stderr
    partial = [p for step, p in checkpoints(run_dir) if step > resumed_from and not (p / MANIFEST).exists()]
    for p in partial if is_main_process() else []:
        shutil.rmtree(p, ignore_errors=True)
    writing = f"{partial[0]} (removed: incomplete)" if partial else str(run_dir)
    if too_large:
        import resource

        limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
        shown = f"{limit} bytes" if limit != resource.RLIM_INFINITY else "its size"
        return DiskFullError(
            f"file-size limit: a file passed this process's limit of {shown} per file (ulimit -f) "
            f"while writing {writing}; raise it (ulimit -f unlimited), then resume: ablate resume {run_dir}"
        )
    return DiskFullError(
        f"disk full: no space left on {rundir.mount_of(run_dir)} while writing {writing}; "
        f"free some space, then resume: ablate resume {run_dir}"
    )


def _file_too_large(e: BaseException) -> bool:
    """A write past the file-size limit (RLIMIT_FSIZE, `ulimit -f`: Python ignores SIGXFSZ, so the write fails
    with EFBIG); safetensors and torch say it in their own words."""
    import errno

    return any(
        isinstance(c, OSError) and c.errno == errno.EFBIG or "File too large" in str(c) for c in chain(e)
    )


def dir_gone(run_dir: Path, e: BaseException) -> RunDirError | None:
    """The run dir deleted (or moved) while training: every later write fails. One line; nothing remade."""
    if not isinstance(e, Exception) or run_dir.is_dir():
        return None
    logging.raiseExceptions = False  # the log file went with the dir
    return RunDirError(
        f"the run dir {run_dir} was deleted (or moved) while training: nothing more can be saved there, "
        "and nothing was made again; run again in a new dir"
    )
