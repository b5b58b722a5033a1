"""The calculator task's reward (`data=calc_tools`, ablate/data/make_calc.py)."""

from __future__ import annotations

from typing import Any


def final_answer(completion: str | list[dict[str, Any]]) -> str:
    """The text of the completion's last assistant turn (the answer after any tool calls), stripped."""
    if isinstance(completion, str):
        return completion.strip()
    turns = [m for m in completion if m.get("role") == "assistant"]
    return (turns[-1].get("content") or "").strip() if turns else ""


def correct(completions: list[Any], answer: list[str], **_: Any) -> list[float]:
    """1 when the last assistant turn is exactly the right number, else 0 (a tool result is not an answer:
    only what the model itself wrote after it counts)."""
    return [float(final_answer(c) == str(a)) for c, a in zip(completions, answer)]


def digits(completions: list[Any], answer: list[str], **_: Any) -> list[float]:
    """The share of the answer's characters the last assistant turn has right, place by place from the left,
    over the longer of the two: 1 for the exact answer, partial credit for a near miss (a dense signal on the
    way to `correct`, as repeat_fraction is for the letters task)."""
    scores = []
    for c, a in zip(completions, answer):
        said, a = final_answer(c), str(a)
        n = max(len(said), len(a))
        scores.append(sum(x == y for x, y in zip(said, a)) / n if n else 0.0)
    return scores
