"""Several datasets in one run (`data=mix`): each source is a data config of its own (any loader, file kind,
TRL format and `columns`, as `data=` takes), and the mix draws each source's share of rows by weight, by seed.

How many rows a source gives: its weight's share of `size`, rounded by largest remainder so that the counts
sum to `size` exactly (weights 3 and 1: 75% and 25% of the rows, not about that, as the probabilities of
`datasets.interleave_datasets` would give). `size: null` is the largest mix that repeats no row: the source
that runs out first at its share bounds it. A source's rows are the start of one permutation of it, fixed
by the mix's seed and the source's name, so a larger weight adds rows and never swaps them; a share larger
than the source repeats it in whole passes, each in a new order. The drawn rows are then shuffled by the seed.

Eval: every source's eval split, whole, one after another, whatever the weights: runs that sweep the
weights are evaluated on the same rows.

Columns: a column the sources hold in different types (a prompt as text in one source, as chat messages
in another) is stored as JSON (`datasets.Json`), and each row reads back its own value; a column one
source lacks is null in its rows. The rows' kinds must agree (ablate.data.formats.ROW_KINDS): one method
trains on all of them. The tokenized-rows cache keys on the mixed rows themselves, so it covers every
source, weight, size and seed.
"""

from __future__ import annotations

import json
import logging
import zlib
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

import numpy as np
from datasets import Dataset, Json, concatenate_datasets

from ablate.data import DataSplits, _splits
from ablate.data.formats import mixed_kinds, row_kind
from ablate.errors import DataError

log = logging.getLogger("ablate")
IDENTITY = ("_target_", "name", "train_path", "eval_path", "path")  # what names a source's data, in run.json


def mix(
    sources: Mapping[str, Any], seed: int = 0, size: int | None = None, reward_funcs: Any = None
) -> DataSplits:
    """The sources (name -> a data config plus its `weight`, default 1) mixed into one DataSplits; `mix`,
    its record for run.json, says each source's data, weight, share and rows."""
    from ablate.schema import plain
    from ablate.schema.nodes import Mix

    Mix.of({"sources": plain(sources), "seed": seed, "size": size}).check("data")
    names = list(sources)
    weights = [Fraction(plain(sources[n]).get("weight", 1)) for n in names]
    loaded = [_load(name, sources[name]) for name in names]
    _same_kind(names, [d.train for d in loaded])
    trains, evals = _aligned([d.train for d in loaded], [d.eval for d in loaded])
    counts = shares(weights, [len(t) for t in trains], size)
    parts = [t.select(draw(len(t), c, seed, n)) for t, c, n in zip(trains, counts, names)]
    train = concatenate_datasets(parts)
    train = train.select(np.random.default_rng(seed).permutation(len(train)))
    present = [e for e in evals if e is not None]
    out = _splits(train, concatenate_datasets(present) if present else None, None, None, None, reward_funcs)
    out.mix = {
        "seed": seed,
        "size": len(train),
        "sources": {
            n: {
                **_identity(sources[n]),
                "weight": float(w),
                "share": round(float(w / sum(weights)), 4),
                "rows": c,
                "available": len(t),
                "eval_rows": 0 if e is None else len(e),
                "kind": row_kind(t.column_names),
            }
            for n, w, c, t, e in zip(names, weights, counts, trains, evals)
        },
    }
    for n, w, c in zip(names, weights, counts):
        if w > 0 and c == 0:
            log.warning(
                "data.sources.%s: weight %s gives it 0 of the %d rows; raise its weight or data.size",
                n,
                float(w),
                len(train),
            )
    return out


def shares(weights: list[Fraction], available: list[int], size: int | None) -> list[int]:
    """Rows per source: `size` (None: the most that repeats no row) split by the weights, by largest
    remainder (ties to the earlier source), in exact arithmetic so that counts never pass `available`
    when `size` is None."""
    total = sum(weights)
    if size is None:
        size = min(n * total // w for n, w in zip(available, weights) if w > 0)
    exact = [w * size / total for w in weights]
    counts = [int(x) for x in exact]  # floor: every x >= 0
    by_remainder = sorted(range(len(exact)), key=lambda i: (-(exact[i] - counts[i]), i))
    for i in by_remainder[: size - sum(counts)]:
        counts[i] += 1
    return counts


def draw(rows: int, count: int, seed: int, name: str) -> np.ndarray:
    """`count` row indices of a source of `rows` rows: the start of its passes, each a permutation seeded by
    the mix's seed and the source's name (crc32: the same in every process, unlike `hash`)."""
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    passes = -(-count // rows) if rows else 0
    return np.concatenate([rng.permutation(rows) for _ in range(passes)] or [np.zeros(0, np.int64)])[:count]


def _load(name: str, node: Any) -> DataSplits:
    """One source by its own loader (its `_target_`; interpolations resolved, its `weight` left out), a
    loader's one-line error named by the source's key."""
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate

    from ablate.schema import plain

    cfg = {k: v for k, v in plain(node).items() if k != "weight"}
    try:
        data = instantiate(cfg)
    except InstantiationException as e:  # Hydra wraps the loader's own error
        cause = e.__cause__ or e
        raise DataError(f"data.sources.{name}: {str(cause).removeprefix('data: ').splitlines()[0]}") from e
    except DataError as e:
        raise DataError(f"data.sources.{name}: {str(e).removeprefix('data: ')}") from e
    if not isinstance(getattr(data, "train", None), Dataset):
        raise DataError(f"data.sources.{name}: its loader ({cfg.get('_target_')}) gave no train Dataset")
    return data


def _identity(node: Any) -> dict[str, Any]:
    from ablate.schema import plain

    values = plain(node)
    return {k.strip("_"): values[k] for k in IDENTITY if values.get(k) is not None}


def _same_kind(names: list[str], trains: list[Dataset]) -> None:
    """The sources' rows are of one kind (`ROW_KINDS`), or one line naming two that differ."""
    kinds = [row_kind(t.column_names) for t in trains]
    first = next(((n, k) for n, k in zip(names, kinds) if k is not None), None)
    for name, kind in zip(names, kinds):
        if first is not None and kind is not None and kind != first[1]:
            raise DataError(mixed_kinds(first[0], first[1], name, kind))


def _aligned(
    trains: list[Dataset], evals: list[Dataset | None]
) -> tuple[list[Dataset], list[Dataset | None]]:
    """The splits with every column the sources hold in different types as JSON, so that they concatenate."""
    types: dict[str, set[str]] = {}
    for ds in [*trains, *evals]:
        for col, feature in ds.features.items() if ds is not None else ():
            types.setdefault(col, set()).add(repr(feature))
    clash = {col for col, found in types.items() if len(found) > 1}
    return [_as_json(t, clash) for t in trains], [
        _as_json(e, clash) if e is not None else None for e in evals
    ]


def _as_json(ds: Dataset, columns: set[str]) -> Dataset:
    """`columns` of `ds` stored as JSON text (datasets' Json feature decodes it back to each row's value). The
    text is `json.dumps` of the value: Json keeps a string that parses as JSON as is, so "42" must become
    "\"42\""."""
    here = sorted(c for c in columns if c in ds.column_names)
    if not here:
        return ds
    features = ds.features.copy()
    for col in here:
        features[col] = Json()
    return ds.map(
        lambda row: {c: json.dumps(row[c]) for c in here}, features=features, desc="Mixing columns as JSON"
    )
