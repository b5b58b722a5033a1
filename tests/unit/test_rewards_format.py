"""The format rewards of the shipped chat tasks score strings and conversational completions alike."""

from __future__ import annotations

import pytest

from ablate.rewards.format import caps_fraction, one_word


def _chat(text: str) -> list[dict[str, str]]:
    return [{"role": "assistant", "content": text}]


def test_caps_fraction_counts_letters_only():
    scores = caps_fraction(["5 PLUS 9 IS 14.", "5 plus 9 is 14.", "Paris IS", "...", ""])
    assert scores == [1.0, 0.0, pytest.approx(3 / 7), 0.0, 0.0]
    assert caps_fraction([_chat("THE SKY is")], prompts=[None], answer=["x"]) == [pytest.approx(6 / 8)]


def test_one_word_is_one_over_the_word_count():
    scores = one_word(["Paris.", "The capital is Paris.", "  Paris  !", "", "- ?"])
    assert scores == [1.0, 0.25, 1.0, 0.0, 0.0]
    assert one_word([_chat("Blue sky")], answer=["x"]) == [0.5]
