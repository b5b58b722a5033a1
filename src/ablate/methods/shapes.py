"""Which data each method takes, checked before the model is built: a file whose rows match no
format of the method is refused in one line (`ablate.data.formats.detect`) without loading a model."""

from __future__ import annotations

from typing import Any

# the format family (ablate.data.formats.FORMATS) of each trainer, and the tokenised columns that
# let a dataset skip it (already tokenised rows, e.g. examples/custom_batch)
IDS = {"preference": ("prompt_ids", "chosen_ids", "rejected_ids"), "sft": ("prompt_ids", "completion_ids"),
       "prompt": ("prompt_ids",), "reward": ("chosen_ids", "rejected_ids"),
       "unpaired": ("prompt_ids", "completion_ids", "label")}


# the format family of ablate's own trainers by their `_target_`, for the check of a data file's columns
# before the run (ablate.run.validate: no trainer import there); a trainer of the user's is checked when built
TARGET_KINDS = {"ablate.methods.dpo.DPOTrainer": "preference", "ablate.methods.sft.SFTTrainer": "sft",
                "ablate.methods.grpo.GRPOTrainer": "prompt"}


def data_kind(trainer_cls: type) -> str | None:
    """"preference" (DPO and its subclasses), "sft", "prompt" (GRPO), or what the trainer class says
    (`data_kind`: "reward", "unpaired"); None for a trainer of another kind."""
    if isinstance(getattr(trainer_cls, "data_kind", None), str):
        return trainer_cls.data_kind
    from ablate.methods.dpo import DPOTrainer
    from ablate.methods.grpo import GRPOTrainer
    from ablate.methods.sft import SFTTrainer

    for base, kind in ((DPOTrainer, "preference"), (SFTTrainer, "sft"), (GRPOTrainer, "prompt")):
        if isinstance(trainer_cls, type) and issubclass(trainer_cls, base):
            return kind
    return None


def check_shape(trainer_cls: type, *datasets: Any) -> dict[str, Any]:
    """DataError (one line: the columns found, the formats expected) unless every dataset given (None:
    skipped) is in a format `trainer_cls` takes, or already tokenised. Returns how the first (the
    train split) is formatted (`ablate.data.formats.describe`: run.json's `data_format`)."""
    from ablate.data.formats import describe, detect

    kind = data_kind(trainer_cls)
    for ds in datasets:
        if kind is not None and ds is not None and not set(IDS[kind]) <= set(ds.column_names):
            detect(ds, kind)
    return describe(datasets[0], kind)
