"""Supervised fine-tuning on `transformers.Trainer`: loss on the completion (prompt-completion rows) or on
every token (`messages` / `text` rows), as TRL's SFTTrainer."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from datasets import Dataset
from torch import nn
from transformers import PreTrainedModel, PreTrainedTokenizerBase, TrainingArguments

from ablate.data import cache as reuse
from ablate.data.tokenize import pad, prepare_sft
from ablate.losses.logps import shifted_logps
from ablate.losses.sft import nll
from ablate.methods.base import AblateTrainer
from ablate.methods.forward import unconverted
from ablate.methods.tokenized import TokenizedRows
from ablate.schema.args import SFTArgs
from ablate.speed import plan as speed_plan
from ablate.speed.plan import PrintPlan, Setting, SpeedSwitches
from ablate.speed.split import keep_from, scored_logps


@dataclass
class SFTConfig(SFTArgs, TrainingArguments):
    """`method.args`: TrainingArguments with SFT's fields, defaults and checks
    (ablate.schema.args.SFTArgs)."""

    remove_unused_columns: bool = False  # the collator needs the tokenised columns Trainer cannot see


class SFTCollator:
    """Right-pads prompt+completion; `labels` mark completion tokens (-100 elsewhere), or only those a
    row's `completion_mask` marks (assistant tokens, with `assistant_only_loss`).

    `labels` exist so Trainer counts the completion tokens of the whole accumulated batch
    (`num_items_in_batch`), which makes gradient accumulation exact for a token-mean loss.
    """

    def __init__(self, pad_token_id: int) -> None:
        self.pad_token_id = pad_token_id

    def __call__(self, rows: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        seqs = [r["prompt_ids"] + r["completion_ids"] for r in rows]
        masks = [
            [0] * len(r["prompt_ids"]) + (r.get("completion_mask") or [1] * len(r["completion_ids"]))
            for r in rows
        ]
        input_ids, completion_mask = pad(seqs, self.pad_token_id), pad(masks, 0)
        return {
            "input_ids": input_ids,
            "attention_mask": pad([[1] * len(s) for s in seqs], 0),
            "completion_mask": completion_mask,
            "labels": input_ids.masked_fill(completion_mask == 0, -100),
        }


class SFTTrainer(TokenizedRows, AblateTrainer):
    """Next-token NLL on the completion, given the prompt. Its speed paths (conf/speed/): `lean_layers`,
    and `completion_only_logits` (the LM head only at the positions that score a label, in chunks: no
    [tokens, vocab] logits, whatever the length; under sequence parallelism each rank its own positions),
    decided by ablate.speed.plan as the other trainers' are."""

    tokenize = staticmethod(prepare_sft)  # any TRL SFT format -> prompt/completion ids (loss on the latter)
    speed_paths = speed_plan.SFT  # the speed paths it runs (ablate.speed.plan; `ablate plan` reads them)
    row = "example"
    tokenize_args = ("max_length", "completion_only_loss", "assistant_only_loss")

    def __init__(
        self,
        model: PreTrainedModel,
        args: SFTConfig,
        train_dataset: Dataset | None,
        processing_class: PreTrainedTokenizerBase,
        eval_dataset: Dataset | None = None,
        data_collator: Callable | None = None,
        perf: SpeedSwitches | None = None,
        cache: reuse.Cache | None = None,
        **kwargs: Any,
    ) -> None:
        self.perf = perf or SpeedSwitches()
        self.cache = cache or reuse.Cache(enabled=False)  # tokenized examples (ablate.data.cache)
        self.speed_plan = speed_plan.resolve(
            "policy", Setting.of(model, args, args.max_length), self.perf, self.speed_paths
        )
        speed_plan.apply(model, self.speed_plan)
        if train_dataset is not None:  # None: evaluation only (`ablate eval`)
            train_dataset = self._prepare_dataset(train_dataset, processing_class, args, "train")
        if eval_dataset is not None:
            eval_dataset = self._prepare_dataset(eval_dataset, processing_class, args, "eval")
        super().__init__(
            model=model,
            args=args,
            data_collator=data_collator or SFTCollator(processing_class.pad_token_id),
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            processing_class=processing_class,
            compute_loss_func=self.completion_nll,
            **kwargs,
        )
        self.loss_is_scaled_for_ga = True  # nll() divides by the accumulated batch's token count
        self.add_callback(PrintPlan(self.speed_plan, show=self.perf.show))

    def compute_loss(
        self,
        model: nn.Module,
        inputs: dict[str, torch.Tensor],
        return_outputs: bool = False,
        num_items_in_batch: torch.Tensor | int | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, Any]:
        """Trainer's own compute_loss, with `completion_nll` as its `compute_loss_func`: the forward,
        and the scaling of a token-count-normalised loss across processes, stay upstream's."""
        model_inputs = {k: v for k, v in inputs.items() if k != "completion_mask"}  # labels carry the mask
        # logits only from the first position that scores a label on (the prompt's are never used), unless
        # an eval's compute_metrics hook receives them (with the labels, every position)
        whole = return_outputs and self.compute_metrics is not None
        if not whole and self.speed_plan.on("completion_only_logits"):
            return super().compute_loss(
                self._scored(model, inputs["labels"]), model_inputs, return_outputs, num_items_in_batch
            )
        keep = (
            {} if whole else keep_from(self.accelerator.unwrap_model(model), inputs["labels"][:, 1:] != -100)
        )
        # the model's forward without accelerate's float32 copy of the logits (ablate.methods.forward)
        forward = model if whole else unconverted(self.accelerator, model)
        return super().compute_loss(
            forward, {**model_inputs, **keep, "use_cache": False}, return_outputs, num_items_in_batch
        )

    def _scored(self, model: nn.Module, labels: torch.Tensor) -> Callable[..., dict[str, torch.Tensor]]:
        """A forward for Trainer.compute_loss (which keeps its loss scaling) returning, instead of logits,
        the log-probs of the label tokens [B, T - 1] (0 at unscored positions) and their next-token
        accuracy, through the chunked head (`completion_only_logits`: ablate.speed.split.scored_logps)."""
        row, col = (labels[:, 1:] != -100).nonzero(as_tuple=True)
        src, tgt = row * labels.shape[1] + col, labels[:, 1:][row, col]

        def forward(input_ids: torch.Tensor, attention_mask: torch.Tensor, **_: Any) -> dict:
            # accelerate puts bf16/fp16 autocast around model.forward; the backbone's own call needs it too
            with self.accelerator.autocast():
                token, stats = scored_logps(
                    model, {"input_ids": input_ids, "attention_mask": attention_mask}, src, tgt
                )
            shape = (labels.shape[0], labels.shape[1] - 1)
            return {
                "logps": token.new_zeros(shape).index_put((row, col), token),
                "correct": torch.zeros(shape, dtype=torch.bool, device=token.device).index_put(
                    (row, col), stats["correct"]
                ),
            }

        return forward

    def completion_nll(
        self, outputs: Any, labels: torch.Tensor, num_items_in_batch: torch.Tensor | int | None = None
    ) -> torch.Tensor:
        """`nll` of the completion tokens (labels != -100), plus their next-token accuracy. The logits may be
        the last K positions only (`logits_to_keep`); their log-probs come without a float32 copy of them
        (ablate.losses.logps.shifted_logps), the accuracy from the same pass."""
        mode = "train" if self.model.training else "eval"
        if isinstance(outputs, dict) and "logps" in outputs:  # the chunked head's (`_scored`)
            per_token, stats = outputs["logps"], outputs
        else:  # prompt positions masked out below
            per_token, stats = shifted_logps(outputs.logits, labels.clamp_min(0))
        mask = (labels[:, 1:] != -100)[:, labels.shape[1] - 1 - per_token.shape[1] :]
        loss = nll(per_token, mask, num_items_in_batch if self.model.training else None)
        correct = stats["correct"] & mask
        self.metrics.add(mode, {"mean_token_accuracy": correct.sum() / mask.sum().clamp_min(1)})
        return loss
