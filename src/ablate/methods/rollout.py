"""`RolloutTrainer`: the one base of the trainers that sample their own training data (GRPO, RLOO,
on-policy distillation). It owns the round loop; a method supplies how one round is made
(`_generate_and_score`) and what its loss is.

The loop (ablate.rollouts): the train dataloader yields a round's prompts, each repeated
`schedule.num_generations` times, once for every micro-step the round serves (RepeatSampler);
`_prepare_inputs` makes the round on the first of those micro-steps and the `RolloutBuffer` serves
slice k at micro-step k. A checkpoint holds the round being served and the generation counters
(and, with async GRPO, the rounds a worker sampled ahead, `ahead`), so a resume serves the rest
instead of regenerating; the counters reach summary.json (`summary_fields`) and the throughput
callback (`rollout_stats`).
"""

from __future__ import annotations

import os
from abc import ABCMeta, abstractmethod
from collections.abc import Callable
from typing import Any

import torch
from datasets import Dataset
from torch import nn
from torch.utils.data import Sampler
from transformers import PreTrainedTokenizerBase, TrainerCallback

from ablate.methods.base import AblateTrainer
from ablate.rollouts.ahead import AheadRounds
from ablate.rollouts.buffer import Rollout, RolloutBuffer
from ablate.rollouts.generation import build_generator
from ablate.rollouts.prompts import Cut, cuts_record, longest_row, prompt_rows
from ablate.rollouts.sampler import RepeatSampler
from ablate.rollouts.schedule import Schedule
from ablate.rollouts.stats import RolloutStats


