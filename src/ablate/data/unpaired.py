"""KTO's data, as TRL 1.16's KTOTrainer prepares it: unpaired examples (prompt, completion, label), from
TRL's unpaired format or from preference pairs, tokenised, with the mismatched completions of the KL
estimate.

- preference pairs are unpaired as TRL's `unpair_preference_dataset` does: each pair gives a desirable
  (chosen, label true) and an undesirable (rejected, label false) example with the same prompt, in TRL's
  order (per block of 1000 pairs, every chosen before every rejected); a prompt-less pair gets its prompt
  extracted first (TRL's `extract_prompt`);
- then (ablate's departure) the examples are shuffled once with the data seed. KTO reads its examples in
  a fixed order (its KL pairs are fixed when the data is prepared, so TRL samples sequentially); in TRL's
  order a batch holds one label only, and a short run never sees an undesirable example. Fixed by the
  seed, the shuffled order is as fixed as TRL's;
- prompt and prompt + completion are tokenised as TRL does (ablate.data.tokenize.tokenize_sft: strings get
  EOS after the completion, messages the chat template; the completion starts where the two diverge);
  examples whose prompt alone fills `max_length` are dropped (nothing left to learn from); data of one label
  only (every example desirable, or every one undesirable) trains, as in TRL, and is said once;
- `KL_completion_ids`: the completions rotated by one within each chunk of `batch_size` examples, so
  example i of a batch is paired with completion i - 1 of the same batch (TRL's `add_kl_completion_ids`).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from datasets import Dataset, Features, Json, List, Value
from transformers import PreTrainedTokenizerBase

from ablate.data.formats import check_rows, detect, preference_row
from ablate.data.tokenize import _finish, bars_if_large, tokenize_sft, truncate
from ablate.errors import DataError

log = logging.getLogger("ablate")
UNPAIR_BLOCK = 1000  # rows per block of TRL's unpairing (datasets' default map batch size)


def unpair(dataset: Dataset) -> Dataset:
    """Preference pairs -> prompt / completion / label (TRL's order); unpaired rows as they are."""
    if {"prompt", "completion", "label"} <= set(dataset.column_names):
        return dataset
    extra = [c for c in dataset.column_names if c not in ("prompt", "chosen", "rejected")]
    features = _json_features(dataset, extra)

    def block(rows: dict[str, list[Any]], indices: list[int]) -> dict[str, list[Any]]:
        pairs = [preference_row({k: rows[k][i] for k in rows}, index) for i, index in enumerate(indices)]
        out = {
            "prompt": [p["prompt"] for p in pairs] * 2,
            "completion": [p["chosen"] for p in pairs] + [p["rejected"] for p in pairs],
            "label": [True] * len(pairs) + [False] * len(pairs),
        }
        out |= {k: rows[k] * 2 for k in extra}
        if features is not None:  # JSON text, which datasets' Json keeps as it is: a string "42" stays one
            out |= {k: [json.dumps(v) for v in out[k]] for k, f in features.items() if isinstance(f, Json)}
        return out

    return dataset.map(
        block,
        batched=True,
        batch_size=UNPAIR_BLOCK,
        with_indices=True,
        features=features,
        remove_columns=dataset.column_names,
        desc="Unpairing preference pairs",
    )


def _json_features(dataset: Dataset, extra: list[str]) -> Features | None:
    """The unpaired rows' features when the pairs hold a column as JSON (a mix of text and chat sources,
    ablate.data.mixture): a batched map would write each cell back through datasets' Json, which reads a
    string that parses as JSON ("42", "true") as that value. None otherwise: the types are inferred, as
    before."""
    found = dataset.features
    if not any(isinstance(f, Json) for f in found.values()):
        return None
    return Features(
        {
            "prompt": found["chosen"],
            "completion": found["chosen"],
            "label": Value("bool"),
            **{k: found[k] for k in extra},
        }
    )


def prepare_unpaired(
    dataset: Dataset,
    tokenizer: PreTrainedTokenizerBase,
    max_length: int | None,
    seed: int,
    kl_batch_size: int | None,
    name: str = "train",
) -> Dataset:
    """Any KTO format -> prompt_ids / completion_ids / label (+ KL_completion_ids with `kl_batch_size`)."""
    detect(dataset, "unpaired")
    check_rows(dataset)
    rows = unpair(dataset).shuffle(seed=seed).flatten_indices()
    if not all(isinstance(v, bool) for v in rows["label"]):
        raise DataError(
            f"data: the {name} data's 'label' column must hold true (desirable) or false (undesirable)"
        )
    _say_if_one_label(rows["label"], name)

    def fn(row: dict[str, Any], index: int) -> dict[str, Any]:
        ids = tokenize_sft(tokenizer, {"prompt": row["prompt"], "completion": row["completion"]}, index)
        out = truncate(ids, max_length)
        return {**ids, "label": row["label"], "keep": out is not None}

    features = Features(
        {
            "prompt_ids": List(Value("int64")),
            "completion_ids": List(Value("int64")),
            "label": Value("bool"),
            "keep": Value("bool"),
        }
    )
    with bars_if_large(len(rows)):
        tokenized = rows.map(
            fn,
            with_indices=True,
            remove_columns=rows.column_names,
            features=features,
            desc=f"Tokenizing {name} examples",
        )
    kept = tokenized.filter(lambda row: row["keep"], desc=f"Dropping fully truncated {name} examples")
    kept = _finish(rows, kept.remove_columns("keep"), name, "example", "raise method.args.max_length")
    if kl_batch_size is None:
        return kept

    def rotate(batch: dict[str, list[Any]]) -> dict[str, list[Any]]:
        return {**batch, "KL_completion_ids": batch["completion_ids"][-1:] + batch["completion_ids"][:-1]}

    return kept.map(rotate, batched=True, batch_size=kl_batch_size, desc=f"Pairing {name} KL completions")


def _say_if_one_label(labels: list[bool], name: str) -> None:
    """Data of one label trains, as in TRL, but KTO's loss then only raises (or only lowers) its examples'
    reward against the KL baseline: nothing to contrast them with, which is rarely what was meant. Said
    once."""
    if labels and len(set(labels)) == 1:
        kind, other = (
            ("desirable (label true)", "undesirable (label false)")
            if labels[0]
            else ("undesirable (label false)", "desirable (label true)")
        )
        log.warning(
            "every %s example (%d) is %s: KTO has no %s example to contrast them with, and only moves "
            "these against its KL baseline; add some, or check the data's 'label' column",
            name,
            len(labels),
            kind,
            other,
        )
