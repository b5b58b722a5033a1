"""Turn dataset rows into token ids: plain strings or chat messages, the same way for every method.

A prompt is a string or a list of `{role, content}` messages; a completion is a string or the list of
messages that follow the prompt. Completion ids end with EOS (so generation learns to stop); prompt
ids never do. For messages, the completion is the chat-template text of prompt + completion with the
prompt's text (including the generation prompt) cut off the front, as TRL does.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from ablate.data import DataError

Text = str | list[dict[str, Any]]


def _template(tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, Any]], gen: bool) -> str:
    if tokenizer.chat_template is None:
        raise DataError("data: conversational rows need a tokenizer with a chat template; this one has none")
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen)


def prompt_text(tokenizer: PreTrainedTokenizerBase, prompt: Text) -> str:
    """The text the model is conditioned on."""
    return prompt if isinstance(prompt, str) else _template(tokenizer, prompt, gen=True)


def encode_prompt(tokenizer: PreTrainedTokenizerBase, prompt: Text) -> list[int]:
    return tokenizer(prompt_text(tokenizer, prompt), add_special_tokens=False)["input_ids"]


def encode_completion(tokenizer: PreTrainedTokenizerBase, prompt: Text, completion: Text) -> list[int]:
    """Completion ids followed by EOS."""
    if isinstance(completion, str):
        if not isinstance(prompt, str):
            raise DataError("data: a conversational prompt needs a conversational completion (list of messages)")
        text = completion
    else:
        if isinstance(prompt, str):
            raise DataError("data: a conversational completion needs a conversational prompt (list of messages)")
        head = prompt_text(tokenizer, prompt)
        full = _template(tokenizer, list(prompt) + list(completion), gen=False)
        if not full.startswith(head):
            raise DataError("data: the chat template renders prompt+completion with a different prefix than the prompt")
        text = full[len(head):]
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return ids + [tokenizer.eos_token_id]


def require_columns(dataset: Any, columns: tuple[str, ...], method: str) -> None:
    """One-line error naming the missing columns (bad data must not surface as a KeyError later)."""
    missing = [c for c in columns if c not in dataset.column_names]
    if missing:
        raise DataError(
            f"data: {method} needs columns {list(columns)}; missing {missing} (found {dataset.column_names})"
        )


def pad(seqs: list[list[int]], value: int) -> torch.Tensor:
    """Right-pad lists of ids to one (B, T) tensor."""
    width = max(len(s) for s in seqs)
    return torch.tensor([s + [value] * (width - len(s)) for s in seqs], dtype=torch.long)
