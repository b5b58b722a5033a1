"""Preference pairs tokenised for a reward model, as TRL 1.16's RewardTrainer does: each side is one whole
sequence, prompt + completion, scored by the model's last token.

- any preference format (explicit or implicit prompt, strings or messages: ablate.data.formats);
- strings: EOS appended to each completion's text (unless it ends with it), prompt + completion tokenised
  as one text with the tokenizer's own special tokens; messages: prompt + completion through the chat
  template (whose end-of-turn ends the sequence);
- a `margin` column (TRL's: how much the chosen must win by) is kept, as a float per pair (one that is no
  finite number is refused, naming its row);
- pairs whose chosen is their rejected teach nothing: all of them is refused, some are said once;
- pairs with either side longer than `max_length` are dropped (TRL filters them; the score is read at
  the last token, so a cut sequence would be scored on text it does not end with).
"""

from __future__ import annotations

import logging
import math
from typing import Any

from datasets import Dataset, Features, List, Value
from transformers import PreTrainedTokenizerBase

from ablate.data.formats import check_rows, detect, is_messages, preference_row
from ablate.data.tokenize import _chat_kwargs, _ids, _with_eos, bars_if_large
from ablate.errors import DataError

log = logging.getLogger("ablate")


def tokenize_reward(
    tokenizer: PreTrainedTokenizerBase, row: dict[str, Any], index: int = 0
) -> dict[str, list[int]]:
    """A preference row -> chosen_ids / rejected_ids, each the whole prompt + completion sequence."""
    pair = preference_row(row, index)
    if is_messages(pair["chosen"]):
        kw = _chat_kwargs(row)
        return {
            f"{side}_ids": _ids(tokenizer, pair["prompt"] + pair[side], **kw)
            for side in ("chosen", "rejected")
        }
    eos = tokenizer.eos_token
    return {
        f"{side}_ids": _ids(tokenizer, pair["prompt"] + _with_eos(pair[side], eos))
        for side in ("chosen", "rejected")
    }


def prepare_reward(
    dataset: Dataset, tokenizer: PreTrainedTokenizerBase, max_length: int | None, name: str = "train"
) -> Dataset:
    """Any preference format -> chosen_ids / rejected_ids (+ margin), pairs over `max_length` dropped."""
    detect(dataset, "reward")
    check_rows(dataset)
    has_margin = "margin" in dataset.column_names

    def fn(row: dict[str, Any], index: int) -> dict[str, Any]:
        out = tokenize_reward(tokenizer, row, index)
        if has_margin:
            out["margin"] = _margin(row["margin"], name, index)
        return out

    features = {"chosen_ids": List(Value("int64")), "rejected_ids": List(Value("int64"))}
    features |= {"margin": Value("float32")} if has_margin else {}
    with bars_if_large(len(dataset)):
        tokenized = dataset.map(
            fn,
            with_indices=True,
            remove_columns=dataset.column_names,
            features=Features(features),
            desc=f"Tokenizing {name} pairs",
        )
    _check_pairs_differ(tokenized, name)
    if max_length is None:
        return tokenized
    kept = tokenized.filter(
        lambda r: len(r["chosen_ids"]) <= max_length and len(r["rejected_ids"]) <= max_length,
        desc=f"Dropping {name} pairs over max_length",
    )
    if len(kept) == 0:
        raise DataError(
            f"data: every {name} pair is longer than method.args.max_length={max_length} tokens; raise it"
        )
    if len(kept) < len(tokenized):
        log.warning(
            "dropped %d of %d %s pairs longer than max_length=%d (raise method.args.max_length)",
            len(tokenized) - len(kept),
            len(tokenized),
            name,
            max_length,
        )
    return kept


def _margin(value: Any, name: str, index: int) -> float:
    """A row's `margin` as a finite float, or one line naming the row."""
    try:
        margin = float(value)
    except (TypeError, ValueError):
        margin = math.nan
    if isinstance(value, bool) or not math.isfinite(margin):
        raise DataError(
            f"data: {name} row {index}: margin={value!r} is not a number (TRL's margin: how much the chosen "
            "must win by, a finite float); fix the row, or remove the column"
        )
    return margin


def _check_pairs_differ(pairs: Dataset, name: str) -> None:
    """A pair whose chosen is its rejected, token for token, teaches nothing (r_c - r_r is 0 whatever the
    model): all of them is refused, some said once."""
    same = [i for i, (c, r) in enumerate(zip(pairs["chosen_ids"], pairs["rejected_ids"])) if c == r]
    if same and len(same) == len(pairs):
        raise DataError(
            f"data: every {name} pair's chosen is identical to its rejected ({len(same)} pairs): a reward "
            "model learns nothing from them (r_c - r_r is 0 whatever its weights); check the data's columns"
        )
    if same:
        log.warning(
            "%d of %d %s pairs have a chosen identical to their rejected (row %d first): they teach nothing",
            len(same),
            len(pairs),
            name,
            same[0],
        )
