"""Teachers for method=distill that are not a model dir or a config model (`+teacher=...`, conf/teacher/):
a scripted teacher for the packaged "repeat a letter" task, the default teacher of `ablate train
method=distill`, so that the one-command run shows distillation moving a student towards a teacher's
behaviour (the task's reward rises) with no download and no earlier run.

`letter_teacher` returns (tokenizer, model) as the model builders do; its model puts, at every position of
a row, logit `confidence` on the row's first token (the prompt's letter: the prompts are "gggg") and 0 on
every other token, so with the default 8 it gives that letter ~92% of its probability everywhere (the rest
spread evenly). It is a stand-in for a trained teacher on that one task; any other task needs a real one.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from ablate.models.tokenizer import byte_tokenizer
from ablate.schema import models as nodes


class LetterTeacher(nn.Module):
    """Next-token logits that repeat the row's first token (see the module docstring)."""

    def __init__(self, vocab_size: int, confidence: float) -> None:
        super().__init__()
        self.config = SimpleNamespace(vocab_size=vocab_size)  # what the distillation trainer checks
        self.confidence = confidence
        self.register_buffer("anchor", torch.zeros(()), persistent=False)  # follows .to(device)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **_: Any
    ) -> SimpleNamespace:
        mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
        first = mask.argmax(dim=-1, keepdim=True)  # prompts are left-padded: the first attended token
        letter = input_ids.gather(1, first).unsqueeze(-1).expand(-1, input_ids.shape[1], 1)
        logits = torch.zeros(*input_ids.shape, self.config.vocab_size, device=input_ids.device)
        return SimpleNamespace(logits=logits.scatter(-1, letter, self.confidence))


def letter_teacher(
    confidence: float = nodes.LetterTeacher.confidence,
) -> tuple[PreTrainedTokenizerBase, nn.Module]:
    """(byte tokenizer, LetterTeacher): the repeat-a-letter task's scripted teacher."""
    tokenizer = byte_tokenizer()
    return tokenizer, LetterTeacher(len(tokenizer), confidence)
