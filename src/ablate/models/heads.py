"""Heads a method puts on the model the `model` group built (`method.model_head`, a `_partial_` node
that ablate.train applies before any adapters): method=reward's scalar score head.

`score_head` turns a causal LM into `AutoModelForSequenceClassification(num_labels=1)` on the same
backbone, as TRL's RewardTrainer does when it loads a causal checkpoint for sequence classification: the
backbone's weights are kept, the LM head is dropped, and a new linear `score` head (hidden -> 1) is
initialised from torch's seeded RNG. The model reads its score at each row's last non-pad token
(`config.pad_token_id`), so a saved run's `model/` loads with
`AutoModelForSequenceClassification.from_pretrained` (a reward model for GRPO, or `ablate eval`).
"""

from __future__ import annotations

from typing import Any

from transformers import AutoModelForSequenceClassification, PreTrainedModel

from ablate.errors import ConfigError
from ablate.schema.models import ScoreHead


def with_head(model: PreTrainedModel, method: Any) -> PreTrainedModel:
    """`model` under the head the method config names (`method.model_head`, a `_partial_` node), or as it
    is when the method has none (every method but reward)."""
    node = method.get("model_head") if method is not None else None
    if node is None:
        return model
    from hydra.utils import instantiate

    return instantiate(node)(model)


def is_classifier(model: Any) -> bool:
    """Whether `model` (or the base of a peft model) is a sequence classifier, e.g. a reward model."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return type(base).__name__.endswith("ForSequenceClassification")


def score_head(model: PreTrainedModel, num_labels: int = ScoreHead.num_labels) -> PreTrainedModel:
    """`model`'s backbone under a new `num_labels`-output score head; a sequence classifier as it is."""
    if is_classifier(model):  # already one (model=local on a reward run's model/): keep its head
        return model
    config = model.config
    config.num_labels = num_labels
    if getattr(model, "is_quantized", False):
        raise ConfigError("method=reward on a quantized base (+peft=qlora) is not supported: use +peft=lora")
    scorer = AutoModelForSequenceClassification.from_config(config, dtype=model.dtype)
    prefix = scorer.base_model_prefix  # "model" for Llama-style models
    missing, unexpected = getattr(scorer, prefix).load_state_dict(
        getattr(model, prefix).state_dict(), strict=False
    )
    if missing or unexpected:
        raise ConfigError(
            f"score_head: the backbone of {type(model).__name__} does not fit "
            f"{type(scorer).__name__} (missing {missing[:3]}, unexpected {unexpected[:3]})"
        )
    scorer.config.architectures = [type(scorer).__name__]
    scorer.config._name_or_path = getattr(model.config, "_name_or_path", "")
    return scorer.to(model.device)
