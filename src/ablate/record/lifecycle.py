"""A run's lifecycle around the training code, in one context manager (in the spirit of
lightning-hydra-template's `task_wrapper`):

    with lifecycle.record(cfg) as run:      # claims the dir: lock, run.json, summary.json `running`
        ...build and train...                # any failure below is recorded, never lost
        run.complete(trainer, extra)         # status `completed`, final metrics, the cache's lookups
    # summary.json is written once more on the way out, whatever happened

Everything a run dir records about how a run ended is written here: `completed`, `failed` (with
the error's one line; the full traceback goes to ablate.log), `interrupted` (Ctrl-C, SIGTERM),
`preempted` (SLURM; the job is then requeued), `pruned` (a study's pruner stopped the trial: not an
error, so the block ends normally after recording it). No torch import at module level.
"""

from __future__ import annotations

import contextlib
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

from ablate.errors import USER_ERRORS, DataError, Pruned, user_code_error, user_error
from ablate.process import interrupts
from ablate.process.console import print_result, say
from ablate.record import checkpoints, rundir, secrets, sweep_dirs
from ablate.record.identity import (
    NEW_DATA_ENV,
    RESIZED_ENV,
    check_same_config,
    claim,
    data_fingerprint,
    identity,
    same_run,
)
from ablate.schema.method import MethodSpec

log = logging.getLogger("ablate")
RESUME_ENV = sweep_dirs.RESUME_ENV  # set in a resumed sweep's job processes: completed jobs are skipped


