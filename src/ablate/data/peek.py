"""A local data file's column names from its first bytes (a CSV header, the first JSON row, a parquet
schema), without `datasets` or torch: `ablate.run.validate` checks them against the method's formats
before a run dir exists or a model loads. None when the file is not read that cheaply (a
`save_to_disk` dir, a JSON list over `MAX_JSON_BYTES`, an unknown kind, a bad first row): the loader
then checks it, and says what is wrong, as before."""

from __future__ import annotations

import csv
import json
from pathlib import Path

MAX_JSON_BYTES = 64 << 20  # a .json list is parsed whole to see its first object: only when small


def columns(path: Path) -> list[str] | None:
    """The file's column names, by the rules `ablate.data.read_local` reads it by (magic bytes, then
    extension, then the first character)."""
    try:
        if not path.is_file():
            return None
        with path.open("rb") as f:
            head = f.read(4)
        suffix = path.suffix.lower()
        if head == b"PAR1" or suffix in (".parquet", ".pq"):
            import pyarrow.parquet as pq

            return list(pq.read_schema(path).names)
        if suffix in (".csv", ".tsv"):
            with path.open(newline="", encoding="utf-8-sig") as f:
                return next(csv.reader(f, delimiter="\t" if suffix == ".tsv" else ","), None)
        with path.open(encoding="utf-8-sig") as f:
            first = next((line for line in f if line.strip()), "")
        if first.lstrip().startswith("[") and suffix != ".jsonl":
            if path.stat().st_size > MAX_JSON_BYTES:
                return None
            rows = json.loads(path.read_text(encoding="utf-8-sig"))
            return list(rows[0]) if isinstance(rows, list) and rows and isinstance(rows[0], dict) else None
        if suffix in (".jsonl", ".json", ".ndjson") or first.lstrip().startswith("{"):
            row = json.loads(first)
            return list(row) if isinstance(row, dict) else None
    except (OSError, UnicodeDecodeError, ValueError, ImportError):  # the loader names what is wrong
        return None
    return None
