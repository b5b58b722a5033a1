"""`_prepare_dataset` for the trainers whose rows are tokenized once and then reused: the method's rows
-> token ids by its function of ablate.data.tokenize, from the reuse cache (ablate.data.cache) when a
run has tokenized the same rows with the same tokenizer, trainer and arguments before."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, ClassVar

from datasets import Dataset
from transformers import PreTrainedTokenizerBase

from ablate.data import cache as reuse


class TokenizedRows:
    """Mixed into a trainer that has a `cache` (ablate.data.cache.Cache)."""

    tokenize: ClassVar[Callable[..., Dataset]]  # ablate.data.tokenize's prepare_* for the method's rows
    row: ClassVar[str]  # what one row is, in the cache's listing: pair, example
    tokenize_args: ClassVar[tuple[str, ...]]  # the method.args fields that change the tokens

    def _prepare_dataset(
        self, dataset: Dataset, tokenizer: PreTrainedTokenizerBase, args: Any, name: str
    ) -> Dataset:
        options = {k: getattr(args, k) for k in self.tokenize_args}
        out = self.cache.dataset(  # type: ignore[attr-defined]
            "tokenized",
            f"tokenized {name} {self.row}s",
            lambda: reuse.tokenized_key(dataset, tokenizer, type(self), options),
            lambda: type(self).tokenize(dataset, tokenizer, name=name, **options),
        )
        if {"chosen_ids", "rejected_ids"} <= set(out.column_names):  # pairs: said from the cache too
            warn_same_pairs(out, name)
        return out


def warn_same_pairs(pairs: Dataset, name: str) -> None:
    """Pairs whose chosen is their rejected, token for token, teach no preference (the margin is 0 whatever
    the weights; ORPO's and CPO's NLL terms still train on them): said once, as reward modelling says it
    (ablate.data.reward refuses a set of only such pairs: a reward model learns nothing else from them)."""
    same = [
        i
        for i, row in enumerate(pairs.select_columns(["chosen_ids", "rejected_ids"]))
        if row["chosen_ids"] == row["rejected_ids"]
    ]
    if same:
        logging.getLogger("ablate").warning(
            "%d of %d %s pairs have a chosen identical to their rejected (row %d first): they teach no "
            "preference (the margin is 0 whatever the model); check the data's columns",
            len(same),
            len(pairs),
            name,
            same[0],
        )