@dataclass
class Run:
    """One run in progress: its dir, its identity (run.json) and the summary being built."""

    dir: Path
    info: dict[str, Any]
    summary: dict[str, Any]
    tracker: Any = None  # the logger group's tracker (W&B), started by `start_tracker`
    done: bool = False  # completed before this process started: nothing to do
    trained: tuple[Any, Any] | None = None  # (tokenizer, model) as trained, for the evaluations (`finished`)
    resumed_from: int = 0  # the step of the checkpoint this process resumed from
    t0: float = field(default_factory=time.time)
    cache_recorded: bool = False  # this launch's cache lookups are in run.json (later calls update them)
    # method.progress and the schedule's name (learned.note)
    progress: dict[str, Any] = field(default_factory=dict)

    def start_tracker(self, cfg: DictConfig) -> None:
        """The logger group's tracker (logger=none composes to nothing): one W&B run per job, on rank 0."""
        if not cfg.logger or not rundir.is_main_process():
            return
        from hydra.utils import instantiate

        self.tracker = instantiate(cfg.logger)
        self.tracker.start(secrets.config_record(cfg), self.dir, self.info)
        rundir.write_json(self.dir / rundir.RUN, self.info)  # the tracker may have added its run id

    def add_trainer_facts(self, trainer: Any) -> None:
        """What the trainer decided while it was built: its speed plans, its cache lookups and what it did to
        the data (`run_facts()`, e.g. the rollout trainers' `prompts_cut`)."""
        self.add_speed_plan(trainer)
        self.add_cache(trainer)
        facts = getattr(trainer, "run_facts", None)
        if callable(facts):
            self.note(**facts())

    def add_cache(self, trainer: Any) -> None:
        """The trainer's cache lookups (ablate.data.cache: each entry's kind, key, hit or miss, seconds)
        into run.json as `cache`; a resumed launch adds its own to the list. Called again after
        training (lookups made while it trains: the initial eval's forwards), it updates this launch's."""
        cache = getattr(trainer, "cache", None)
        if cache is None or not hasattr(cache, "record"):
            return
        now = cache.record()
        launches = self.info.get("cache", {}).get("launches", [])
        if self.cache_recorded:
            launches = launches[:-1]
        self.cache_recorded = True
        launches = launches + [now["entries"]]
        self.info["cache"] = {
            "enabled": now["enabled"],
            "dir": now["dir"],
            "launches": launches,
            "hits": sum(e["hit"] for e in now["entries"]),
            "misses": sum(not e["hit"] for e in now["entries"]),
        }
        rundir.write_json(self.dir / rundir.RUN, self.info)

    def add_speed_plan(self, trainer: Any) -> None:
        """The trainer's speed plans (ablate.speed.plan: which speed paths run, and why) into run.json
        and the tracker's config, as `speed_plan`: {policy: ..., reference: ...}."""
        plans = [getattr(trainer, "speed_plan", None), getattr(trainer, "ref_speed_plan", None)]
        record = {p.title: p.record() for p in plans if p is not None}
        if not record:  # a user's trainer without ablate's plan
            return
        self.info["speed_plan"] = record
        rundir.write_json(self.dir / rundir.RUN, self.info)
        if rundir.is_main_process():  # the tables a run prints as one line (ablate.speed.plan.PrintPlan)
            from ablate.speed.plan import TABLE_FILE  # torch is loaded by now (a trainer exists)

            (self.dir / TABLE_FILE).write_text("\n\n".join(p.table() for p in plans if p is not None) + "\n")
        if getattr(self.tracker, "add_config", None) is not None:  # a tracker of your own may not have it
            self.tracker.add_config({"speed_plan": record})

    def check_data(self, data: Any) -> None:
        """Record the data's fingerprint in run.json (`data`: rows and sha256 per split) or, when a
        checkpoint is there to resume from, check it is the one recorded: a resume on data edited
        since would train its remaining steps on rows the run's first steps never saw, silently.
        Refused in one line (DataError); `ablate resume RUN_DIR --force` accepts the new data."""
        now = data_fingerprint(data)
        before = self.info.get("data")
        if before and before != now and checkpoints.checkpoints(self.dir):
            split = next(k for k in now if now[k] != before.get(k))
            rows = [(fp or {}).get("rows", 0) for fp in (before.get(split), now[split])]
            change = (
                f"{rows[0]} rows then, {rows[1]} now"
                if rows[0] != rows[1]
                else f"{rows[1]} rows, other content"
            )
            if not os.environ.get(NEW_DATA_ENV):
                raise DataError(
                    f"the {split} data changed since this run started ({change}; run.json records its "
                    f"sha256); restore it, or resume on the new data: ablate resume {self.dir} --force"
                )
            log.warning(
                "the %s data changed since this run started (%s): resuming on the new data (--force)",
                split,
                change,
            )
        if before != now:
            self.info["data"] = now
            rundir.write_json(self.dir / rundir.RUN, self.info)

    def prepare(self, cfg: DictConfig) -> None:
        """This process set up for the run (ablate.process.setup: threads, malloc, the gloo group), and
        who runs it in run.json, which every rank must then see."""
        from ablate.process import setup

        setup.prepare(cfg, self.info)
        rundir.write_json(self.dir / rundir.RUN, self.info)
        self.progress = {  # GRPO's learning checks; reward, KTO, ... have none
            **(MethodSpec.of(cfg.method).progress or {}),
            "scheduler": HydraConfig.get().runtime.choices.get("optimizer/scheduler"),
        }
        rundir.check_shared_run_dir(self.dir)

    def note(self, **facts: Any) -> None:
        """Facts the run learned while it was built (e.g. `data_format`: how its rows were formatted,
        which `ablate generate` formats prompts by) into run.json."""
        self.info.update(facts)
        rundir.write_json(self.dir / rundir.RUN, self.info)

    def study_callbacks(self) -> list[Any]:
        """When this run is a study's trial (hydra/sweeper=optuna): the callback reporting its metric to
        the study, which may prune it (ablate.record.callbacks.ReportToStudy); else none."""
        from ablate.record.callbacks import trial_callbacks

        return trial_callbacks()

    def resume_point(self) -> Path | None:
        """The newest complete checkpoint (newer incomplete or corrupt ones named in one line each);
        metrics.jsonl loses the events past it, since those steps run and log again."""
        skipped: list[str] = []
        ckpt = checkpoints.latest_checkpoint(self.dir, skipped)
        for why in skipped:  # each moved aside: a new save of its step must not mix with its files
            aside = checkpoints.set_aside(self.dir / rundir.CHECKPOINTS / why.split(":")[0])
            log.warning(
                "skipping %s; resuming from %s (it is kept in %s/)",
                why,
                ckpt.name if ckpt else "the start",
                aside.parent.relative_to(self.dir),
            )
        self.resumed_from = checkpoint_step(ckpt)
        rundir.truncate_metrics(self.dir, self.resumed_from)
        return ckpt

    def complete(self, trainer: Any, *extra: dict[str, Any]) -> None:
        """Training ended normally: status, the last value of every logged metric, run-level fields
        (`extra`: e.g. GRPO's generation rounds, tokens/s and MFU over the whole run), and the cache
        lookups made while training (an eval's at step 0) into run.json."""
        history, global_step = trainer.state.log_history, trainer.state.global_step
        metrics = final_metrics(history)
        metrics["train_loss"] = train_loss(history, global_step)
        self.summary.update(status="completed", global_step=global_step, metrics=metrics)
        from ablate.callbacks import learned  # (its package loads transformers: not at import)

        if said := learned.note(
            history, self.progress, global_step, self.summary["overrides"], self.progress.get("scheduler")
        ):
            self.summary["note"] = said  # the progress metric never moved: printed under the final table
        self.add_cache(trainer)
        for fields in extra:
            self.summary.update(fields)

    def write(self) -> None:
        """summary.json, with the run's wall-clock so far; the tracker is told how the run ended."""
        self.summary["train_runtime"] = self.summary.get("metrics", {}).get(
            "train_runtime", round(time.time() - self.t0, 3)
        )
        self.summary["wall_seconds"] = round(time.time() - self.t0, 3)
        # a run dir deleted while training is not made again (`checkpoints.dir_gone` says so)
        if self.dir.is_dir():
            rundir.write_json(self.dir / rundir.SUMMARY, self.summary)
        if self.tracker is not None:
            self.tracker.finish(self.summary["status"])


