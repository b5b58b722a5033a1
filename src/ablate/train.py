"""One run, top to bottom: compose -> instantiate -> train -> summarize.

Heavy imports (torch, transformers) happen inside `run`, so `ablate train --cfg job` stays fast.
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import sys
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from hydra.utils import get_class, instantiate
from omegaconf import DictConfig, OmegaConf

from ablate import interrupts, redact, rundir, runs, slurm, sweep_resume, validate
from ablate.errors import USER_ERRORS, ConfigError

log = logging.getLogger("ablate")
# peft (imported by Trainer when installed) imports bitsandbytes, whose CPU backend warns on every run
# that an optional speed-up package is missing, even when nothing uses bitsandbytes
logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)


def main(cfg: DictConfig) -> dict[str, Any]:
    """The Hydra task. A user error in a single run is one line on stderr and exit code 2; in a
    multirun it is raised, so Hydra records the job as failed and the sweep goes on."""
    try:
        return run(cfg)
    except (KeyboardInterrupt, interrupts.Interrupted) as e:  # recorded as `interrupted` by run()
        print(f"ablate: interrupted ({interrupts.describe(e)})", file=sys.stderr)
        if interrupts.in_sweep_worker():
            interrupts.leave_worker(interrupts.exit_code(e))
        sys.exit(interrupts.exit_code(e))
    except Exception as e:
        user_error = _user_error(e)
        if user_error is not None and HydraConfig.get().mode == RunMode.RUN:
            print(f"ablate: error: {user_error}", file=sys.stderr)
            sys.exit(2)
        raise


def _user_error(e: BaseException | None) -> BaseException | None:
    """The user-fixable error behind `e`, if any (Hydra's instantiate wraps errors in its own)."""
    while e is not None:
        if isinstance(e, USER_ERRORS):
            return e
        e = e.__cause__
    return None


def run(cfg: DictConfig) -> dict[str, Any]:
    """Train one run in Hydra's output dir; always leave a summary.json. Returns the summary."""
    slurm.export_torch_distributed()  # a SLURM job of several tasks is one DDP run, as under torchrun
    hc = HydraConfig.get()
    run_dir = Path(hc.runtime.output_dir)
    done = sweep_resume.skip_completed(run_dir)  # a resumed sweep's completed job: nothing to do
    if done is not None:
        log.info("%s completed earlier: skipped", run_dir)
        return done
    overrides = OmegaConf.to_container(hc.overrides.task, resolve=False)  # ${oc.env:X} as written, not its value
    rundir.lock(run_dir)  # for the process's life: a second process in this dir stops here, one line
    info = _claim_run_dir(run_dir, overrides)
    previous = rundir.read_json(run_dir / rundir.SUMMARY) or {}
    if previous.get("status") == "completed":  # a completed run never changes
        if rundir.is_main_process():
            print(f"{run_dir} already completed at step {previous.get('global_step')}: nothing to do")
        return previous
    if "config_hash" not in info:  # the job's identity, checked when its sweep is resumed
        info.update(sweep_resume.identity(cfg))
        rundir.write_json(run_dir / rundir.RUN, info)
    summary: dict[str, Any] = {"status": "running", "method": cfg.method.name, "overrides": overrides,
                               # the method's own say in `ablate compare` (a user's method too)
                               "compare_metrics": list(cfg.method.get("compare_metrics") or ["loss"]),
                               "run_dir": str(run_dir), "versions": info["versions"], "git_sha": info["git_sha"]}
    rundir.write_json(run_dir / rundir.SUMMARY, summary)
    tracker = None
    t0 = time.time()
    # SIGTERM (docker stop, timeout, kill) ends like Ctrl-C: `interrupted`; a second signal while the
    # record is written is ignored
    with interrupts.as_exceptions():
        try:
            validate.check(cfg)  # a single run was checked before its dir existed (validate.Validate); a sweep job here
            runs.prepare(cfg, run_dir, info)  # torch threads, tags, notes, pid -> run.json (before heavy work)
            _check_method_args(cfg)
            from transformers import set_seed
            from transformers.utils import logging as hf_logging

            from ablate.models.adapters import save_merged, with_adapters

            hf_logging.disable_progress_bar()  # per-checkpoint "Writing model shards" bars; the training bar stays
            # TrainingArguments pins dataloader memory by default; on a CPU-only machine torch warns on
            # every dataloader that pinning is skipped: nothing to act on
            warnings.filterwarnings("ignore", message=".*'pin_memory' argument is set as true but no accelerator")
            set_seed(cfg.seed)
            # before TrainingArguments (which raises a page on tf32 without a GPU); the precision group's
            # values are passed as explicit kwargs below, so they are the ones the args end up with
            device_args = _check_precision(cfg.precision)
            _check_distributed(cfg.distributed)
            args = _training_args(cfg, run_dir, {**device_args, **OmegaConf.to_container(cfg.distributed)})
            make_trainer = instantiate(cfg.method.trainer)  # a partial: a bad loss `_target_` fails before the model is built
            _check_trainer_class(getattr(make_trainer, "func", make_trainer))
            data = instantiate(cfg.data)  # before the model: a data mistake costs no model load
            tokenizer, model = instantiate(cfg.model)
            model = with_adapters(model, cfg.get("peft"))  # +peft=lora|qlora: trainable adapters on a frozen base
            _check_trainable(model)

            if cfg.logger and rundir.is_main_process():  # logger=none composes to an empty node; one W&B run per job
                tracker = instantiate(cfg.logger)
                tracker.start(redact.config_record(cfg), run_dir, info)
                rundir.write_json(run_dir / rundir.RUN, info)  # the tracker may have added its run id

            ckpt = _resume_point(run_dir)
            # steps past the checkpoint (or all of them: killed before the first one) run and log again
            rundir.truncate_metrics(run_dir, _step(ckpt))
            callbacks = _callbacks(cfg, run_dir, tracker=tracker)
            trainer = make_trainer(
                model=model,
                args=args,
                train_dataset=data.train,
                eval_dataset=data.eval if args.eval_strategy != "no" else None,
                processing_class=tokenizer,
                callbacks=callbacks,
                # partials Trainer calls in create_optimizer/create_scheduler (ConfiguredOptimizer)
                optimizer_factory=instantiate(cfg.optimizer.optimizer),
                scheduler_factory=instantiate(cfg.optimizer.scheduler),
            )
            from ablate.speed import Speed

            speed = Speed(trainer, peak_tflops=cfg.get("peak_tflops"))
            # first of all callbacks: its tokens/s and MFU reach the progress bar's log line, metrics.jsonl and W&B
            trainer.callback_handler.callbacks.insert(0, speed)

            if ckpt is not None and _finished(ckpt):
                # killed between the final checkpoint and summary.json: training is done, only the
                # final save is missing; resuming would train one step past max_steps
                log.info("%s is the final checkpoint: saving the model without training further", ckpt.name)
                trainer._load_from_checkpoint(str(ckpt))
                trainer.state = type(trainer.state).load_from_json(str(ckpt / "trainer_state.json"))
            else:
                if ckpt is not None:
                    log.info("resuming from %s", ckpt)
                trainer.train(resume_from_checkpoint=str(ckpt) if ckpt else None)

            if trainer.is_world_process_zero():
                from ablate.callbacks import mask_saved_args

                trainer.save_model(str(run_dir / rundir.MODEL))
                mask_saved_args(run_dir / rundir.MODEL, trainer.args)  # as MaskSavedArgs does for checkpoints
                save_merged(trainer, run_dir / rundir.MODEL, cfg)  # with peft.save_merged=true
                rundir.fix_permissions(run_dir / rundir.MODEL)
            metrics = _final_metrics(trainer.state.log_history)
            metrics["train_loss"] = _train_loss(trainer.state.log_history, trainer.state.global_step)
            summary.update(status="completed", global_step=trainer.state.global_step, metrics=metrics)
            summary.update(getattr(trainer, "summary_fields", dict)())  # e.g. GRPO generation rounds
            summary.update(speed.summary_fields())  # tokens/s and MFU over the whole run (`ablate compare`)
        except BaseException as e:  # noqa: BLE001 - every failure must still leave a summary
            if isinstance(e, interrupts.Preempted):  # SLURM preemption: checkpoint saved, requeue
                summary.update(status="preempted")
                _finish(run_dir, summary, tracker, t0)
                _all_ranks_stopped()  # rank 0's record is written before any rank leaves the job
                e.requeue()  # last: submitit requeues the job (SLURM then SIGTERMs its processes) and exits
            if isinstance(e, (KeyboardInterrupt, interrupts.Interrupted)):
                summary.update(status="interrupted", error=interrupts.describe(e))
                log.warning("run interrupted (%s): resume with `ablate resume %s`", summary["error"], run_dir)
                _finish(run_dir, summary, tracker, t0)
                raise
            cause = _user_error(e) or e
            msg = f"{type(cause).__name__}: {cause}".splitlines()[0] if str(cause) else type(cause).__name__
            summary.update(status="failed", error=msg)
            if cause is e and not isinstance(e, USER_ERRORS):  # a bug: keep the whole traceback in the log
                log.error("run failed: %s\n%s", msg, traceback.format_exc())
            else:  # one line for the user; the full cause (chained errors included) still goes to ablate.log
                _log_to_file(f"run failed: {msg}\n{traceback.format_exc()}")
                if hc.mode != RunMode.RUN:  # single runs print the one line themselves (main)
                    log.error("run failed: %s", msg)
            _finish(run_dir, summary, tracker, t0)
            raise
    _finish(run_dir, summary, tracker, t0)
    if rundir.is_main_process():
        _print_result(run_dir, summary)
    return summary


def _all_ranks_stopped() -> None:
    """A barrier over the job's ranks (several SLURM tasks, torchrun), if torch.distributed is up:
    ranks > 0 leave at once after a preemption (submitit requeues from rank 0 only), and with
    KillOnBadExit SLURM would end rank 0 before it recorded `preempted` and requeued."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def _resume_point(run_dir: Path) -> Path | None:
    """The newest complete checkpoint; newer incomplete or corrupt ones are named in one line each."""
    skipped: list[str] = []
    ckpt = rundir.latest_checkpoint(run_dir, skipped)
    for why in skipped:
        log.warning("skipping %s; resuming from %s", why, ckpt.name if ckpt else "the start")
    return ckpt


def _step(ckpt: Path | None) -> int:
    return int(ckpt.name.split("-")[-1]) if ckpt is not None else 0


def _finished(ckpt: Path) -> bool:
    """Whether `ckpt` was saved at the run's last step (Trainer records max_steps in its state)."""
    state = rundir.read_json(ckpt / "trainer_state.json") or {}
    return 0 < int(state.get("max_steps", 0)) <= int(state.get("global_step", 0))


def _train_loss(history: list[dict[str, Any]], global_step: int) -> float | None:
    """Mean per-step loss of the whole run, from its logged losses (each the mean over the steps
    since the previous log; `LogAtSaveAndEnd` makes the last log the last step and every checkpoint
    a log step). Trainer's own `train_loss` covers only the steps since a resume."""
    total, prev = 0.0, 0
    for event in history:
        if "loss" in event and "step" in event and event["step"] > prev:
            total += float(event["loss"]) * (event["step"] - prev)
            prev = event["step"]
    return total / prev if prev and prev == global_step else None


def _log_to_file(message: str) -> None:
    """Write `message` to the run's ablate.log only (not the console): the full cause of an error
    the user sees as one line."""
    record = log.makeRecord(log.name, logging.ERROR, __file__, 0, message, None, None)
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handle(record)


def _callbacks(cfg: DictConfig, run_dir: Path, tracker: Any) -> list[Any]:
    """ablate's own callbacks (metrics.jsonl, SLURM preemption), then the config's, then the tracker's."""
    from ablate.callbacks import LogAtSaveAndEnd, MaskSavedArgs, MetricsJSONL
    from ablate.preemption import SaveOnPreemption

    events = rundir.read_metrics(run_dir)  # already truncated to the resume point
    callbacks = [MetricsJSONL(run_dir / rundir.METRICS, time_offset=events[-1]["time"] if events else 0.0),
                 SaveOnPreemption(),  # SLURM USR2: checkpoint at this step's end, requeue (no-op elsewhere)
                 LogAtSaveAndEnd(),  # after SaveOnPreemption (it may ask for a save): resumes log the same windows
                 MaskSavedArgs()]  # secrets given as TrainingArguments never reach training_args.bin
    callbacks += [instantiate(c) for c in (cfg.callbacks or {}).values() if c is not None]
    if tracker is not None and tracker.callback() is not None:
        callbacks.append(tracker.callback())
    return callbacks


def _finish(run_dir: Path, summary: dict[str, Any], tracker: Any, t0: float) -> None:
    summary["train_runtime"] = summary.get("metrics", {}).get("train_runtime", round(time.time() - t0, 3))
    summary["wall_seconds"] = round(time.time() - t0, 3)
    rundir.write_json(run_dir / rundir.SUMMARY, summary)
    if tracker is not None:
        tracker.finish(summary["status"])


def _claim_run_dir(run_dir: Path, overrides: list[str]) -> dict[str, Any]:
    """Record (or check) the run's identity: a dir is resumed only by the same command; a dir that
    is neither empty nor an ablate run, or whose run.json is corrupt, is refused (RunDirError)."""
    rundir.is_usable(run_dir)
    info = rundir.read_json_checked(run_dir / rundir.RUN)
    if info is not None:
        if sorted(info.get("overrides", [])) != sorted(redact.mask(overrides)):  # recorded masked
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
    import os

    out: dict[str, Any] = {}
    dirs = [s.path for s in HydraConfig.get().runtime.config_sources if s.provider == "command-line"]
    if dirs:
        out["config_dir"] = str(Path(dirs[0].split("://", 1)[-1]).resolve())
    paths = [str(Path(p).resolve()) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if paths:
        out["pythonpath"] = paths
    return out


def _check_method_args(cfg: DictConfig) -> None:
    """Unknown `method.args` fields get a one-line error with a suggestion, before any model is built."""
    cls = get_class(cfg.method.args._target_)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = [k for k in cfg.method.args if k not in known and k != "_target_"]
    if unknown:
        hints = {k: difflib.get_close_matches(k, known, n=1) for k in unknown}
        hint = "; ".join(f"did you mean '{h[0]}' for '{k}'?" for k, h in hints.items() if h)
        raise ConfigError(f"method.args: unknown field(s) {unknown} for {cls.__name__}" + (f" ({hint})" if hint else ""))


def _check_precision(args: Any) -> dict[str, Any]:
    """`args`: the precision node (fp16 / tf32 flags), checked before any TrainingArguments exist.
    Returns extra TrainingArguments: bf16 on a machine without any accelerator trains on the CPU
    (`use_cpu`), where torch autocasts to bfloat16; transformers refuses bf16 there without it."""
    import torch
    from transformers.utils import is_torch_bf16_gpu_available

    if getattr(args, "fp16", False) and not torch.cuda.is_available():
        # accelerate silently ignores fp16 on CPU (no autocast, no scaler): refuse rather than pretend
        raise ConfigError("precision=fp16 needs a CUDA GPU (on CPU it would silently train in fp32); use precision=bf16 or fp32")
    if getattr(args, "tf32", None) and not torch.cuda.is_available():
        raise ConfigError("precision.tf32=true needs an Ampere or newer CUDA GPU; leave it null on CPU")
    if getattr(args, "bf16", False) and not is_torch_bf16_gpu_available():
        if _has_accelerator():  # never move a GPU run to the CPU behind the user's back
            raise ConfigError("precision=bf16 needs a GPU with bfloat16 support (CUDA: Ampere or newer); "
                              "use precision=fp32 (or fp16 on CUDA)")
        return {"use_cpu": True}
    return {}


def _has_accelerator() -> bool:
    """Any GPU-like device torch can use (CUDA, ROCm, MPS, XPU, ...)."""
    import torch

    accelerator = getattr(torch, "accelerator", None)  # torch >= 2.6
    if accelerator is not None:
        return bool(accelerator.is_available())
    return torch.cuda.is_available() or torch.backends.mps.is_available()


def _check_distributed(args: Any) -> None:
    """`args`: the distributed node. accelerate runs CPU processes as MULTI_CPU (DDP) whatever `fsdp`
    says: refuse rather than pretend the model is sharded."""
    import torch

    if getattr(args, "fsdp", False) and not torch.cuda.is_available():
        raise ConfigError("distributed=fsdp needs CUDA GPUs (on CPU accelerate would silently run plain DDP); "
                          "use distributed=ddp")


def _check_trainable(model: Any) -> None:
    """A quantized policy trains only through adapters (transformers refuses it deep in Trainer)."""
    if getattr(model, "is_quantized", False) and not hasattr(model, "peft_config"):
        raise ConfigError("the policy model is quantized (quantization_config) and has no trainable adapters; "
                          "add adapters (+peft=qlora), quantize only the reference (method.trainer.ref_model), "
                          "or load the policy unquantized")


def _check_trainer_class(cls: Any) -> None:
    """The optimizer group reaches a trainer only through ConfiguredOptimizer's hooks: a trainer
    without them would silently train with Trainer's default optimizer instead."""
    from ablate.trainers.optim import ConfiguredOptimizer

    if not (isinstance(cls, type) and issubclass(cls, ConfiguredOptimizer)):
        name = getattr(cls, "__qualname__", repr(cls))
        raise ConfigError(f"method.trainer._target_: {name} does not subclass ablate.trainers.optim.ConfiguredOptimizer, "
                          "so the optimizer group cannot reach it; subclass one of ablate's trainers or add "
                          "ConfiguredOptimizer as its first base")


def _final_metrics(history: list[dict[str, Any]]) -> dict[str, Any]:
    """The last logged value of every metric (train and eval_), plus Trainer's end-of-train stats."""
    out: dict[str, Any] = {}
    for event in history:
        out.update({k: v for k, v in event.items() if isinstance(v, (int, float)) and k != "step"})
    return out


def _print_result(run_dir: Path, summary: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{summary['method']} finished: {summary['status']} at step {summary.get('global_step')}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for k, v in sorted(summary.get("metrics", {}).items()):
        table.add_row(k, f"{v:.4g}" if isinstance(v, float) else str(v))
    Console().print(table)
    # plain print: rich would fold a long path at the terminal width (80 columns when piped) and
    # read `[...]` in it as markup; this line is meant to be pasted (ablate resume / compare)
    print(f"run dir: {run_dir}", flush=True)


def _training_args(cfg: DictConfig, run_dir: Path, device_args: dict[str, Any]) -> Any:
    """TrainingArguments from method.args; its own refusals (ValueError in __post_init__) are one line."""
    try:
        return instantiate(cfg.method.args, output_dir=str(run_dir / rundir.CHECKPOINTS),
                           **OmegaConf.to_container(cfg.precision), **device_args)
    except Exception as e:  # noqa: BLE001 - Hydra wraps the dataclass's ValueError/TypeError
        cause = e.__cause__ or e
        if isinstance(cause, ConfigError):  # the method's config already said what to fix
            raise cause from e
        if isinstance(cause, (ValueError, TypeError)):
            raise ConfigError(f"method.args: {str(cause).strip().splitlines()[0]}") from e
        raise
