"""A learned reward model as a GRPO reward function (TRL 1.16's `reward_funcs` entry that is a model):
`+data.reward_funcs.rm={_target_: ablate.rewards.RewardModel, path: DIR}`.

DIR is an `ablate train method=reward` run dir (its `model/`) or any directory holding an
`AutoModelForSequenceClassification` with one label and its tokenizer. Scored as TRL scores a reward model:
the text is the prompt followed by the completion, each conversation rendered by the *reward model's own*
tokenizer and chat template (prompt + completion messages, no generation prompt; plain strings are
concatenated), tokenized without adding special tokens, right-padded, and the model's logit 0 is the reward.
Departures: scored in batches of `batch_size` (TRL scores the whole round at once) and, optionally,
truncated to `max_length` tokens (keeping the start, as TRL's tokenizers do when asked).

The weights are loaded on first use, on the device the trainer hands over (`to`, called by GRPOTrainer
with its own device), in `dtype`; scoring runs under `torch.inference_mode()`. Loading lazily means a config
that is only composed or checked never reads the weights; the path itself is checked at once (one line).
torch and transformers are imported only when the weights are loaded (checking a config imports neither).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ablate.errors import ConfigError
from ablate.schema import nodes

MODEL_DIR = "model"  # where a run dir keeps its trained model (ablate.record.rundir.MODEL)


def model_dir(path: str | Path) -> Path:
    """The model directory behind `path`: itself when it holds a config.json, else a run dir's `model/`."""
    p = Path(path).expanduser()
    for candidate in (p, p / MODEL_DIR):
        if (candidate / "config.json").is_file():
            return candidate
    if not p.exists():
        raise ConfigError(
            f"RewardModel: path {p} does not exist (an `ablate train method=reward` run dir, or a "
            f"save_pretrained dir of a sequence-classification model)"
        )
    raise ConfigError(f"RewardModel: {p} holds no model (no config.json in it or in {p / MODEL_DIR})")


def read_config(path: Path, who: str) -> dict[str, Any]:
    """A save_pretrained dir's config.json as a dict; ConfigError (one line, `who` first) if not JSON."""
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        why = "not UTF-8 text" if isinstance(e, UnicodeDecodeError) else f"{str(e).splitlines()[0]}"
        raise ConfigError(
            f"{who}{path} is not JSON ({why}): a damaged or unfinished save; save the model again "
            "(save_pretrained), or point at another dir"
        ) from None
    if not isinstance(config, dict):
        raise ConfigError(
            f"{who}{path} is not JSON (a {type(config).__name__}, not an object): a damaged save"
        )
    return config


def checked_dir(path: str | Path) -> Path:
    """The model dir behind `path`, its config.json that of a one-label sequence classifier (read, not loaded:
    the config checks call this before the run dir exists)."""
    found = model_dir(path)
    config = read_config(found / "config.json", "RewardModel: ")
    archs = config.get("architectures") or []
    if archs and not any(str(a).endswith("ForSequenceClassification") for a in archs):
        raise ConfigError(
            f"RewardModel: {found} holds a {archs[0]}, not a sequence-classification model "
            f"(train one with `ablate train method=reward`)"
        )
    labels = config.get("num_labels", len(config.get("id2label") or {}) or 2)
    if labels != 1:
        raise ConfigError(
            f"RewardModel: {found} has {labels} output labels; a reward model has one "
            f"(its logit is the reward)"
        )
    return found


class RewardModel:
    """A reward function scoring each (prompt, completion) with a sequence-classification model (see the
    module docstring). Named `reward_model` in the metrics unless the config names it
    (`rewards/<name>/mean`)."""

    __name__ = "reward_model"

    def __init__(
        self, path: str, batch_size: int = 32, dtype: str = "float32", max_length: int | None = None
    ) -> None:
        self.path = checked_dir(path)
        nodes.RewardModel.of({"batch_size": batch_size, "dtype": dtype}).check()  # its schema's checks
        self.batch_size, self.dtype, self.max_length = batch_size, dtype, max_length
        self.device: Any = "cpu"
        self.model: Any = None
        self.tokenizer: Any = None

    def to(self, device: Any) -> RewardModel:
        """Score on `device` (the trainer's): the weights go there when loaded, or now if they are."""
        self.device = device
        if self.model is not None:
            self.model.to(device)
        return self

    def load(self) -> None:
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(self.path)
        if self.tokenizer.pad_token is None:  # TRL's: a reward model's batches need a pad token
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model = AutoModelForSequenceClassification.from_pretrained(
            self.path, num_labels=1, dtype=getattr(torch, self.dtype)
        )
        self.model.config.pad_token_id = self.tokenizer.pad_token_id  # the last non-pad token is scored
        self.model.to(self.device).eval().requires_grad_(False)

    def texts(self, prompts: list[Any], completions: list[Any]) -> list[str]:
        """What the reward model reads: TRL's `apply_chat_template(prompt + completion)` with its own
        tokenizer for conversations, `prompt + completion` for strings."""
        if prompts and isinstance(prompts[0], list):
            if self.tokenizer.chat_template is None:
                raise ConfigError(
                    f"RewardModel: {self.path}'s tokenizer has no chat template, and the prompts are "
                    f"conversations (lists of messages)"
                )
            return [
                self.tokenizer.apply_chat_template(list(p) + list(c), tokenize=False)
                for p, c in zip(prompts, completions)
            ]
        return [p + c for p, c in zip(prompts, completions)]

    def __call__(self, prompts: list[Any], completions: list[Any], **_: Any) -> list[float]:
        import torch

        if self.model is None:
            self.load()
        texts, rewards = self.texts(prompts, completions), []
        truncate = {"truncation": True, "max_length": self.max_length} if self.max_length else {}
        with torch.inference_mode():
            for i in range(0, len(texts), self.batch_size):
                batch = self.tokenizer(
                    text=texts[i : i + self.batch_size],
                    return_tensors="pt",
                    padding=True,
                    padding_side="right",
                    add_special_tokens=False,
                    **truncate,
                )
                batch = {k: v.to(self.model.device) for k, v in batch.items()}
                rewards += self.model(**batch).logits[:, 0].float().tolist()
        return rewards
