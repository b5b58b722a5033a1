"""Eval prompts that also occur in the training data: a metric on them measures recall of a training
example, not what the model does on a prompt it never saw, so held-out numbers overstate.

A row's prompt is what it asks, compared after normalising its whitespace (case is kept: it can be the
task): a string prompt itself; a list of chat messages its user turns, in order (system prompts and
answers left out, so the same question under another system prompt still counts); a `messages`
conversation (SFT) its user turns; an implicit-prompt pair the shared prefix TRL takes as its prompt; a
`text` row (no prompt) the whole text; rows already tokenised their prompt ids. Nothing here needs torch.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from typing import Any

from ablate.data.formats import extract_prompt, is_messages, to_chatml

# columns a prompt is read from
ASKS = ("prompt_ids", "prompt", "chosen", "rejected", "messages", "conversations", "text")


def _content(value: Any) -> str:
    """A message's content as text: a string, or the text parts of a list of content parts."""
    if isinstance(value, list):
        value = " ".join(p.get("text", "") if isinstance(p, Mapping) else str(p) for p in value)
    return " ".join(str(value or "").split())


def prompt_key(row: Mapping[str, Any]) -> Hashable | None:
    """The row's prompt, normalised (module docstring); None when it has none to compare."""
    row = to_chatml(dict(row))
    if row.get("prompt_ids") is not None:
        return tuple(row["prompt_ids"])
    prompt = row.get("prompt")
    if prompt is None and row.get("chosen") is not None and row.get("rejected") is not None:
        prompt = extract_prompt(row["chosen"], row["rejected"])["prompt"]
    if prompt is None:
        prompt = row.get("messages", row.get("text"))
    if is_messages(prompt):
        users = tuple(_content(m.get("content")) for m in prompt if m.get("role") == "user")
        return users or None
    return _content(prompt) or None


def shared_prompts(
    train: Iterable[Mapping[str, Any]], held_out: Iterable[Mapping[str, Any]]
) -> tuple[int, int]:
    """(eval rows whose prompt occurs in the training rows, eval rows)."""
    seen = {prompt_key(row) for row in train}
    keys = [prompt_key(row) for row in held_out]
    return sum(k is not None and k in seen for k in keys), len(keys)


def asked(dataset: Any) -> Iterable[Mapping[str, Any]]:
    """A `datasets.Dataset`'s rows, only the columns a prompt is read from (no images or long extras)."""
    return dataset.select_columns([c for c in ASKS if c in dataset.column_names])


def warning(shared: int, total: int, train_name: str) -> str | None:
    """The one line a user sees when held-out prompts are not held out; None when none is shared."""
    if not shared:
        return None
    return (
        f"warning: {shared} of {total} eval prompts also occur in the training data ({train_name}): "
        f"held-out metrics will overstate"
    )
