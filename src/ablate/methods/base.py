"""`AblateTrainer`: the one base every ablate trainer has on `transformers.Trainer`, holding the hooks
they all share; a method's trainer subclasses it (the rollout methods through
ablate.methods.rollout.RolloutTrainer) and only wires its data, model and loss.

- Optimizer and schedule from config (`conf/optimizer/*.yaml`): Trainer builds them in
  `create_optimizer` / `create_scheduler`, at the moment that is right for the setup (after DDP
  wrapping, on the sharded parameters under FSDP, where it refuses ready-made ones through
  `optimizers=`; with the real number of optimizer steps; before a resume loads their state). Only those
  two hooks change: they call the config's `_partial_`s instead of Trainer's `args.optim` /
  `lr_scheduler_type` defaults (ablate.methods.optim: the factories and the toy-lr warning).
- Metrics: `compute_loss` fills `self.metrics` (ablate.methods.metrics.MetricsBuffer) per micro-batch;
  every log event gets the averages since the previous one (train or eval, by the model's mode), averaged over
  the ranks of a multi-process run.
- FSDP2 on CPU ranks and a whole `model/` under sharding (ablate.methods.fsdp).
- A resume of a tied-embedding model kept quiet (`_issue_warnings_after_load`).
- Sequence parallelism (`distributed.sequence_parallel=N`, ablate.speed.ulysses): the ranks of a
  sequence group draw the same batches, and the policy's decoder is split over them when training starts
  (after a method has copied it for a reference: the copy stays whole).

A user's trainer written from scratch subclasses it too: the optimizer group reaches a trainer only
through these hooks (ablate.config.code_checks.check_trainer_class refuses one without them).
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn
from transformers import Trainer

from ablate.methods import fsdp
from ablate.methods.metrics import MetricsBuffer, over_ranks
from ablate.methods.optim import OptimizerFactory, SchedulerFactory, warn_if_toy_lr
from ablate.speed import ulysses

log = logging.getLogger("ablate")


class AblateTrainer(Trainer):
    """A Trainer whose optimizer is `optimizer_factory(trainable_parameters)` and whose schedule is
    `scheduler_factory(optimizer, num_training_steps=N)` (either left None keeps Trainer's default),
    whose logs carry `self.metrics`, and that shards on CPU ranks as on GPUs."""

    def __init__(
        self,
        *args: Any,
        optimizer_factory: OptimizerFactory | None = None,
        scheduler_factory: SchedulerFactory | None = None,
        sequence_parallel: int = 1,
        **kwargs: Any,
    ) -> None:
        self.optimizer_factory = optimizer_factory
        self.scheduler_factory = scheduler_factory
        self.metrics = MetricsBuffer()  # per-mode values since the last log, filled by compute_loss
        # distributed.sequence_parallel: this rank's sequence group (None: every rank its own sequences)
        self.sequence_mesh: ulysses.Mesh | None = None
        self.sequence_split: ulysses.Ulysses | None = None
        if sequence_parallel > 1:
            ulysses.check(kwargs.get("model", args[0] if args else None), sequence_parallel)
            self.sequence_mesh = ulysses.Mesh.of(sequence_parallel)
        super().__init__(*args, **kwargs)

    # ---- the optimizer group (ablate.methods.optim) ----

    def create_optimizer(self, model: nn.Module | None = None) -> torch.optim.Optimizer:
        """`model`: the model Trainer prepared (FSDP1 passes the wrapped one); else `self.model`."""
        if self.optimizer is None and self.optimizer_factory is not None:
            opt_model = self.model if model is None else model
            # one group of every trainable parameter: the config's weight_decay applies to all of them
            self.optimizer = self.optimizer_factory([p for p in opt_model.parameters() if p.requires_grad])
            warn_if_toy_lr(opt_model, self.optimizer)
        return super().create_optimizer(model)  # with the optimizer set: only Trainer's platform wrapping

    def create_scheduler(
        self, num_training_steps: int, optimizer: torch.optim.Optimizer | None = None
    ) -> torch.optim.lr_scheduler.LRScheduler:
        """`num_training_steps`: the optimizer steps Trainer will run (max_steps or from the epochs)."""
        if self.lr_scheduler is None and self.scheduler_factory is not None:
            self.lr_scheduler = self.scheduler_factory(
                optimizer or self.optimizer, num_training_steps=num_training_steps
            )
            self._created_lr_scheduler = True  # as Trainer's own: a second train() builds it again
        return super().create_scheduler(num_training_steps, optimizer)

    # ---- metrics (ablate.methods.metrics) ----

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """Trainer logs on every rank at once; the metrics are each rank's averages, averaged over the
        ranks (as TRL gathers them): a multi-process run logs what one process of the same global batch
        logs."""
        metrics = self.metrics.pop("train" if self.model.training else "eval")
        logs.update(over_ranks(metrics) if self.args.world_size > 1 else metrics)
        super().log(logs, start_time)

    # ---- distributed.sequence_parallel (ablate.speed.ulysses) ----

    def _get_dataloader(
        self,
        dataset: Any,
        description: str,
        batch_size: int,
        sampler_fn: Any = None,
        is_training: bool = False,
        dataloader_key: str | None = None,
    ) -> Any:
        """Trainer's loader; under sequence parallelism sharded over the sequence groups, not the ranks."""
        loader = super()._get_dataloader(
            dataset, description, batch_size, sampler_fn, is_training, dataloader_key
        )
        return loader if self.sequence_mesh is None else self.sequence_mesh.share_batches(loader)

    def train(self, *args: Any, **kwargs: Any) -> Any:
        """Trainer.train, the policy's decoder split over its sequence group first."""
        if self.sequence_mesh is None:
            return super().train(*args, **kwargs)
        if self.sequence_split is None:
            ulysses.check_trainer(self)
            self.sequence_split = ulysses.Ulysses(
                self.accelerator.unwrap_model(self.model), self.sequence_mesh
            )
            log.info(self.sequence_split.describe())
        try:
            return super().train(*args, **kwargs)
        finally:
            split = self.sequence_split
            log.info(
                "sequence parallelism: %d forwards split (%d scored on each rank's own positions)",
                split.forwards,
                split.scored_forwards,
            )

    # ---- distributed=fsdp (ablate.methods.fsdp) ----

    def create_accelerator_and_postprocess(self) -> None:
        super().create_accelerator_and_postprocess()  # runs in Trainer.__init__, before anything is prepared
        if fsdp.shard_on_cpu(self.accelerator.state, self.args.fsdp_plugin_args):
            # Trainer's own flag, read from here on (the optimizer before prepare, save)
            self.is_fsdp_enabled = True

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """`model/` (Trainer's save_model outside a checkpoint) is a plain from_pretrained dir under
        SHARDED_STATE_DICT too: the whole model gathered once (a collective: every rank calls it), rank 0
        writes it. Trainer writes nothing there when sharded; checkpoints (`_internal_call`) stay sharded,
        each rank writing its own DCP shards (accelerate's save_fsdp_model / save_fsdp_optimizer)."""
        state = self.accelerator.state
        sharded = self.is_fsdp_enabled and "SHARDED" in str(state.fsdp_plugin.state_dict_type)
        if _internal_call or not sharded:
            return super().save_model(output_dir, _internal_call)
        self._save(output_dir or self.args.output_dir, state_dict=self.accelerator.get_state_dict(self.model))

    # ---- resume ----

    def _issue_warnings_after_load(self, load_result: Any) -> None:
        """Resuming a model whose lm_head is tied to its input embedding (the tiny model, SmolLM2) loads a
        checkpoint without `lm_head.weight` (safetensors stores a shared tensor once), and Trainer warns
        "There were missing keys in the checkpoint model loaded: ['lm_head.weight']" though nothing is
        missing. Keys tied to a loaded one are tied again here, not reported; any other key still is."""
        model = self.accelerator.unwrap_model(self.model)
        tied = getattr(model, "all_tied_weights_keys", None) or {}
        missing = [k for k in load_result.missing_keys if k not in tied]
        if len(missing) < len(load_result.missing_keys):
            model.tie_weights()
        super()._issue_warnings_after_load(type(load_result)(missing, load_result.unexpected_keys))