@contextlib.contextmanager
def record(cfg: DictConfig) -> Iterator[Run]:
    """Claim Hydra's output dir for this run and record how the run ends, whatever happens inside.

    A completed run (or a resumed sweep's completed job) yields a `Run` with `done` set and is left
    as it is, every byte: it is checked before the lock is taken, and `.hydra/` is written (by
    `write_config_files`, not by Hydra) only once this process holds the dir. SIGTERM ends like
    Ctrl-C (`interrupted`); a second signal while the record is written is ignored."""
    interrupts.watch_parent()  # a local_parallel worker ends with its sweep's parent, kill -9 included
    hc = HydraConfig.get()
    run_dir = Path(hc.runtime.output_dir)
    # ${oc.env:X} as written, not its value
    overrides = OmegaConf.to_container(hc.overrides.task, resolve=False)
    secrets.remember(overrides)  # this process may be a sweep's worker: it has not seen the command line
    todo = pending_evals(cfg, run_dir)  # a completed run still evaluates what eval.json lacks
    previous = skip_completed(run_dir) if os.environ.get(RESUME_ENV) else _completed(run_dir, overrides, todo)
    if previous is not None:
        yield _untouched(run_dir, previous)
        return
    multirun = hc.mode == RunMode.MULTIRUN
    with sweep_dirs.refusal_recorded(run_dir, hc):  # a dir that is not this run's: nothing written into it
        rundir.is_usable(run_dir)
        same_run(run_dir, rundir.read_json_checked(run_dir / rundir.RUN), overrides)
        rundir.lock(
            run_dir, advice="resume the sweep once it has" if multirun else "use another hydra.run.dir"
        )
        info = claim(run_dir, overrides)
        now = identity(cfg)
        check_same_config(run_dir, info, now)
    previous = _completed(run_dir, overrides)
    if previous is not None:  # completed by the process that held the lock a moment ago
        yield _untouched(run_dir, previous)
        return
    write_config_files(run_dir, cfg, hc)
    if info.get("config_hash") != now["config_hash"]:  # the job's identity, checked when it is resumed
        info.update(now)
        if os.environ.get(RESIZED_ENV):  # resumed on another rank count: the command that continues it
            info["overrides"] = overrides
        rundir.write_json(run_dir / rundir.RUN, info)
    run = Run(
        run_dir,
        info,
        {
            "status": "running",
            "method": cfg.method.name,
            "overrides": overrides,
            # the method's own say in `ablate compare` (a user's method too)
            "compare_metrics": MethodSpec.of(cfg.method).compare_metrics,
            "run_dir": str(run_dir),
            "versions": info.get("versions"),
            "git_sha": info.get("git_sha"),
        },
    )
    rundir.write_json(run_dir / rundir.SUMMARY, run.summary)
    if not multirun:
        checkpoints.warn_if_rerun(run_dir, overrides, hc)  # the same command again, in a new default dir
    with interrupts.as_exceptions():
        try:
            yield run
        except (
            Pruned
        ) as e:  # a study stopped this trial: recorded, and the caller goes on as after a completed run
            run.summary.update(
                status="pruned",
                global_step=e.step,
                pruned_at=e.step,
                metrics=final_metrics(rundir.read_metrics(run.dir)),
            )
            run.write()
            return
        except BaseException as e:  # every failure must still leave a summary
            known = (
                checkpoints.dir_gone(run.dir, e)
                or checkpoints.disk_full(run.dir, run.resumed_from, e)
                or checkpoints.peer_lost(run.dir, e)
                or user_code_error(e)
            )
            _ended_by(run, known or e, hc.mode)
            if known is not None:
                raise known from e
            raise
        run.write()


