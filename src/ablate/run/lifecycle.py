"""A run's lifecycle around the training code, in one context manager (in the spirit of
lightning-hydra-template's `task_wrapper`):

    with lifecycle.record(cfg) as run:      # claims the dir: lock, run.json, summary.json `running`
        ...build and train...                # any failure below is recorded, never lost
        run.complete(state, extra)           # status `completed`, final metrics
    # summary.json is written once more on the way out, whatever happened

Everything a run dir records about how a run ended is written here: `completed`, `failed` (with
the error's one line; the full traceback goes to ablate.log), `interrupted` (Ctrl-C, SIGTERM),
`preempted` (SLURM; the job is then requeued). No torch import at module level.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from ablate.errors import USER_ERRORS, ConfigError, user_error
from ablate.run import interrupts, rundir, secrets

log = logging.getLogger("ablate")
RESUME_ENV = "ABLATE_RESUME_SWEEP"  # set in a resumed sweep's job processes: completed jobs are skipped


@dataclass
class Run:
    """One run in progress: its dir, its identity (run.json) and the summary being built."""

    dir: Path
    info: dict[str, Any]
    summary: dict[str, Any]
    tracker: Any = None  # the logger group's tracker (W&B), started by `start_tracker`
    done: bool = False  # completed before this process started: nothing to do
    t0: float = field(default_factory=time.time)

    def start_tracker(self, cfg: DictConfig) -> None:
        """The logger group's tracker (logger=none composes to nothing): one W&B run per job, on rank 0."""
        if not cfg.logger or not rundir.is_main_process():
            return
        from hydra.utils import instantiate

        self.tracker = instantiate(cfg.logger)
        self.tracker.start(secrets.config_record(cfg), self.dir, self.info)
        rundir.write_json(self.dir / rundir.RUN, self.info)  # the tracker may have added its run id

    def resume_point(self) -> Path | None:
        """The newest complete checkpoint (newer incomplete or corrupt ones named in one line each);
        metrics.jsonl loses the events past it, since those steps run and log again."""
        skipped: list[str] = []
        ckpt = rundir.latest_checkpoint(self.dir, skipped)
        for why in skipped:
            log.warning("skipping %s; resuming from %s", why, ckpt.name if ckpt else "the start")
        rundir.truncate_metrics(self.dir, checkpoint_step(ckpt))
        return ckpt

    def complete(self, history: list[dict[str, Any]], global_step: int, *extra: dict[str, Any]) -> None:
        """Training ended normally: status, the last value of every logged metric, run-level fields
        (`extra`: e.g. GRPO's generation rounds, tokens/s and MFU over the whole run)."""
        metrics = final_metrics(history)
        metrics["train_loss"] = train_loss(history, global_step)
        self.summary.update(status="completed", global_step=global_step, metrics=metrics)
        for fields in extra:
            self.summary.update(fields)

    def write(self) -> None:
        """summary.json, with the run's wall-clock so far; the tracker is told how the run ended."""
        self.summary["train_runtime"] = self.summary.get("metrics", {}).get("train_runtime", round(time.time() - self.t0, 3))
        self.summary["wall_seconds"] = round(time.time() - self.t0, 3)
        rundir.write_json(self.dir / rundir.SUMMARY, self.summary)
        if self.tracker is not None:
            self.tracker.finish(self.summary["status"])


