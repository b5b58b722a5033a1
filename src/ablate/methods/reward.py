"""Reward modelling on `transformers.Trainer`: a sequence classifier (one output) scores the chosen and the
rejected sequence of each preference pair; the Bradley-Terry loss (ablate.losses.reward) pushes the
chosen score above the rejected one.

As TRL 1.16's RewardTrainer: the model is the policy's backbone under a new score head
(`method.model_head`, ablate.models.heads.score_head, applied by ablate.train before any adapters; with
`+peft=lora` the head trains in full, peft's SEQ_CLS task), each side is prompt + completion as one
sequence (ablate.data.reward), one forward over `[chosen; rejected]`, the optional `margin` column and
`center_rewards_coefficient`, and TRL's metric names (`accuracy`, `margin`, `mean_reward`, `min_reward`,
`max_reward`, `num_tokens`). The run's `model/` is a plain `AutoModelForSequenceClassification` dir.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from datasets import Dataset
from torch import nn
from transformers import PreTrainedModel, PreTrainedTokenizerBase, TrainingArguments

from ablate.data import cache as reuse
from ablate.data.reward import prepare_reward
from ablate.data.tokenize import pad
from ablate.errors import ConfigError
from ablate.losses import reward as reward_losses
from ablate.methods.base import AblateTrainer
from ablate.models.heads import is_classifier
from ablate.schema.args import RewardArgs


@dataclass
class RewardConfig(RewardArgs, TrainingArguments):
    """`method.args`: TrainingArguments with the method's fields, defaults and checks
    (ablate.schema.args.RewardArgs)."""

    remove_unused_columns: bool = False  # the collator needs the tokenised columns Trainer cannot see


class RewardCollator:
    """Right-pads a list of pairs into one batch: rows 0..B-1 chosen, B..2B-1 rejected (TRL's layout), and
    `margin` (B,) when the rows have one."""

    def __init__(self, pad_token_id: int) -> None:
        self.pad_token_id = pad_token_id

    def __call__(self, rows: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        seqs = [r["chosen_ids"] for r in rows] + [r["rejected_ids"] for r in rows]
        batch = {
            "input_ids": pad(seqs, self.pad_token_id),
            "attention_mask": pad([[1] * len(s) for s in seqs], 0),
        }
        if "margin" in rows[0]:
            batch["margin"] = torch.tensor([r["margin"] for r in rows], dtype=torch.float32)
        return batch


class RewardTrainer(AblateTrainer):
    """Bradley-Terry reward modelling with the loss given as `loss` (ablate.losses.reward's signature)."""

    def __init__(
        self,
        model: PreTrainedModel,
        args: RewardConfig,
        train_dataset: Dataset | None,
        processing_class: PreTrainedTokenizerBase,
        eval_dataset: Dataset | None = None,
        data_collator: Callable | None = None,
        loss: Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]] = reward_losses.bradley_terry,
        cache: reuse.Cache | None = None,
        **kwargs: Any,
    ) -> None:
        if not is_classifier(model):
            raise ConfigError(
                "method=reward needs a sequence classifier: method.model_head (a score head on the "
                "model's backbone) is unset"
            )
        # the score is read at the last non-pad token
        model.config.pad_token_id = processing_class.pad_token_id
        self.cache = cache or reuse.Cache(enabled=False)  # tokenized pairs (ablate.data.cache)
        if train_dataset is not None:  # None: evaluation only (`ablate eval`)
            train_dataset = self._prepare_dataset(train_dataset, processing_class, args, "train")
        if eval_dataset is not None:
            eval_dataset = self._prepare_dataset(eval_dataset, processing_class, args, "eval")
        super().__init__(
            model=model,
            args=args,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            data_collator=data_collator or RewardCollator(processing_class.pad_token_id),
            processing_class=processing_class,
            **kwargs,
        )
        self.loss_fn = loss
        self.num_tokens = 0

    def _prepare_dataset(
        self, dataset: Dataset, tokenizer: PreTrainedTokenizerBase, args: RewardConfig, name: str
    ) -> Dataset:
        """Any preference format -> chosen_ids / rejected_ids (+ margin); already tokenised rows as they
        are."""
        if {"chosen_ids", "rejected_ids"} <= set(dataset.column_names):
            return dataset
        return self.cache.dataset(
            "tokenized",
            f"tokenized {name} pairs",
            lambda: reuse.tokenized_key(dataset, tokenizer, type(self), {"max_length": args.max_length}),
            lambda: prepare_reward(dataset, tokenizer, args.max_length, name),
        )

    def compute_loss(
        self,
        model: nn.Module,
        inputs: dict[str, torch.Tensor],
        return_outputs: bool = False,
        num_items_in_batch: torch.Tensor | int | None = None,
    ) -> Any:
        mode = "train" if model.training else "eval"
        outputs = model(
            input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"], use_cache=False
        )
        r_c, r_r = outputs.logits.squeeze(-1).float().chunk(2)  # the batch is [chosen; rejected]
        losses, own = self.loss_fn(
            r_c, r_r, inputs.get("margin"), center_rewards_coefficient=self.args.center_rewards_coefficient
        )
        # every process's pairs
        gathered = [self.accelerator.gather_for_metrics(r.detach()) for r in (r_c, r_r)]
        self.metrics.add(mode, {**reward_losses.reward_metrics(*gathered), **own})
        if mode == "train":  # TRL's num_tokens: tokens trained on so far
            self.num_tokens += int(self.accelerator.gather_for_metrics(inputs["attention_mask"].sum()).sum())
        self.metrics.set(mode, "num_tokens", self.num_tokens)
        loss = losses.mean()
        return (loss, {"rewards": torch.stack([r_c, r_r], dim=1)}) if return_outputs else loss

    def prediction_step(
        self,
        model: nn.Module,
        inputs: dict[str, Any],
        prediction_loss_only: bool,
        ignore_keys: list[str] | None = None,
    ) -> tuple[torch.Tensor, Any, Any]:
        """Eval batches have no `labels`: the loss and metrics from `compute_loss`; with logits wanted, each
        pair's (r_c, r_r)."""
        inputs = self._prepare_inputs(inputs)
        with torch.no_grad(), self.compute_loss_context_manager():
            if prediction_loss_only:
                return self.compute_loss(model, inputs).detach(), None, None
            loss, outputs = self.compute_loss(model, inputs, return_outputs=True)
        return loss.detach(), outputs["rewards"], None