def _rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Collator: keep the rows as they are; `_prepare_inputs` turns prompts into completions."""
    return rows


class RolloutTrainer(AblateTrainer, metaclass=ABCMeta):
    """Trains on rounds it samples itself, served slice by slice (`schedule`, `rollouts`).

    A subclass calls `_prompt_splits` before this `__init__` and `_serve_rounds` after it, and defines
    `_generate_and_score(rows, mode)`: the padded round of `rows`' prompts, its counters and metrics
    recorded."""

    loss_is_scaled_for_ga = False  # Trainer divides each micro-batch's loss by the accumulation steps
    ahead: AheadRounds | None = None  # rounds sampled ahead by a worker process (async GRPO)
    schedule: Schedule
    rollouts: RolloutBuffer

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, data_collator=_rows, **kwargs)

    # ---- prompts, the generator, the schedule ----

    def _prompt_splits(
        self,
        train_dataset: Dataset | None,
        eval_dataset: Dataset | None,
        tokenizer: PreTrainedTokenizerBase,
        args: Any,
    ) -> tuple[Dataset | None, Dataset | None]:
        """Both splits with `prompt_ids` (None stays None: evaluation only, or no eval split)."""
        self.prompt_cuts: dict[str, Cut] = {}  # what max_prompt_length cut, per split (run.json: run_facts)
        if train_dataset is not None:
            train_dataset = self._prepare_dataset(train_dataset, tokenizer, args, "train")
        if eval_dataset is not None:
            eval_dataset = self._prepare_dataset(eval_dataset, tokenizer, args, "eval")
        return train_dataset, eval_dataset

    def _prepare_dataset(
        self, dataset: Dataset, tokenizer: PreTrainedTokenizerBase, args: Any, name: str
    ) -> Dataset:
        """Add `prompt_ids` (whole prompts, as TRL; the last `max_prompt_length` tokens when it is set; with
        GRPO's tools, the prompt offers them); other columns go to the rewards."""
        dataset, self.prompt_cuts[name] = prompt_rows(
            dataset, tokenizer, args.max_prompt_length, name, encode=self._prompt_encoder()
        )
        return dataset

    def _prompt_encoder(self) -> Callable[..., list[int]] | None:
        """How a row becomes its prompt's ids (prompt_rows' `encode`); None: ablate.data.tokenize's own."""
        return None

    def _longest_row(self, a: Any) -> int | None:
        return longest_row(self.prompt_cuts, a.max_prompt_length, a.max_completion_length)

    def _start_generator(self, generator: Any, args: Any) -> Any:
        """The sampling engine (ablate.rollouts.generation.build_generator; None: SharedPromptGenerator),
        registered as a callback when it needs the policy's steps (vLLM: weight pushes)."""
        built = build_generator(generator, args, self.processing_class, self._longest_row(args))
        if isinstance(built, TrainerCallback):
            self.add_callback(built)
        return built

    def _serve_rounds(self, schedule: Schedule) -> None:
        self.schedule = schedule  # the one reader of steps_per_generation / num_iterations
        self.rollouts = RolloutBuffer(schedule)  # the round being served, its schedule position, the counters

    def run_facts(self) -> dict[str, Any]:
        """For run.json: how many prompts max_prompt_length cut, per split."""
        return {"prompts_cut": cuts_record(self.args.max_prompt_length, self.prompt_cuts)}

    # ---- batching: one round, served by the buffer as `steps_per_generation` slices ----

    def get_train_dataloader(self) -> torch.utils.data.DataLoader:
        return self._get_dataloader(
            dataset=self.train_dataset,
            description="Training",
            batch_size=self.schedule.round_size,  # a whole generation round
            sampler_fn=self._get_train_sampler,
            is_training=True,
        )

    def _get_train_sampler(self, dataset: Dataset | None = None) -> Sampler[int]:
        dataset = self.train_dataset if dataset is None else dataset
        s = self.schedule
        seed = self.args.data_seed if self.args.data_seed is not None else self.args.seed
        # each round's prompts again for every micro-step it serves (Trainer skips what a resume has done)
        prompts = s.round_size // s.num_generations
        ranks = self.accelerator.num_processes  # each rank its own slice of every chunk (RepeatSampler)
        return RepeatSampler(dataset, s.num_generations, prompts, s.micro_steps_per_round, seed, ranks)

    def training_step(
        self,
        model: nn.Module,
        inputs: list[dict[str, Any]],
        num_items_in_batch: torch.Tensor | int | None = None,
    ) -> torch.Tensor:
        self.rollouts.start(self.state.global_step)  # this process's first step: after a resume, continue
        loss = super().training_step(model, inputs, num_items_in_batch)
        self.rollouts.advance()
        return loss

    def _prepare_inputs(self, inputs: list[dict[str, Any]]) -> Rollout:
        if not self.model.training:  # eval: one batch, sampled and scored on the spot
            return self._generate_and_score(inputs, "eval")
        if self.rollouts.needs_round():  # the rows are this round's prompts (RepeatSampler)
            self.rollouts.put(self._train_round(inputs))
        return self.rollouts.serve()

    def _train_round(self, rows: list[dict[str, Any]]) -> Rollout:
        """The training round of `rows`' prompts (async GRPO: the one its worker sampled)."""
        return self._generate_and_score(rows, "train")

    @abstractmethod
    def _generate_and_score(self, rows: list[dict[str, Any]], mode: str) -> Rollout:
        """The method's own part of a round, which each subclass defines (GRPO: sample and reward;
        distillation: sample and score by the teacher); the base only serves and checkpoints rounds."""

    def prediction_step(
        self,
        model: nn.Module,
        inputs: list[dict[str, Any]],
        prediction_loss_only: bool,
        ignore_keys: list[str] | None = None,
    ) -> tuple[torch.Tensor, None, None]:
        """Eval rows have no `labels`: sample, score, and report the loss and the round's metrics."""
        inputs = self._prepare_inputs(inputs)
        with torch.no_grad(), self.compute_loss_context_manager():
            loss = self.compute_loss(model, inputs)
        return loss.detach(), None, None

    # ---- the run: the engine closed, the rounds checkpointed and reported ----

    def train(self, *args: Any, **kwargs: Any) -> Any:
        """Trainer.train; however it ends, the async worker stops and an engine (vLLM) closes."""
        try:
            return super().train(*args, **kwargs)
        finally:
            try:
                if self.ahead is not None:
                    self.ahead.close()
            finally:
                close = getattr(self.generator, "close", None)
                if close is not None:
                    close()

    def _save_checkpoint(self, model: nn.Module, trial: Any) -> None:
        """Save the rollout buffer with the checkpoint: its counters, so a resumed run's summary counts the
        rounds and seconds before the resume too, and a round saved mid-way (ablate.rollouts.buffer).
        Written before Trainer's files: trainer_state.json comes last and marks the checkpoint complete."""
        if self.args.should_save:
            folder = os.path.join(self.args.output_dir, f"checkpoint-{self.state.global_step}")
            os.makedirs(folder, exist_ok=True)
            self.rollouts.save(folder)
            if self.ahead is not None:  # the rounds sampled ahead, awaited (ablate.rollouts.ahead)
                self.ahead.save(folder)
        super()._save_checkpoint(model, trial)

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: nn.Module | None = None) -> None:
        super()._load_from_checkpoint(resume_from_checkpoint, model)
        # mid-round: serve the rest, do not regenerate
        self.rollouts.load(resume_from_checkpoint, self.args.device)
        if self.ahead is not None:
            self.ahead.load(resume_from_checkpoint)  # the rounds sampled ahead: served, not sampled again

    def rollout_stats(self) -> RolloutStats:
        """The generation counters (ablate.rollouts.stats.ReportsRollouts), read by speed.throughput."""
        return self.rollouts.stats

    def summary_fields(self) -> dict[str, Any]:
        """For summary.json: what `steps_per_generation` buys (rounds and seconds, resumes included)."""
        stats = self.rollouts.stats
        fields = {"generation_rounds": stats.rounds, "generation_seconds": round(stats.generation_seconds, 3)}
        if self.ahead is not None:  # async: generation_seconds is the trainer's wait; this, the worker's time
            fields["background_generation_seconds"] = round(stats.background_seconds, 3)
        engine = self.generator
        if getattr(engine, "gathers_weights", False):  # an engine of its own (vLLM): the weights pushed to it
            fields["engine_pushes"] = engine.pushes  # this process's, since its start (a resume counts anew)
            fields["engine_push_seconds"] = round(engine.push_seconds, 3)
            if engine.verify_push:
                fields["engine_pushes_verified"] = engine.verified
        return fields
