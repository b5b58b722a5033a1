"""TRL's dataset formats: which one a dataset is in, and the row rewrites TRL applies before tokenising.

Formats (TRL 1.16 names), each *standard* (strings) or *conversational* (lists of {role, content}):

  preference               prompt, chosen, rejected           DPO, reward modelling, KTO (unpaired)
  preference, implicit     chosen, rejected (prompt = their shared prefix, as TRL's `extract_prompt`)
  prompt-completion        prompt, completion                 SFT (loss on the completion)
  language modeling        messages (conversational) or text  SFT (loss on every token)
  prompt-only              prompt                             GRPO, RLOO, distillation
  unpaired preference      prompt, completion, label          KTO (label: true = desirable)

ShareGPT rows (`conversations`: [{from, value}]) become `messages` as in TRL. Extra columns are kept
(GRPO's reward functions receive them). Which formats each method takes: ablate.data.kinds. Nothing here
needs torch or a tokenizer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

from ablate.data.kinds import COLUMNS, detect_columns, tokenized
from ablate.errors import DataError

if TYPE_CHECKING:  # no datasets import at run time: ablate.config.data_checks checks a file's columns with `detect_columns`
    from datasets import Dataset

KNOWN = ("prompt", "chosen", "rejected", "completion", "messages", "text")  # the text columns: strings or messages
# the kind of rows a dataset's columns hold, whatever the method (first match wins): the sources of one mix
# (ablate.data.mixture) must agree on it, since one method trains on all of them
ROW_KINDS: list[tuple[str, tuple[tuple[str, ...], ...]]] = [
    ("unpaired preference", (("prompt", "completion", "label"),)),
    ("preference", (("chosen", "rejected"),)),
    ("SFT", (("prompt", "completion"), ("messages",), ("conversations",), ("text",))),
    ("prompt-only", (("prompt",),)),
]


def row_kind(columns: list[str]) -> str | None:
    """The kind (`ROW_KINDS`) of rows with these columns; None: none known (a loader of the user's, tokenized rows)."""
    found = set(columns)
    return next((kind for kind, sets in ROW_KINDS if any(set(s) <= found for s in sets)), None)


def mixed_kinds(a: str, kind_a: str, b: str, kind_b: str) -> str:
    """The line for two sources of a mix whose rows are of different kinds (before the run, from the files'
    columns: ablate.config.data_checks; else when the mix is loaded: ablate.data.mixture)."""
    return (f"data.sources: '{a}' holds {kind_a} rows, '{b}' {kind_b} rows; a mix is of one kind, as one method "
            f"trains on all of it (kinds: {', '.join(k for k, _ in ROW_KINDS)}): drop one (~data.sources.{b})")


def map_columns(dataset: Dataset | None, columns: Mapping[str, str | None] | None) -> Dataset | None:
    """`data.columns.prompt=question`: rename the file's `question` column to `prompt` (and so on).

    A column that already holds the target name is dropped first: the user said which one to use.
    """
    if dataset is None or not columns:
        return dataset
    wanted = _wanted(dataset.column_names, columns)
    clash = [dst for src, dst in wanted.items() if dst in dataset.column_names and dst not in wanted]
    return dataset.remove_columns(clash).rename_columns({s: d for s, d in wanted.items() if s != d})


def _wanted(found: list[str], columns: Mapping[str, str | None]) -> dict[str, str]:
    """{file's column: TRL's name} from `data.columns`, each checked (a known role, a column the file has)."""
    wanted = {src: dst for dst, src in columns.items() if src}
    for dst in wanted.values():
        if dst not in COLUMNS:
            raise DataError(f"data.columns.{dst}: unknown role; known: {', '.join(COLUMNS)}")
    missing = [src for src in wanted if src not in found]
    if missing:
        raise DataError(f"data.columns: no column {missing} in the data (found {list(found)})")
    return wanted


def mapped_columns(found: list[str], columns: Mapping[str, str | None] | None) -> list[str]:
    """The column names `map_columns` would leave, from the names alone (a file's header)."""
    wanted = _wanted(found, columns or {})
    return [wanted.get(c, c) for c in found if c not in wanted.values() or c in wanted]


def is_messages(value: Any) -> bool:
    """A list of {role, content} dicts (TRL's `is_conversational` test for one value)."""
    return isinstance(value, list) and bool(value) and isinstance(value[0], dict) and "role" in value[0]


def detect(dataset: Dataset, kind: str, method: str | None = None) -> str:
    """The format name of `dataset` for a method of `kind` (ablate.data.kinds; `method`: its name), or a
    one-line error naming the columns found, the formats expected and what the closest one misses."""
    return detect_columns(list(dataset.column_names), kind, method)


def check_shape(kind: str | None, *datasets: Dataset | None, method: str | None = None) -> dict[str, Any]:
    """Once the datasets are loaded, before the model is built: DataError (one line) unless every dataset
    given (None: skipped) is in a format of the method's `kind` (`method.data_kind`; None: not checked), or
    already tokenised. A local file's header was checked before the run (ablate.config.data_checks); this sees
    every loader's rows (`method`: its name, for the line). Returns how the first (the train split) is
    formatted (`describe`: run.json's `data_format`)."""
    for ds in datasets:
        if kind is not None and ds is not None and not tokenized(kind, ds.column_names):
            detect(ds, kind, method)
    return describe(datasets[0], kind)


def conversational(dataset: Dataset) -> bool:
    """Whether the rows are chat messages (TRL's `is_conversational`, on the first row): their prompts
    went through the chat template in training, so a prompt given to the trained model must too."""
    if len(dataset) == 0:
        return False
    row = dataset[0]
    return "conversations" in row or any(is_messages(row.get(c)) for c in KNOWN)


def describe(dataset: Dataset, kind: str | None) -> dict[str, Any]:
    """How the rows were formatted, for run.json (`data_format`) and `ablate generate`: the format's
    name (None for a method of no kind, or rows already tokenised) and whether it is conversational."""
    tokens = kind is None or tokenized(kind, dataset.column_names)
    name = None if tokens else detect(dataset, kind)
    return {"format": name, "conversational": conversational(dataset)}


def to_chatml(row: dict[str, Any]) -> dict[str, Any]:
    """ShareGPT `conversations` [{from, value}] -> `messages` [{role, content}], as TRL's
    `maybe_convert_to_chatml` (roles are kept as written: use user/assistant, not human/gpt)."""
    conv = row.get("conversations")
    if row.get("messages") is not None or not isinstance(conv, list):  # a mix's messages rows: conversations null
        return row
    return {**row, "messages": [{"role": m.get("from", m.get("role")), "content": m.get("value", m.get("content"))}
                                if isinstance(m, dict) else m for m in conv]}


def extract_prompt(chosen: Any, rejected: Any) -> dict[str, Any]:
    """TRL's `extract_prompt`, exactly: the longest common prefix of chosen and rejected (messages or
    characters) becomes the prompt, minus a trailing space. Quirk kept for parity: when one is a prefix
    of the other the last shared element stays in the completions."""
    idx = 0
    for idx in range(min(len(chosen), len(rejected))):
        if chosen[idx] != rejected[idx]:
            if chosen[idx - 1] == " ":  # remove space before the prompt
                idx -= 1
            break
    return {"prompt": chosen[:idx], "chosen": chosen[idx:], "rejected": rejected[idx:]}


def preference_row(row: dict[str, Any], index: int) -> dict[str, Any]:
    """prompt/chosen/rejected with an explicit prompt, extracting it where TRL's `maybe_extract_prompt`
    does: no prompt column, or a string prompt beside conversational chosen/rejected (UltraFeedback)."""
    chosen, rejected = row["chosen"], row["rejected"]
    conv = is_messages(chosen)
    if conv != is_messages(rejected):
        raise DataError(f"data: row {index}: chosen and rejected must both be strings or both lists of messages")
    if "prompt" in row and row["prompt"] is not None and is_messages(row["prompt"]) == conv:
        return {"prompt": row["prompt"], "chosen": chosen, "rejected": rejected}
    out = extract_prompt(chosen, rejected)
    if not out["prompt"]:
        raise DataError(f"data: row {index}: no prompt column and chosen/rejected share no prefix to use as one")
    if conv and (not out["chosen"] or not out["rejected"]):
        raise DataError(f"data: row {index}: chosen and rejected are the same conversation up to the end of one")
    return out


# Chat roles the chat templates know (OpenAI's and TRL's; Gemma's `model`); any other renders as the
# template pleases (often as nothing, or as a user turn): ShareGPT's human/gpt must become user/assistant.
ROLES = ("system", "user", "assistant", "tool", "developer", "model")
COMPLETIONS = ("chosen", "rejected", "completion", "text")  # what the loss is on: never empty


def check_text(value: Any, column: str, conv: bool, index: int) -> None:
    """One line for a cell of the wrong shape (a number, None, a list of non-messages, mixed formats),
    an empty completion (nothing to learn from), or a message whose role no chat template knows."""
    if conv and not is_messages(value):
        raise DataError(f"data: row {index}: '{column}' must be a list of {{role, content}} messages like the "
                        f"prompt, got {type(value).__name__}")
    if not conv and not isinstance(value, str):
        raise DataError(f"data: row {index}: '{column}' must be a string (or every text column a list of "
                        f"{{role, content}} messages), got {type(value).__name__}")
    if column in COMPLETIONS and not (value.strip() if isinstance(value, str) else value):
        raise DataError(f"data: row {index}: '{column}' is empty (nothing to learn from); remove the row or fill it")
    for message in value if conv else []:
        role = message.get("role") if isinstance(message, dict) else None
        if role not in ROLES:
            renamed = {"human": "user", "gpt": "assistant", "bot": "assistant"}.get(str(role))
            fix = f"rename it to '{renamed}'" if renamed else f"use one of {', '.join(ROLES)}"
            raise DataError(f"data: row {index}: '{column}' has a message with role '{role}', which chat templates "
                            f"do not know: {fix}")


def check_rows(dataset: Dataset) -> None:
    """`check_text` on every text cell, before tokenising: a bad row is named at once, before a
    progress bar is drawn and before the rows above it are tokenised. Each cell is judged by its own
    shape (string or messages); what goes with what (chosen and rejected alike) is checked per row
    when tokenising. ShareGPT `conversations` are checked once converted, when tokenising."""
    columns = [c for c in KNOWN if c in dataset.column_names]
    for index, row in enumerate(dataset.select_columns(columns)):
        for column in columns:
            value = row[column]
            if value is not None:  # an optional column (a prompt beside implicit-prompt rows)
                check_text(value, column, is_messages(value), index)
