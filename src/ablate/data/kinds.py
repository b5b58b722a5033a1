"""The kinds of data ablate's methods train on, in one registry read before torch is imported.

A method names its kind once: `data_kind` in its YAML (conf/method/*.yaml; a method that starts from another
through its defaults list, as ORPO from DPO or a user's trainer subclass, inherits it; null: the data is not
checked). For each kind the registry holds:

- `formats`: TRL's dataset formats it accepts, each the columns that identify it (first match wins);
- `optional`: the columns it also reads when a row has them (reward modelling's `margin`, a chat's `tools`);
- `ids`: the columns of rows already tokenised, which a trainer of the user's may take as they are
  (examples/custom_batch): they skip the format check;
- `tokenize`: the function that tokenises a dataset of its rows (the trainer's), `row`: the one that
  tokenises one row (`ablate data preview` shows its output);
- `preview`: what `ablate data preview` says it marks in each row.

ablate.config.data_checks checks a data file's header against the method's kind before the run dir exists;
ablate.train checks the loaded datasets again (a loader of the user's, a hub dataset). Nothing here imports
torch, datasets or a tokenizer.
"""

from __future__ import annotations

from dataclasses import dataclass

from ablate.errors import ConfigError, DataError

CHAT = ("tools", "chat_template_kwargs")  # per-row chat template arguments, as TRL passes them


@dataclass(frozen=True)
class Kind:
    method: str  # the methods it is for, in the words of a refusal
    formats: tuple[tuple[str, tuple[str, ...]], ...]  # (TRL's format name, the columns that identify it)
    optional: tuple[str, ...]  # columns read when present
    ids: tuple[str, ...]  # already tokenised rows: the format check is skipped
    tokenize: str  # the function that tokenises a dataset of these rows
    row: str  # the function that tokenises one row
    preview: str  # what `ablate data preview` marks in a row
    read_as: tuple[tuple[str, str], ...] = ()  # (a column, the format's column it is converted to)


# prompt: the two's shared start
PAIRS = (
    ("preference", ("prompt", "chosen", "rejected")),
    ("implicit-prompt preference", ("chosen", "rejected")),
)
TOKENIZE = "ablate.data.tokenize."

KINDS: dict[str, Kind] = {
    "preference": Kind(
        method="DPO",
        formats=PAIRS,
        optional=CHAT,
        ids=("prompt_ids", "chosen_ids", "rejected_ids"),
        tokenize=TOKENIZE + "prepare_preference",
        row=TOKENIZE + "tokenize_preference",
        preview="loss tokens",
    ),
    "sft": Kind(
        method="SFT",
        formats=(
            ("prompt-completion", ("prompt", "completion")),
            ("language modeling (conversational)", ("messages",)),  # or ShareGPT's `conversations`
            ("language modeling (standard)", ("text",)),
        ),
        optional=CHAT,
        ids=("prompt_ids", "completion_ids"),
        tokenize=TOKENIZE + "prepare_sft",
        row=TOKENIZE + "tokenize_sft",
        preview="loss tokens",
        read_as=(("conversations", "messages"),),  # ShareGPT, converted by ablate.data.formats.to_chatml
    ),
    # GRPO, RLOO, distillation: completions are sampled; every other column reaches the reward functions
    "prompt": Kind(
        method="GRPO",
        formats=(("prompt-only", ("prompt",)),),
        optional=CHAT,
        ids=("prompt_ids",),
        tokenize=TOKENIZE + "prepare_prompts",
        row=TOKENIZE + "tokenize_prompt",
        preview="prompts only: completions are sampled",
    ),
    # reward modelling: preference pairs, each side scored whole (prompt + completion); `margin`: by how
    # much the chosen must win (TRL's)
    "reward": Kind(
        method="reward modelling",
        formats=PAIRS,
        optional=("margin", *CHAT),
        ids=("chosen_ids", "rejected_ids"),
        tokenize="ablate.data.reward.prepare_reward",
        row="ablate.data.reward.tokenize_reward",
        preview="each side scored whole, at its last token",
    ),
    # KTO: TRL's unpaired format (a desirable/undesirable `label` per completion), or pairs it unpairs
    "unpaired": Kind(
        method="KTO",
        formats=(("unpaired preference", ("prompt", "completion", "label")), *PAIRS),
        optional=(),
        ids=("prompt_ids", "completion_ids", "label"),
        tokenize="ablate.data.unpaired.prepare_unpaired",
        row=TOKENIZE + "tokenize_sft",
        preview="loss tokens",
    ),
}

# every column a kind reads: the roles `data.columns.<role>=<your column>` may map a file's columns onto
COLUMNS = tuple(dict.fromkeys(c for k in KINDS.values() for _, cols in k.formats for c in cols + k.optional))


def kind(name: str | None, key: str = "method.data_kind") -> Kind | None:
    """The registry's entry for a method's `data_kind` (None: not checked), or one line naming the kinds."""
    if name is None:
        return None
    if name not in KINDS:
        raise ConfigError(
            f"{key}={name}: no such kind of data; one of {', '.join(KINDS)} "
            f"(ablate.data.kinds), or null for data ablate does not check"
        )
    return KINDS[name]


def tokenized(name: str, found: list[str]) -> bool:
    """Rows already tokenised for a method of kind `name`."""
    return set(KINDS[name].ids) <= set(found)


def detect_columns(found: list[str], name: str, method: str | None = None) -> str:
    """The format (its TRL name) of rows with columns `found` for a method of kind `name`, or one line
    naming the columns found, the formats expected and the columns the closest one misses. `method`: the
    method's name (`method.name`), said where the kind's words do not name it (method=distill)."""
    cols = set(found)
    cols |= {to for column, to in KINDS[name].read_as if column in cols}
    words, formats = KINDS[name].method, KINDS[name].formats
    for fmt, needed in formats:
        if set(needed) <= cols:
            return fmt
    expected = "; ".join(f"{fmt}: {', '.join(needed)}" for fmt, needed in formats)
    fmt, needed = min(formats, key=lambda f: len(set(f[1]) - cols))  # the closest: fewest missing (first)
    missing = ", ".join(repr(c) for c in needed if c not in cols)
    who = words if method is None or method.lower() in words.lower() else f"method={method}"
    raise DataError(
        f"data: {who} found columns {sorted(found)}, expected one of [{expected}]: missing "
        f"{missing} ({fmt}; rename with data.columns.<role>=<your column>)"
    )
