"""What `ablate generate` prints for a completion that is empty or blank."""

from __future__ import annotations


def test_an_empty_or_blank_completion_says_so():
    from ablate.cli.generate import shown

    assert shown(" abcd") == " abcd"
    assert shown("") == "(empty: the model wrote no text)"
    assert shown(" \n") == "(only whitespace: ' \\n')"
