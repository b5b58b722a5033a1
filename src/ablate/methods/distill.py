"""On-policy distillation on `transformers.Trainer` (GKD, Agarwal et al. 2024; TRL 1.16's
DistillationTrainer): the student samples a completion of each prompt, and learns the teacher's next-token
distribution at every token it sampled (the generalised JSD of ablate.losses.distill, `beta` from forward to
reverse KL).

The rollouts are GRPO's machinery (ablate.rollouts, looped by the base both trainers share,
ablate.methods.rollout.RolloutTrainer): prompts drawn by `RepeatSampler` (one completion per
prompt, TRL's n = 1), a generation round per optimizer step (the accumulation window's prompts sampled at
once, TRL's schedule: `Schedule` with steps_per_generation = gradient_accumulation_steps), served slice by
slice and saved mid-round with the checkpoints by `RolloutBuffer`, and GRPO's generators (the default
`SharedPromptGenerator`, or `method/rollouts=hf|vllm`). The teacher is `+teacher=NAME` (conf/teacher/: a
model dir, a config model, SmolLM2), else the method's default (the tiny task's scripted teacher); it must
share the student's vocabulary. The data's reward functions, when it has some, are logged (`reward`), not
trained on; `ablate eval` scores a run by them.

The loss of an accumulation window is the token mean over the window, as TRL's: TRL divides each micro-batch's
summed divergence by the window's completion tokens and tells Trainer not to divide again
(`loss_is_scaled_for_ga = True`); ablate divides by the window's tokens / accumulation steps and lets Trainer
divide by the steps (`loss_is_scaled_for_ga = False`): the same loss and gradients
(tests/parity/test_trl_distill.py, with accumulation).

Departures from TRL: full logits at the completion positions (TRL projects the hidden states in tiles, which
saves memory at large vocabularies, same numbers); the async worker of GRPO is not used; TRL shuffles a
round's completions before slicing it into micro-batches (the window's loss is the same; a per-micro-batch
mean such as `entropy` averages other slices).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from datasets import Dataset
from torch import nn
from transformers import PreTrainedModel, PreTrainedTokenizerBase, TrainingArguments

from ablate.errors import ConfigError
from ablate.losses import distill as distill_losses
from ablate.methods.fsdp import full_params
from ablate.methods.rollout import RolloutTrainer
from ablate.rewards import calls as rewards
from ablate.rollouts.buffer import Rollout
from ablate.rollouts.generation import as_completions, left_pad, right_pad, stop_ids
from ablate.rollouts.rewarding import reward_table
from ablate.rollouts.schedule import Schedule
from ablate.rollouts.stats import completion_metrics
from ablate.schema.grpo import DistillArgs
from ablate.speed.split import takes_logits_to_keep


@dataclass
class DistillConfig(DistillArgs, TrainingArguments):
    """`method.args`: TrainingArguments with the method's fields, defaults and checks
    (ablate.schema.grpo.DistillArgs)."""

    remove_unused_columns: bool = False  # reward functions receive every dataset column


class DistillTrainer(RolloutTrainer):
    """On-policy distillation from `teacher` (a model, or a builder returning (tokenizer, model))."""

    def __init__(
        self,
        model: PreTrainedModel,
        args: DistillConfig,
        train_dataset: Dataset | None,
        processing_class: PreTrainedTokenizerBase,
        teacher: Any = None,
        eval_dataset: Dataset | None = None,
        reward_funcs: dict[str, Callable[..., list[float | None]]] | None = None,
        generator: Any = None,
        **kwargs: Any,
    ) -> None:
        self.teacher = _built(teacher, model, processing_class)
        train_dataset, eval_dataset = self._prompt_splits(train_dataset, eval_dataset, processing_class, args)
        super().__init__(
            model=model,
            args=args,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            processing_class=processing_class,
            **kwargs,
        )
        self.teacher.to(self.args.device).eval().requires_grad_(False)
        self.generator = self._start_generator(generator, args)  # None: SharedPromptGenerator
        # one round per optimizer step, its micro-batches slices (TRL's)
        ga = args.gradient_accumulation_steps
        self._serve_rounds(
            Schedule(
                batch_size=args.train_batch_size, num_generations=1, steps_per_generation=ga, accumulation=ga
            )
        )
        # logged only; held to the data's columns
        self.reward_funcs = rewards.checked(reward_funcs, train_dataset)
        self._warned: set[str] = set()  # what the rewards said once (a round no function scored)

    # ---- one round of prompts per optimizer step (ablate.methods.rollout) ----

    def _generate_and_score(self, rows: list[dict[str, Any]], mode: str) -> Rollout:
        """The student's completions of `rows`' prompts, padded, with the round's counters and metrics."""
        t0 = time.perf_counter()
        prompt_ids = [r["prompt_ids"] for r in rows]
        with torch.no_grad(), full_params(self.accelerator.unwrap_model(self.model)) as whole:
            ids = as_completions(self.generator(whole, prompt_ids)).ids
        seconds = time.perf_counter() - t0
        pad_id = self.processing_class.pad_token_id
        (p_ids, p_mask), (c_ids, c_mask) = left_pad(prompt_ids, pad_id), right_pad(ids, pad_id)
        slices = self.schedule.steps_per_generation if mode == "train" else 1
        lengths = torch.tensor([len(c) for c in ids], dtype=torch.float32)
        stops = set(stop_ids(self.processing_class, self.accelerator.unwrap_model(self.model)))
        if mode == "train":
            stats = self.rollouts.stats
            stats.rounds, stats.generation_seconds = stats.rounds + 1, stats.generation_seconds + seconds
            stats.generated_tokens += int(lengths.sum())
            stats.num_tokens += sum(map(len, prompt_ids)) + int(lengths.sum())
        # TRL's completions/*
        metrics = completion_metrics(lengths.tolist(), [not c or c[-1] not in stops for c in ids])
        metrics["num_tokens"] = float(self.rollouts.stats.num_tokens)
        if self.reward_funcs:  # logged only: what the task's reward says of the student's samples
            table = reward_table(self.reward_funcs, self.processing_class, rows, ids, self._warned)
            metrics |= {"reward": torch.nanmean(table.nansum(dim=1))}
            metrics |= {
                f"rewards/{f}/mean": torch.nanmean(table[:, i]) for i, f in enumerate(self.reward_funcs)
            }
        self.metrics.add(mode, metrics)
        device = self.args.device
        return Rollout(
            prompt_ids=p_ids.to(device),
            prompt_mask=p_mask.to(device),
            completion_ids=c_ids.to(device),
            completion_mask=c_mask.to(device),
            num_items=c_mask.sum().float() / slices,
            policy_version=self.state.global_step,
        )

    # ---- loss ----

    def _completion_logits(self, model: nn.Module, batch: Rollout) -> torch.Tensor:
        """`model`'s next-token logits (B, T, V) at the completion's tokens (position ids as generate sets
        them)."""
        input_ids = torch.cat([batch.prompt_ids, batch.completion_ids], dim=1)
        attention_mask = torch.cat([batch.prompt_mask, batch.completion_mask], dim=1)
        n = batch.completion_ids.size(1)
        keep = {"logits_to_keep": n + 1} if takes_logits_to_keep(self.accelerator.unwrap_model(model)) else {}
        out = model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            use_cache=False,
            position_ids=(attention_mask.cumsum(-1) - 1).clamp(min=0),
            **keep,
        )
        return out.logits[:, -n - 1 : -1]

    def compute_loss(
        self, model: nn.Module, inputs: Rollout, return_outputs: bool = False, num_items_in_batch: Any = None
    ) -> torch.Tensor:
        mode = "train" if model.training else "eval"
        student = self._completion_logits(model, inputs)
        with torch.no_grad():
            teacher = self._completion_logits(self.teacher, inputs)
        loss, metrics = distill_losses.distillation(
            student,
            teacher,
            inputs.completion_mask,
            beta=self.args.beta,
            temperature=self.args.temperature,
            num_items=float(inputs.num_items),
        )
        self.metrics.add(mode, metrics)
        return loss