def _completed(run_dir: Path, overrides: list[str], todo: list[str] | None = None) -> dict[str, Any] | None:
    """The summary of `run_dir` when it holds this very run, completed; read only (no lock taken,
    nothing written). A dir holding another run is refused (ConfigError), as `claim` does. `todo`: the
    evaluations it has yet to record (eval=[...]), said instead of "nothing to do"."""
    previous = rundir.completed_summary(run_dir)
    if previous is not None:
        same_run(run_dir, rundir.read_json_checked(run_dir / rundir.RUN), overrides)
        if rundir.is_main_process() and not os.environ.get(RESUME_ENV):
            left = f"evaluating what {rundir.EVAL} lacks" if todo else "nothing to do"
            print(f"{run_dir} already completed at step {previous.get('global_step')}: {left}")
    return previous


def _untouched(run_dir: Path, summary: dict[str, Any]) -> Run:
    """A completed run, to be left as it is: log lines from here on (Hydra's launcher announcing the
    next job of a multirun) must not land in its ablate.log."""
    rundir.stop_logging_into(run_dir)
    return Run(run_dir, rundir.read_json(run_dir / rundir.RUN) or {}, summary, done=True)


def pending_evals(cfg: DictConfig, run_dir: Path) -> list[str]:
    """The evaluations `eval=[...]` asks for that the run's eval.json does not hold yet."""
    if not cfg.get("eval"):
        return []
    from ablate.evaluation import results

    return results.pending(cfg, rundir.read_json(run_dir / rundir.EVAL) or {})


def evaluate(
    cfg: Any,
    run_dir: Path,
    model: Any,
    tokenizer: Any,
    device_args: dict[str, Any],
    overrides: list[str],
    only: list[str],
) -> dict[str, Any]:
    """Run the evaluations `only` on the run's `model` (ablate.evaluation), record them (eval_examples.jsonl,
    then eval.json: what it lists is done), and hand them to the run's tracker (W&B: its own run, resumed).
    Returns eval.json's record. Holds the run dir's lock: two processes never write one eval.json."""
    from hydra.utils import instantiate

    from ablate.evaluation import results
    from ablate.evaluation.base import Evaluand

    rundir.lock(run_dir, advice="wait for it, or evaluate another run")
    info = rundir.read_json(run_dir / rundir.RUN) or {}
    found = results.run(cfg, Evaluand(cfg, run_dir, model, tokenizer, info, device_args), only)
    before = rundir.read_json(run_dir / rundir.EVAL) or {}
    record, rows = results.merged(before, rundir.example_rows(run_dir), found, cfg.method.name, overrides)
    rundir.write_examples(run_dir, rows)
    rundir.write_json(run_dir / rundir.EVAL, record)
    tracker = instantiate(cfg.logger) if cfg.get("logger") and rundir.is_main_process() else None
    if getattr(tracker, "log_eval", None) is not None:  # a tracker of the user's may not have it
        tracker.log_eval(run_dir, info, record["metrics"], [r for r in rows if r["eval"] in found])
    return record


