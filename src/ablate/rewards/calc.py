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
