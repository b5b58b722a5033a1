"""One run: compose -> build -> train -> save; wiring only (torch imported in `run`: `--cfg job` is fast)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from ablate.config import checks, code_checks, machine
from ablate.errors import ConfigError, user_error
from ablate.process import interrupts, setup
from ablate.process.console import say
from ablate.record import checkpoints, lifecycle, rundir, secrets
from ablate.schema.method import MethodSpec

log = logging.getLogger("ablate")


def main(cfg: DictConfig) -> dict[str, Any]:
    """The Hydra task. A user error in a single run is one line on stderr and exit code 2; in a
    multirun it is raised, so Hydra records the job as failed and the sweep goes on."""
    try:
        return run(cfg)
    except (KeyboardInterrupt, interrupts.Interrupted) as e:  # recorded as `interrupted` by the lifecycle
        if interrupts.in_sweep_worker():  # the sweep's parent says it, once for the sweep
            interrupts.leave_worker(interrupts.exit_code(e))
        say(checkpoints.interrupted_line(HydraConfig.get(), interrupts.describe(e)))  # below the bar
        sys.exit(interrupts.exit_code(e))
    except Exception as e:
        if user_error(e) is not None and HydraConfig.get().mode == RunMode.RUN:
            say(f"ablate: error: {secrets.mask_text(str(user_error(e)))}")  # below the progress bar
            sys.exit(2)
        raise


def run(cfg: DictConfig) -> dict[str, Any]:
    """Train one run in Hydra's output dir (always leave a summary.json), evaluate it; return the summary."""
    setup.export_torch_distributed()  # a SLURM job of several tasks is one DDP run, as under torchrun
    with setup.process_group_left(), lifecycle.record(cfg) as record:  # the group outlives the record
        if not record.done:
            checks.check(cfg)  # a single run was checked before its dir existed; a sweep job is here
            code_checks.check_code(cfg, processes=machine.job_processes())
            record.prepare(cfg)  # threads, tags, pid -> run.json; the gloo group's timeout
            trainer, speed = build(cfg, record)
            fit(trainer, record.resume_point())
            save(trainer, record.dir, cfg)
            record.complete(trainer, getattr(trainer, "summary_fields", dict)(), speed.summary_fields())
            record.trained = None if trainer.is_fsdp_enabled else (trainer.processing_class, trainer.model)
            del trainer, speed  # eval=[...]: the model as trained (FSDP's shards: as saved), optimizer freed
    lifecycle.finished(cfg, record, machine.check_precision)  # its device args, if it evaluates
    return record.summary


def build(cfg: DictConfig, record: lifecycle.Run) -> tuple[Any, Any]:
    """The trainer from the config's groups, the throughput callback first (its numbers reach every log)."""
    from transformers import set_seed

    from ablate.data.formats import check_shape
    from ablate.models.adapters import with_adapters, with_head  # with_head: ablate.models.heads'
    from ablate.process import progress
    from ablate.record.callbacks import run_callbacks
    from ablate.speed.throughput import ThroughputCallback

    set_seed(cfg.seed)
    args = training_args(cfg, record.dir)
    make_trainer = instantiate(cfg.method.trainer)  # a partial: a bad loss `_target_` fails before the model
    code_checks.check_trainer_class(getattr(make_trainer, "func", make_trainer))
    data = instantiate(cfg.data)  # before the model: a data mistake (a file, its rows) costs no model load
    record.check_data(data)  # a resume on data edited since the run started is refused
    record.note(**({"data_mix": data.mix} if getattr(data, "mix", None) else {}))  # data=mix: its sources
    eval_data = data.eval if args.eval_strategy != "no" else None
    spec = MethodSpec.of(cfg.method)  # data_format: how `ablate generate` formats prompts
    record.note(data_format=check_shape(spec.data_kind, data.train, eval_data, method=spec.name))
    tokenizer, model = instantiate(cfg.model)
    model = with_adapters(with_head(model, cfg.method), cfg.get("peft"))  # reward's score head; +peft=lora
    code_checks.check_trainable(model)
    record.start_tracker(cfg)
    # partials the trainer calls (AblateTrainer.create_optimizer / create_scheduler)
    optimizer = {f"{k}_factory": instantiate(cfg.optimizer[k]) for k in ("optimizer", "scheduler")}
    trainer = make_trainer(
        model=model,
        args=args,
        train_dataset=data.train,
        processing_class=tokenizer,
        eval_dataset=eval_data,
        callbacks=run_callbacks(cfg, record),
        **optimizer,
        sequence_parallel=cfg.distributed.get("sequence_parallel", 1),  # ranks per sequence: speed.ulysses
    )
    record.add_trainer_facts(trainer)  # speed plan (which paths run, and why; also W&B), cache hits: run.json
    speed = ThroughputCallback(trainer, peak_tflops=cfg.get("peak_tflops"))
    trainer.callback_handler.callbacks.insert(0, speed)
    progress.install(trainer, spec.compare_metrics)  # one bar with the key metrics
    return trainer, speed


def training_args(cfg: DictConfig, run_dir: Path) -> Any:
    """TrainingArguments from method.args, with the precision and distributed groups' values as
    explicit kwargs (checked first: TrainingArguments raises a page on, e.g., tf32 without a GPU);
    its own refusals (ValueError in __post_init__) are one line."""
    device_args = {
        **machine.check_precision(cfg.precision),
        **machine.check_distributed(cfg.distributed, machine.job_processes()),
    }
    out = str(run_dir / rundir.CHECKPOINTS)
    try:
        return instantiate(
            cfg.method.args, output_dir=out, **OmegaConf.to_container(cfg.precision), **device_args
        )
    except Exception as e:  # Hydra wraps the dataclass's ValueError/TypeError
        cause = e.__cause__ or e
        # the method's config said what to fix (a new error: `raise cause from e` would loop e's cause chain)
        if isinstance(cause, ConfigError):
            raise ConfigError(str(cause)) from e
        if isinstance(cause, (ValueError, TypeError)):
            raise ConfigError(f"method.args: {str(cause).strip().splitlines()[0]}") from e
        raise


def fit(trainer: Any, ckpt: Path | None) -> None:
    """Train, from `ckpt` when resuming. A final checkpoint (killed between it and summary.json) is
    only loaded: training is done, and resuming from it would train one step past max_steps."""
    if ckpt is not None and lifecycle.is_final(ckpt):
        log.info("%s is the final checkpoint: saving the model without training further", ckpt.name)
        trainer._load_from_checkpoint(str(ckpt))  # pinned by tests/unit/test_trainer_private_api.py
        trainer.state = type(trainer.state).load_from_json(str(ckpt / "trainer_state.json"))
        return
    if ckpt is not None:
        log.info("resuming from %s", ckpt)
    trainer.train(resume_from_checkpoint=str(ckpt) if ckpt else None)


def save(trainer: Any, run_dir: Path, cfg: DictConfig) -> None:
    """run_dir/model: a plain from_pretrained dir (secrets masked in its training_args.bin)."""
    if trainer.is_world_process_zero() or trainer.is_fsdp_enabled:  # FSDP: a collective, rank 0 writes
        trainer.save_model(str(run_dir / rundir.MODEL))
    if not trainer.is_world_process_zero():
        return
    from ablate.models.adapters import save_merged
    from ablate.record.callbacks import mask_saved_args

    mask_saved_args(run_dir / rundir.MODEL, trainer.args)  # as SealCheckpoint does for checkpoints
    save_merged(trainer, run_dir / rundir.MODEL, cfg)  # with peft.save_merged=true
    rundir.fix_permissions(run_dir / rundir.MODEL)
