"""Verifiable rewards for the packaged letter tasks (`ablate/data/make_prompts.py`)."""

from __future__ import annotations

from typing import Any


def repeat_fraction(
    prompts: list[Any], completions: list[str], letter: list[str], length: list[int], **_: Any
) -> list[float]:
    """Fraction of the first `length` characters that equal the prompt's `letter`.

    Dense (every right character counts), bounded in [0, 1], and divided by `length` rather than by the
    completion's length, so stopping early (EOS) never pays. A random byte is right with p ~ 1/256.
    """
    return [sum(ch == x for ch in c[:n]) / n for c, x, n in zip(completions, letter, length)]