@contextlib.contextmanager
def record(cfg: DictConfig) -> Iterator[Run]:
    """Claim Hydra's output dir for this run and record how the run ends, whatever happens inside.

    A completed run (or a resumed sweep's completed job) yields a `Run` with `done` set and is left
    as it is. SIGTERM ends like Ctrl-C (`interrupted`); a second signal while the record is written
    is ignored."""
    hc = HydraConfig.get()
    run_dir = Path(hc.runtime.output_dir)
    previous = skip_completed(run_dir)
    if previous is not None:
        log.info("%s completed earlier: skipped", run_dir)
        yield Run(run_dir, {}, previous, done=True)
        return
    overrides = OmegaConf.to_container(hc.overrides.task, resolve=False)  # ${oc.env:X} as written, not its value
    rundir.lock(run_dir)  # for the process's life: a second process in this dir stops here, one line
    info = claim(run_dir, overrides)
    previous = rundir.read_json(run_dir / rundir.SUMMARY) or {}
    if previous.get("status") == "completed":  # a completed run never changes
        if rundir.is_main_process():
            print(f"{run_dir} already completed at step {previous.get('global_step')}: nothing to do")
        yield Run(run_dir, info, previous, done=True)
        return
    if "config_hash" not in info:  # the job's identity, checked when its sweep is resumed
        info.update(identity(cfg))
        rundir.write_json(run_dir / rundir.RUN, info)
    run = Run(run_dir, info, {"status": "running", "method": cfg.method.name, "overrides": overrides,
                              # the method's own say in `ablate compare` (a user's method too)
                              "compare_metrics": list(cfg.method.get("compare_metrics") or ["loss"]),
                              "run_dir": str(run_dir), "versions": info.get("versions"), "git_sha": info.get("git_sha")})
    rundir.write_json(run_dir / rundir.SUMMARY, run.summary)
    with interrupts.as_exceptions():
        try:
            yield run
        except BaseException as e:  # noqa: BLE001 - every failure must still leave a summary
            _ended_by(run, e, hc.mode)
            raise
        run.write()


def _ended_by(run: Run, e: BaseException, mode: RunMode) -> None:
    """Record the exception that ended `run`; a SLURM preemption is requeued here (after the record)."""
    if isinstance(e, interrupts.Preempted):  # SLURM preemption: checkpoint saved, requeue
        run.summary.update(status="preempted")
        run.write()
        all_ranks_stopped()  # rank 0's record is written before any rank leaves the job
        e.requeue()  # last: submitit requeues the job (SLURM then SIGTERMs its processes) and exits
    if isinstance(e, (KeyboardInterrupt, interrupts.Interrupted)):
        run.summary.update(status="interrupted", error=interrupts.describe(e))
        log.warning("run interrupted (%s): resume with `ablate resume %s`", run.summary["error"], run.dir)
        run.write()
        return
    cause = user_error(e) or e
    msg = f"{type(cause).__name__}: {cause}".splitlines()[0] if str(cause) else type(cause).__name__
    run.summary.update(status="failed", error=msg)
    if cause is e and not isinstance(e, USER_ERRORS):  # a bug: keep the whole traceback in the log
        log.error("run failed: %s\n%s", msg, traceback.format_exc())
    else:  # one line for the user; the full cause (chained errors included) still goes to ablate.log
        _log_to_file(f"run failed: {msg}\n{traceback.format_exc()}")
        if mode != RunMode.RUN:  # single runs print the one line themselves (ablate.train.main)
            log.error("run failed: %s", msg)
    run.write()


