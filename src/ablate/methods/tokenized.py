"""`_prepare_dataset` for the trainers whose rows are tokenized once and then reused: the method's rows
-> token ids by its function of ablate.data.tokenize, from the reuse cache (ablate.data.cache) when a
run has tokenized the same rows with the same tokenizer, trainer and arguments before."""

from __future__ import annotations

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
        return self.cache.dataset(  # type: ignore[attr-defined]
            "tokenized",
            f"tokenized {name} {self.row}s",
            lambda: reuse.tokenized_key(dataset, tokenizer, type(self), options),
            lambda: type(self).tokenize(dataset, tokenizer, name=name, **options),
        )
