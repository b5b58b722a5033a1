"""Verifiable rewards for format instructions on chat data (`ablate/data/make_chat.py`)."""

from __future__ import annotations

from typing import Any


def _text(completion: str | list[dict[str, Any]]) -> str:
    """A completion is a string, or (conversational prompts) a list with one assistant message."""
    return completion if isinstance(completion, str) else "".join(m["content"] for m in completion)


def one_word(completions: list[str | list[dict[str, Any]]], **_: Any) -> list[float]:
    """1 / the number of words in the completion ("Answer with one word."); 0 when it has none.

    Dense: a six-word sentence scores 1/6, two words 1/2, one word 1. Punctuation is not a word.
    """
    scores = []
    for c in completions:
        words = [w for w in _text(c).split() if any(ch.isalnum() for ch in w)]
        scores.append(1.0 / len(words) if words else 0.0)
    return scores