def all_ranks_stopped() -> None:
    """A barrier over the job's ranks (several SLURM tasks, torchrun), if torch.distributed is up:
    ranks > 0 leave at once after a preemption (submitit requeues from rank 0 only), and with
    KillOnBadExit SLURM would end rank 0 before it recorded `preempted` and requeued."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def _log_to_file(message: str) -> None:
    """Write `message` to the run's ablate.log only (not the console): the full cause of an error
    the user sees as one line."""
    entry = log.makeRecord(log.name, logging.ERROR, __file__, 0, message, None, None)
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handle(entry)


# ---- the run's identity (run.json) ----

def claim(run_dir: Path, overrides: list[str]) -> dict[str, Any]:
    """Record (or check) the run's identity: a dir is resumed only by the same command; a dir that
    is neither empty nor an ablate run, or whose run.json is corrupt, is refused (RunDirError)."""
    rundir.is_usable(run_dir)
    info = rundir.read_json_checked(run_dir / rundir.RUN)
    if info is not None:
        if sorted(info.get("overrides", [])) != sorted(secrets.mask(overrides)):  # recorded masked
            raise ConfigError(
                f"{run_dir} holds another run (overrides {info.get('overrides')}); "
                "pick a new hydra.run.dir, or repeat that run's exact overrides to resume it"
            )
        return info
    info = {"overrides": overrides, "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "versions": rundir.versions(), "git_sha": rundir.git_sha(), **_launch_context()}
    rundir.write_json(run_dir / rundir.RUN, info)
    return info


def _launch_context() -> dict[str, Any]:
    """What `ablate resume` needs beyond the overrides to compose the same config: the --config-dir
    given at launch (method/my_hinge.yaml lives there) and the PYTHONPATH its _target_s import from."""
    out: dict[str, Any] = {}
    dirs = [s.path for s in HydraConfig.get().runtime.config_sources if s.provider == "command-line"]
    if dirs:
        out["config_dir"] = str(Path(dirs[0].split("://", 1)[-1]).resolve())
    paths = [str(Path(p).resolve()) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if paths:
        out["pythonpath"] = paths
    return out


def identity(cfg: DictConfig) -> dict[str, Any]:
    """What a job's run.json records of its config: the resolved config, secrets masked as every
    record is (ablate.run.secrets: a resolved `${oc.env:HF_TOKEN}` becomes ***), and its hash (of the
    masked config: a rotated token does not change the job; a resumed sweep compares it)."""
    resolved = secrets.mask(OmegaConf.to_container(cfg, resolve=True))
    return {"config_hash": config_hash(resolved), "config": resolved}


def config_hash(resolved: Any) -> str:
    return hashlib.sha256(json.dumps(resolved, sort_keys=True, default=str).encode()).hexdigest()[:16]


def skip_completed(run_dir: Path) -> dict[str, Any] | None:
    """In a job of a resumed sweep: the summary of an already completed run dir (skip it), else None."""
    if not os.environ.get(RESUME_ENV):
        return None
    summary = rundir.read_json(run_dir / rundir.SUMMARY)
    return summary if summary and summary.get("status") == "completed" else None


# ---- checkpoints and the summary's numbers ----

def checkpoint_step(ckpt: Path | None) -> int:
    return int(ckpt.name.split("-")[-1]) if ckpt is not None else 0


def is_final(ckpt: Path) -> bool:
    """Whether `ckpt` was saved at the run's last step (Trainer records max_steps in its state)."""
    state = rundir.read_json(ckpt / "trainer_state.json") or {}
    return 0 < int(state.get("max_steps", 0)) <= int(state.get("global_step", 0))


def train_loss(history: list[dict[str, Any]], global_step: int) -> float | None:
    """Mean per-step loss of the whole run, from its logged losses (each the mean over the steps
    since the previous log; `LogAtSaveAndEnd` makes the last log the last step and every checkpoint
    a log step). Trainer's own `train_loss` covers only the steps since a resume."""
    total, prev = 0.0, 0
    for event in history:
        if "loss" in event and "step" in event and event["step"] > prev:
            total += float(event["loss"]) * (event["step"] - prev)
            prev = event["step"]
    return total / prev if prev and prev == global_step else None


def final_metrics(history: list[dict[str, Any]]) -> dict[str, Any]:
    """The last logged value of every metric (train and eval_), plus Trainer's end-of-train stats."""
    out: dict[str, Any] = {}
    for event in history:
        out.update({k: v for k, v in event.items() if isinstance(v, (int, float)) and k != "step"})
    return out


def print_result(run: Run) -> None:
    """The final metrics as a table, then the run dir on a line of its own (to paste)."""
    from rich.console import Console
    from rich.table import Table

    summary = run.summary
    table = Table(title=f"{summary['method']} finished: {summary['status']} at step {summary.get('global_step')}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for k, v in sorted(summary.get("metrics", {}).items()):
        table.add_row(k, f"{v:.4g}" if isinstance(v, float) else str(v))
    Console().print(table)
    # plain print: rich would fold a long path at the terminal width (80 columns when piped) and
    # read `[...]` in it as markup; this line is meant to be pasted (ablate resume / compare)
    print(f"run dir: {run.dir}", flush=True)
