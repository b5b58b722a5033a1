"""DPO's `method.args` (conf/method/dpo.yaml): TrainingArguments with DPO's fields, defaults and checks
(ablate.schema.args.DPOArgs)."""

from __future__ import annotations

from dataclasses import dataclass

from transformers import TrainingArguments

from ablate.schema.args import DPOArgs


@dataclass
class DPOConfig(DPOArgs, TrainingArguments):
    """`method.args`: TrainingArguments with DPO's fields, defaults and checks
    (ablate.schema.args.DPOArgs)."""

    remove_unused_columns: bool = False  # the collator needs the tokenised columns Trainer cannot see
