"""The format reward of the shipped chat task scores strings and conversational completions alike."""

from __future__ import annotations

from ablate.rewards.format import one_word


def _chat(text: str) -> list[dict[str, str]]:
    return [{"role": "assistant", "content": text}]


def test_one_word_is_one_over_the_word_count():
    scores = one_word(["Paris.", "The capital is Paris.", "  Paris  !", "", "- ?"])
    assert scores == [1.0, 0.25, 1.0, 0.0, 0.0]
    assert one_word([_chat("Blue sky")], answer=["x"]) == [0.5]
