"""KTO on `transformers.Trainer` (Ethayarajh et al. 2024): unpaired desirable / undesirable completions,
each pushed above or below a KL reference point estimated from mismatched pairs of the same batch; the
loss is a `losses.kto` function chosen by config (`method/kto_loss=kto|apo_zero_unpaired`).

As TRL 1.16's KTOTrainer: its data formats and unpairing (ablate.data.unpaired), log-probs summed over
completion tokens, the KL term from the batch's completions rotated by one (a no-grad forward of the policy
and of the reference), a fixed sequential order (the KL pairs are fixed when the data is prepared), and
its metric names. Departures: the examples are shuffled once with the data seed before that order is
fixed (TRL's unpairing puts every desirable example first); the reference log-probs are precomputed by
default (`precompute_ref_log_probs`, TRL's option; ablate's DPO default), so no second model stays in
memory; with `+peft=lora` the reference is the policy with its adapters disabled, as in TRL.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from datasets import Dataset
from torch import nn
from transformers import PreTrainedModel, PreTrainedTokenizerBase, TrainingArguments

from ablate.data.tokenize import pad
from ablate.data.unpaired import prepare_unpaired
from ablate.errors import ConfigError
from ablate.losses import kto as kto_losses
from ablate.losses.logps import sequence_logps, shifted_logps
from ablate.methods.base import AblateTrainer
from ablate.models.adapters import is_adapted, reference_forward
from ablate.schema import refusal
from ablate.schema.args import KTOArgs, kl_batch_problem


@dataclass
class KTOConfig(KTOArgs, TrainingArguments):
    """`method.args`: TrainingArguments with the method's fields, defaults and checks
    (ablate.schema.args.KTOArgs)."""

    remove_unused_columns: bool = False  # the collator needs the tokenised columns Trainer cannot see


class KTOCollator:
    """Right-pads prompt + completion per example (and prompt + KL completion under `KL_*`), each cut to
    `max_length` (TRL's DataCollatorForUnpairedPreference); `label` and precomputed reference log-probs."""

    def __init__(self, pad_token_id: int, max_length: int | None) -> None:
        self.pad_token_id, self.max_length = pad_token_id, max_length

    def __call__(self, rows: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        batch: dict[str, torch.Tensor] = {}
        for prefix, key in (("", "completion_ids"), ("KL_", "KL_completion_ids")):
            if key not in rows[0]:
                continue
            ids = [(r["prompt_ids"] + r[key])[: self.max_length] for r in rows]
            masks = [([0] * len(r["prompt_ids"]) + [1] * len(r[key]))[: self.max_length] for r in rows]
            batch |= {
                f"{prefix}input_ids": pad(ids, self.pad_token_id),
                f"{prefix}attention_mask": pad([[1] * len(i) for i in ids], 0),
                f"{prefix}completion_mask": pad(masks, 0),
            }
        for key in ("ref_logps", "ref_KL_logps"):
            if key in rows[0]:
                batch[key] = torch.tensor([r[key] for r in rows])
        batch["label"] = torch.tensor([r["label"] for r in rows])
        return batch


class KTOTrainer(AblateTrainer):
    """KTO with the loss given as `loss` (a `losses.kto` function; config `method/kto_loss=NAME`)."""

    def __init__(
        self,
        model: PreTrainedModel,
        args: KTOConfig,
        train_dataset: Dataset | None,
        processing_class: PreTrainedTokenizerBase,
        eval_dataset: Dataset | None = None,
        ref_model: PreTrainedModel | None = None,
        data_collator: Callable | None = None,
        loss: kto_losses.KTOLoss = kto_losses.kto,
        **kwargs: Any,
    ) -> None:
        self.loss_fn, self.uses_kl = loss, kto_losses.uses_kl(loss)
        # the config's check, on this loss
        problem = kl_batch_problem(args.per_device_train_batch_size, self.uses_kl)
        if problem is not None:
            raise ConfigError(refusal(*problem))
        kl_batch = args.per_device_train_batch_size if self.uses_kl else None
        seed = args.data_seed if args.data_seed is not None else args.seed
        if train_dataset is not None:  # None: evaluation only (`ablate eval`)
            train_dataset = prepare_unpaired(
                train_dataset, processing_class, args.max_length, seed, kl_batch, "train"
            )
        if eval_dataset is not None:
            eval_dataset = prepare_unpaired(
                eval_dataset, processing_class, args.max_length, seed, kl_batch, "eval"
            )
        super().__init__(
            model=model,
            args=args,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            data_collator=data_collator or KTOCollator(processing_class.pad_token_id, args.max_length),
            processing_class=processing_class,
            **kwargs,
        )
        self.num_tokens = 0
        self.ref_model = None  # None: precomputed, or the policy with its adapters disabled
        if args.precompute_ref_log_probs and ref_model is None:
            self.train_dataset = self._with_ref_logps(self.train_dataset)
            self.eval_dataset = self._with_ref_logps(self.eval_dataset)
        elif ref_model is not None or not is_adapted(model):
            self.ref_model = (
                (ref_model if ref_model is not None else copy.deepcopy(model)).eval().requires_grad_(False)
            )
            self.ref_model.to(self.args.device)

    def _logps(
        self, model: nn.Module, batch: dict[str, torch.Tensor], prefix: str = "", stats: bool = False
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Summed completion log-probs (B,) of `prefix`'s sequences; with `stats`, per-token entropy and
        vocabulary-mean logit over the completion positions (TRL's metrics)."""
        ids, mask = batch[f"{prefix}input_ids"], batch[f"{prefix}completion_mask"][:, 1:]
        logits = model(input_ids=ids, attention_mask=batch[f"{prefix}attention_mask"], use_cache=False).logits
        token, out = shifted_logps(logits, ids, with_stats=stats)  # no float32 copy of the logits
        logps = sequence_logps(token, mask)
        if not stats:
            return logps, {}
        return logps, {"entropy": out["entropy"], "mean_logit": out["mean_logit"], "mask": mask.bool()}

    @torch.no_grad()
    def _reference(
        self, model: nn.Module, batch: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The reference's log-probs of the completions and (with a KL loss) of the KL completions: the live
        reference model's, the policy's with adapters disabled, or the policy's as it is (precomputing)."""

        def score(m: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
            return self._logps(m, batch)[0], self._logps(m, batch, "KL_")[0] if self.uses_kl else None

        if self.ref_model is not None:
            return score(self.ref_model)
        unwrapped = self.accelerator.unwrap_model(model)
        if is_adapted(unwrapped):
            with reference_forward(model, unwrapped):
                return score(model)
        return score(model)

    @torch.inference_mode()
    def _with_ref_logps(self, dataset: Dataset | None) -> Dataset | None:
        """`ref_logps` (and `ref_KL_logps`) columns, scored by the model as it is now, in eval batches."""
        if dataset is None:
            return None
        was_training = self.model.training
        self.model.eval()
        ref, ref_kl, bs = [], [], self.args.per_device_eval_batch_size
        for start in range(0, len(dataset), bs):
            batch = self._prepare_inputs(
                self.data_collator([dataset[i] for i in range(start, min(start + bs, len(dataset)))])
            )
            with self.accelerator.autocast():
                logps, kl_logps = self._reference(self.model, batch)
            ref += logps.float().tolist()
            ref_kl += kl_logps.float().tolist() if kl_logps is not None else []
        self.model.train(was_training)
        dataset = dataset.add_column("ref_logps", ref)
        return dataset.add_column("ref_KL_logps", ref_kl) if self.uses_kl else dataset

    def compute_loss(
        self,
        model: nn.Module,
        inputs: dict[str, torch.Tensor],
        return_outputs: bool = False,
        num_items_in_batch: torch.Tensor | int | None = None,
    ) -> Any:
        mode = "train" if model.training else "eval"
        desirable = inputs["label"].bool()
        logps, stats = self._logps(model, inputs, stats=True)
        if "ref_logps" in inputs:  # precomputed
            ref, ref_kl = inputs["ref_logps"].to(logps), inputs.get("ref_KL_logps")
        else:
            ref, ref_kl = self._reference(model, inputs)
        kl = None
        if self.uses_kl:  # the reference point: the policy on the mismatched pairs, no gradient (TRL)
            with torch.no_grad():
                kl_logps = self._logps(model, inputs, "KL_")[0]
            kl = kto_losses.kl_estimate(
                *(self.accelerator.gather_for_metrics(x) for x in (kl_logps, ref_kl.to(kl_logps)))
            )
        losses, own = self.loss_fn(
            logps,
            ref,
            desirable,
            kl,
            beta=self.args.beta,
            desirable_weight=self.args.desirable_weight,
            undesirable_weight=self.args.undesirable_weight,
        )
        self._log(mode, logps, ref, desirable, kl, stats, inputs, own)
        loss = losses.mean()
        return (loss, {"logps": logps}) if return_outputs else loss

    def _log(
        self,
        mode: str,
        logps: torch.Tensor,
        ref: torch.Tensor,
        desirable: torch.Tensor,
        kl: torch.Tensor | None,
        stats: dict[str, torch.Tensor],
        inputs: dict[str, torch.Tensor],
        own: dict[str, torch.Tensor],
    ) -> None:
        """TRL's KTO metrics: kl, entropy, logits/{chosen,rejected}, rewards/*, logps/*, num_tokens."""
        mask = stats["mask"]
        metrics = {
            "kl": kl if kl is not None else torch.zeros(()),
            "entropy": stats["entropy"][mask].mean(),
            **own,
        }
        for name, rows in (("chosen", desirable), ("rejected", ~desirable)):
            if mask[rows].any():
                metrics[f"logits/{name}"] = stats["mean_logit"][rows][mask[rows]].mean()
        metrics |= kto_losses.reward_metrics(logps, ref, desirable, self.args.beta)
        self.metrics.add(mode, metrics)
        if mode == "train":
            self.num_tokens += int(self.accelerator.gather_for_metrics(inputs["attention_mask"].sum()).sum())
        self.metrics.set(mode, "num_tokens", self.num_tokens)

    def prediction_step(
        self,
        model: nn.Module,
        inputs: dict[str, Any],
        prediction_loss_only: bool,
        ignore_keys: list[str] | None = None,
    ) -> tuple[torch.Tensor, None, None]:
        """Eval batches have no `labels`: run `compute_loss` so eval reports the KTO loss and metrics."""
        inputs = self._prepare_inputs(inputs)
        with torch.no_grad(), self.compute_loss_context_manager():
            return self.compute_loss(model, inputs).detach(), None, None
