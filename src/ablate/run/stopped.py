"""What a stopped run leaves the user: the one line Ctrl-C (or SIGTERM) prints below the progress bar,
and, when the same command is run again into a new default dir (from step 0), which earlier run of
it has a checkpoint to continue and how (`ablate resume`); a rank that lost its peers, in one line with where the run resumes."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from hydra.types import RunMode

from ablate.errors import PeerLostError, chain
from ablate.run import rundir, secrets

log = logging.getLogger("ablate")


def interrupted_line(hc: Any, why: str) -> str:
    """What Ctrl-C (or SIGTERM) leaves, in one line: for a single run, the step reached and how to go on."""
    run_dir = Path(hc.runtime.output_dir)
    if hc.mode != RunMode.RUN or not rundir.is_main_process() or not (run_dir / rundir.RUN).is_file():
        return f"ablate: interrupted ({why})"
    events = rundir.read_metrics(run_dir) if (run_dir / rundir.METRICS).is_file() else []
    ckpt = rundir.latest_checkpoint(run_dir)
    where = f" at step {events[-1]['step']}" if events else ""
    start = f"from {ckpt.name}" if ckpt is not None else "from step 0 (no checkpoint was saved yet)"
    return f"ablate: interrupted ({why}){where}; `ablate resume {run_dir}` continues it {start}"


def earlier_unfinished(run_dir: Path, overrides: list[str], newest: int = 200) -> tuple[Path, str] | None:
    """A run of the same command (the same overrides) beside a new default-named run dir
    (outputs/runs/<date>/<time>_...), interrupted or failed with a checkpoint to continue from: the
    newest such dir and its state, else None. Rerunning a command names a new dir, so the rerun does
    not continue it; the run says so, and how (`ablate resume`). The newest `newest` dirs are read."""
    root = run_dir.parent.parent
    siblings = sorted((p for p in root.glob("*/*") if p.is_dir() and p != run_dir), key=lambda p: (p.parent.name, p.name))
    for other in reversed(siblings[-newest:]):
        info = rundir.read_json(other / rundir.RUN)
        if not info or sorted(info.get("overrides", [])) != sorted(secrets.mask(overrides)):
            continue
        state = rundir.state(other)
        if state in ("interrupted", "failed", "preempted") and rundir.latest_checkpoint(other) is not None:
            return other, state
    return None


def warn_if_rerun(run_dir: Path, overrides: list[str], hc: Any) -> None:
    """A single run in a new default dir whose command (the same overrides) ran before and stopped
    with a checkpoint: say that this run starts from step 0, and how to continue that one instead."""
    if not rundir.is_main_process() or _given_run_dir(hc) or rundir.checkpoints(run_dir):
        return
    earlier = earlier_unfinished(run_dir, overrides)
    if earlier is not None:
        log.warning("the same command's run in %s is %s with a checkpoint; this is a new run from step 0 "
                    "(to continue that one instead: ablate resume %s)", earlier[0], earlier[1], earlier[0])


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
    cause = next((c for c in chain(e) if isinstance(c, RuntimeError) and any(m in str(c) for m in PEER_LOST)), None)
    if cause is None:
        return None
    what = next(m for m in PEER_LOST if m in str(cause))
    sealed = [p for _, p in rundir.checkpoints(run_dir) if (p / rundir.MANIFEST).exists()]  # newest first
    where = f"from {sealed[0].name}" if sealed else "from the start (no checkpoint yet)"
    return PeerLostError(f"rank {os.environ.get('RANK', '?')} lost another rank of this job ({what.lower()}: it died, "
                         f"or hung past distributed.ddp_timeout); the run resumes {where}: start the same command "
                         "again on every node")
