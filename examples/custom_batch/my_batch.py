"""The TRL docs' "change the batch format" example, done the ablate way.

The dataset arrives already in model format (token ids, built by `pretokenized` below, a data
builder the method YAML selects as `data=tiny_prefs_ids`), so the trainer's `_prepare_dataset` keeps it as it
is, and a user collator, passed through config as `method.trainer.data_collator`, batches it. Here the
collator pads every batch to a multiple of `multiple` tokens (fixed shapes help GPU kernels and compiled
models); a collator producing extra keys for a custom loss is wired the same way.

    PYTHONPATH=examples/custom_batch ablate train --config-dir examples/custom_batch method=dpo_custom_batch
"""

from __future__ import annotations

from typing import Any

import torch
from datasets import Dataset

from ablate.data import DataSplits, packaged
from ablate.data.tokenize import encode_completion, encode_prompt
from ablate.methods.dpo import DPOTrainer
from ablate.models.tokenizer import byte_tokenizer


def pretokenized(name: str = "sort_prefs", max_train_samples: int | None = None) -> DataSplits:
    """The packaged preference pairs as token ids for the tiny model's byte tokenizer."""
    tok, splits = byte_tokenizer(), packaged(name, max_train_samples=max_train_samples)

    def encode(row: dict[str, Any]) -> dict[str, list[int]]:
        return {
            "prompt_ids": encode_prompt(tok, row["prompt"]),
            "chosen_ids": encode_completion(tok, row["prompt"], row["chosen"]),
            "rejected_ids": encode_completion(tok, row["prompt"], row["rejected"]),
        }

    train = splits.train.map(encode, remove_columns=splits.train.column_names)
    ev = splits.eval.map(encode, remove_columns=splits.eval.column_names) if splits.eval is not None else None
    return DataSplits(train=train, eval=ev)


class PadToMultipleCollator:
    """Rows with prompt/chosen/rejected ids -> a DPO batch `[chosen; rejected]` padded to a multiple."""

    def __init__(self, pad_token_id: int, multiple: int = 8) -> None:
        self.pad_token_id, self.multiple = pad_token_id, multiple

    def __call__(self, rows: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        seqs = [r["prompt_ids"] + r[k] for k in ("chosen_ids", "rejected_ids") for r in rows]
        masks = [
            [0] * len(r["prompt_ids"]) + [1] * len(r[k]) for k in ("chosen_ids", "rejected_ids") for r in rows
        ]
        width = -(-max(map(len, seqs)) // self.multiple) * self.multiple  # round up

        def padded(xs: list[list[int]], value: int) -> torch.Tensor:
            return torch.tensor([x + [value] * (width - len(x)) for x in xs], dtype=torch.long)

        batch = {
            "input_ids": padded(seqs, self.pad_token_id),
            "attention_mask": padded([[1] * len(s) for s in seqs], 0),
            "completion_mask": padded(masks, 0),
        }
        if "ref_chosen_logps" in rows[0]:  # added by DPOTrainer when it precomputes the reference
            batch["ref_chosen_logps"] = torch.tensor([r["ref_chosen_logps"] for r in rows])
            batch["ref_rejected_logps"] = torch.tensor([r["ref_rejected_logps"] for r in rows])
        return batch


class KeepDatasetDPOTrainer(DPOTrainer):
    def _prepare_dataset(self, dataset: Dataset, *args: Any, **kwargs: Any) -> Dataset:
        return dataset  # already token ids: skip ablate's tokenisation