def _built(teacher: Any, student: nn.Module, tokenizer: PreTrainedTokenizerBase) -> nn.Module:
    """The teacher model from what the config gives (a builder's partial or its (tokenizer, model)), checked
    to be a causal LM sharing the student's vocabulary: the divergence compares whole next-token
    distributions, id by id, so the same size is not enough (the token behind each id must be the same)."""
    if teacher is None:
        raise ConfigError(
            "method=distill needs a teacher: +teacher=local teacher.path=DIR (a model dir, e.g. a "
            "finished run's model/), +teacher=tiny, or +teacher=smollm2_135m (conf/teacher/)"
        )
    try:
        built = teacher() if callable(teacher) and not isinstance(teacher, nn.Module) else teacher
    except ConfigError as e:  # ablate.models' loaders name the policy's key; this is the teacher's
        raise ConfigError(
            str(e)
            .replace("model=local model.path=", "+teacher=local teacher.path=")
            .replace("model.path", "teacher.path", 1)
        ) from e
    model = built[1] if isinstance(built, tuple) else built
    if type(model).__name__.endswith("ForSequenceClassification"):
        raise ConfigError(
            f"teacher: a {type(model).__name__} (a reward model), not a causal LM: distillation learns "
            "the teacher's next-token distribution; give a causal LM's dir"
        )
    theirs, ours = model.config.vocab_size, student.config.vocab_size
    if theirs != ours:
        raise ConfigError(
            f"teacher: its vocabulary has {theirs} tokens, the student's {ours}; distillation compares "
            "next-token distributions, so they must share a tokenizer (e.g. model=smollm2_135m "
            "with +teacher=smollm2_135m or a run of it)"
        )
    if isinstance(built, tuple):
        _same_vocabulary(built[0], tokenizer)
    return model


def _same_vocabulary(teacher: PreTrainedTokenizerBase, student: PreTrainedTokenizerBase) -> None:
    """ConfigError unless both tokenizers map the same tokens to the same ids (get_vocab(), added tokens
    included)."""
    theirs, ours = teacher.get_vocab(), student.get_vocab()
    if theirs == ours:
        return
    moved = next((t for t in sorted(ours, key=ours.get) if t in theirs and theirs[t] != ours[t]), None)
    if moved is not None and set(theirs) == set(ours):
        raise ConfigError(
            f"teacher: its tokenizer has the student's {len(ours)} tokens under other ids ({moved!r} is "
            f"{theirs[moved]} there, {ours[moved]} here); distillation compares next-token "
            "distributions id by id, so they must share a tokenizer (the student's model and its teacher "
            "from one family, e.g. model=smollm2_135m with +teacher=smollm2_135m or a run of it)"
        )
    missing = next((t for t in sorted(ours, key=ours.get) if t not in theirs or theirs[t] != ours[t]), None)
    if missing is None:  # the student's tokens all under the same ids, the teacher's vocabulary a superset
        return
    raise ConfigError(
        f"teacher: its tokenizer is not the student's ({missing!r}, id {ours[missing]} here, is "
        f"{'not in it' if missing not in theirs else f'id {theirs[missing]} there'}); distillation "
        "compares next-token distributions id by id, so they must share a tokenizer"
    )