def finished(cfg: DictConfig, run: Run, precision: Any) -> None:
    """After the record, on the main process: the final metrics (a run trained now), then the evaluations
    `eval=[...]` asks for that eval.json lacks (a job killed while it evaluated runs them again, only them),
    the training's process group gone; the model as trained (`run.trained`), else as saved. `precision`:
    the precision node -> this machine's TrainingArguments (ablate.config.machine.check_precision)."""
    if not rundir.is_main_process():
        return
    if not run.done:
        print_result(run.summary, run.dir)
    todo = pending_evals(cfg, run.dir) if run.summary.get("status") == "completed" else []
    if todo:
        from ablate.evaluation.results import summary_line
        from ablate.models import pretrained
        from ablate.process.setup import quiet_libraries

        quiet_libraries()  # as in training (a job that only evaluates did not set them)
        say(f"evaluating: {', '.join(todo)}")
        tokenizer, model = run.trained or pretrained(str(run.dir / rundir.MODEL))
        device = precision(cfg.precision)
        record = evaluate(cfg, run.dir, model, tokenizer, device, list(run.summary["overrides"]), todo)
        say(summary_line(record, run.summary.get("compare_metrics") or []))


def write_config_files(run_dir: Path, cfg: DictConfig, hc: Any) -> None:
    """`.hydra/config.yaml`, `hydra.yaml` and `overrides.yaml`, as Hydra would write them, secrets
    masked before any byte is written. conf/config.yaml turns Hydra's own writing off
    (`hydra.output_subdir: null`): Hydra writes before the task starts, into a dir this process may
    not own (another process's run, a completed run that must not change)."""
    if not rundir.is_main_process():
        return
    hydra_node = OmegaConf.to_container(hc, resolve=False)
    hydra_node["output_subdir"] = rundir.HYDRA  # where they are, as Hydra records it
    out = run_dir / rundir.HYDRA
    out.mkdir(exist_ok=True)
    for name, node in (
        ("config.yaml", OmegaConf.to_container(cfg, resolve=False)),
        ("hydra.yaml", {"hydra": hydra_node}),
        ("overrides.yaml", OmegaConf.to_container(hc.overrides.task, resolve=False)),
    ):
        rundir.write_text(out / name, OmegaConf.to_yaml(OmegaConf.create(secrets.mask(node))))


def _ended_by(run: Run, e: BaseException, mode: RunMode) -> None:
    """Record the exception that ended `run`; a SLURM preemption is requeued here (after the record)."""
    if isinstance(e, interrupts.Preempted):  # SLURM preemption: checkpoint saved, requeue
        run.summary.update(status="preempted")
        run.write()
        all_ranks_stopped()  # rank 0's record is written before any rank leaves the job
        e.requeue()  # last: submitit requeues the job (SLURM then SIGTERMs its processes) and exits
    if isinstance(e, (KeyboardInterrupt, interrupts.Interrupted)):
        run.summary.update(status="interrupted", error=interrupts.describe(e))
        line = f"run interrupted ({run.summary['error']}): resume with `ablate resume {run.dir}`"
        # a single run says it once, below the bar (ablate.train.main: checkpoints.interrupted_line)
        if mode == RunMode.RUN:
            _log_to_file(line)
        else:
            log.warning("%s", line)
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


def skip_completed(run_dir: Path) -> dict[str, Any] | None:
    """In a job of a resumed sweep: the summary of an already completed run dir (skip it), else None."""
    if not os.environ.get(RESUME_ENV):
        return None
    return rundir.completed_summary(run_dir)


# ---- the summary's numbers ----


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
