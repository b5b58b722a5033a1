"""Dataset loaders selected by `conf/data/*.yaml`.

Every loader returns a `DataSplits`: the train split, an optional eval split, and (for online methods)
the reward functions that score this task: the data knows how to score itself. `columns` renames a
file's columns to TRL's names (`data.columns.prompt=question`); which format the rows are in (see
`ablate.data.formats`) is checked by the trainers, which know what their method accepts.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from datasets import Dataset, load_dataset, load_from_disk
from datasets.utils.logging import disable_progress_bar, enable_progress_bar, is_progress_bar_enabled

from ablate.errors import DataError, chain
from ablate.rewards import resolve

PACKAGED = Path(__file__).parent / "tiny"


@dataclass
class DataSplits:
    train: Dataset
    eval: Dataset | None = None
    reward_funcs: dict[str, Callable[..., list[float | None]]] = field(default_factory=dict)
    # the tools the prompts are written for (GRPO's method.args.tools default)
    tools: list[Any] = field(default_factory=list)
    max_completion_length: int | None = (
        None  # the tokens a rollout of this task needs (GRPO's default for it)
    )
    mix: dict[str, Any] | None = (
        None  # several sources mixed (ablate.data.mixture): each one's data, weight and rows
    )


def _limit(ds: Dataset | None, n: int | None) -> Dataset | None:
    return ds if ds is None or n is None else ds.select(range(min(n, len(ds))))


def _splits(
    train: Dataset,
    ev: Dataset | None,
    max_train: int | None,
    max_eval: int | None,
    columns: Mapping[str, str | None] | None,
    reward_funcs: Any,
    tools: Any = None,
    max_completion_length: int | None = None,
) -> DataSplits:
    from ablate.data.formats import map_columns

    tools = list(tools or [])
    return DataSplits(
        train=_offer(map_columns(_limit(train, max_train), columns), tools),
        eval=_offer(map_columns(_limit(ev, max_eval), columns), tools),
        reward_funcs=resolve.reward_funcs(reward_funcs),
        tools=tools,
        max_completion_length=max_completion_length,
    )


def _offer(ds: Dataset | None, tools: list[Any]) -> Dataset | None:
    """Rows offering `tools` (data.tools): a `tools` column of their JSON schemas, TRL's per-row column that
    chat templates render (SFT on tool-use demonstrations shows the model what GRPO's prompts will show it).
    Rows with a `tools` column of their own keep it."""
    if ds is None or not tools or "tools" in ds.column_names:
        return ds
    from transformers.utils import get_json_schema

    schemas = json.dumps(
        [get_json_schema(resolve.function(t, f"data.tools[{i}]")) for i, t in enumerate(tools)]
    )
    return ds.add_column("tools", [schemas] * len(ds))


MAX_LINE_BYTES = 1_048_576  # 1 MiB (2**20), ~250k tokens: far past any max_length; a longer line is refused
# what `data=local` reads, named in every error about a file it cannot read
KINDS = (
    "JSON lines (.jsonl), JSON (.json: a list of objects), CSV (.csv, .tsv), parquet (.parquet) "
    "and `save_to_disk` directories"
)
EVAL_SPLITS = ("eval", "validation", "test")  # a saved DatasetDict's eval split, first found


def local(
    train_path: str,
    eval_path: str | None = None,
    max_train_samples: int | None = None,
    max_eval_samples: int | None = None,
    reward_funcs: Any = None,
    columns: Mapping[str, str | None] | None = None,
    max_line_bytes: int = MAX_LINE_BYTES,
    tools: list[Any] | None = None,
    max_completion_length: int | None = None,
) -> DataSplits:
    """Your own data: each path read by what it is, through the `datasets` loaders (see `read_local`).
    A `save_to_disk` DatasetDict given as train_path brings its eval split (eval, validation or test)
    unless eval_path is given. `reward_funcs` (GRPO): any form `ablate.rewards.resolve.reward_funcs`
    takes, e.g. `[myrew.short]`; `tools`: the tools the prompts are written for; `max_completion_length`: the
    tokens a rollout needs (both GRPO's defaults for the method's own fields)."""
    train, saved_eval = read_local(Path(train_path).expanduser(), "train", max_line_bytes)
    ev = read_local(Path(eval_path).expanduser(), "eval", max_line_bytes)[0] if eval_path else saved_eval
    return _splits(
        train, ev, max_train_samples, max_eval_samples, columns, reward_funcs, tools, max_completion_length
    )


jsonl = local  # `data=jsonl`, the older name: one loader reads every kind


def read_local(
    path: Path, split: str, max_line_bytes: int = MAX_LINE_BYTES
) -> tuple[Dataset, Dataset | None]:
    """One local path as a Dataset (plus a saved DatasetDict's eval split): a `save_to_disk` dir; a
    parquet file (by its magic bytes, whatever its name); else by extension: .jsonl JSON lines, .json
    a list of objects or JSON lines, .csv/.tsv; a file of another name is sniffed (`{`: JSON lines, `[`:
    a JSON list). Bad rows of JSON lines are named by line (`check_jsonl`)."""
    if not path.exists():
        raise DataError(f"data: {split} file not found: {path}")
    if path.is_dir():
        return _saved(path, split)
    kind, options = file_kind(path)
    if kind == "jsonl":
        check_jsonl(path, split, max_line_bytes)
    elif kind == "json":
        _check_json_list(path)
    shown = is_progress_bar_enabled()
    disable_progress_bar()  # "Generating train split": local files convert in a moment; nothing to watch
    try:
        ds = load_dataset("json" if kind == "jsonl" else kind, data_files=str(path), split="train", **options)
    except Exception as e:  # datasets wraps parse errors in long chains; keep the first useful line
        raise DataError(_load_error(e, [str(path)], kind)) from e
    finally:
        if shown:
            enable_progress_bar()
    if len(ds) == 0:
        raise DataError(f"data: {split} file {path} has no examples")
    return ds, None


def file_kind(path: Path) -> tuple[str, dict[str, Any]]:
    """The `datasets` builder (and its options) for one file."""
    with path.open("rb") as f:
        head = f.read(4)
    suffix = path.suffix.lower()
    if head == b"PAR1" or suffix in (".parquet", ".pq"):
        return "parquet", {}
    if suffix == ".csv":
        return "csv", {}
    if suffix == ".tsv":
        return "csv", {"sep": "\t"}
    first = _first_char(path)
    if first == "[" and suffix != ".jsonl":
        return "json", {}  # a JSON list of objects
    if suffix in (".jsonl", ".json", ".ndjson") or first == "{":
        return "jsonl", {}
    raise DataError(f"data: cannot tell what {path} is from its name or content; ablate reads {KINDS}")


def _first_char(path: Path) -> str:
    """The first non-blank character of the file's start, "" if none or not text."""
    with path.open("rb") as f:
        start = f.read(4096).lstrip(b"\xef\xbb\xbf \t\r\n")  # a UTF-8 BOM too
    return chr(start[0]) if start and start[0] < 128 else ""


def json_error(e: json.JSONDecodeError) -> str:
    """The decoder's message without its own trailing "at" ("Invalid control character at"), which
    reads "at at column 61" once the position is added."""
    return e.msg.removesuffix(" at")


def _check_json_list(path: Path) -> None:
    """A .json file holding one JSON list: every element an object, or one line saying where not."""
    try:
        rows = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise DataError(f"data: {path} is not UTF-8 text (byte {e.start}); save the file as UTF-8") from None
    except json.JSONDecodeError as e:
        raise DataError(
            f"data: {path} is not valid JSON ({json_error(e)} at line {e.lineno}, column {e.colno})"
        ) from None
    bad = next((i for i, row in enumerate(rows) if not isinstance(row, dict)), None)
    if bad is not None:
        raise DataError(f"data: {path} element {bad} is a JSON {type(rows[bad]).__name__}, not an object")
    if not rows:
        raise DataError(f"data: {path} has no examples")


def _saved(path: Path, split: str) -> tuple[Dataset, Dataset | None]:
    """A `save_to_disk` dir: one Dataset (the split itself), or a DatasetDict (its train split, or
    its only one; and its eval split)."""
    if not (path / "dataset_dict.json").is_file() and not (path / "state.json").is_file():
        raise DataError(
            f"data: {path} is a directory but no `save_to_disk` dataset (no dataset_dict.json or "
            f"state.json); ablate reads {KINDS}"
        )
    try:
        saved = load_from_disk(str(path))
    except Exception as e:  # a damaged dir: one line
        raise DataError(f"data: could not load the saved dataset in {path}: {str(e).splitlines()[0]}") from e
    if isinstance(saved, Dataset):
        return saved, None
    names = list(saved)
    if "train" not in saved and len(names) != 1:
        raise DataError(
            f"data: {path} holds the splits {names}, none named train; save the one to train on alone, "
            "or name it train"
        )
    train = saved["train"] if "train" in saved else saved[names[0]]
    ev = next((saved[s] for s in EVAL_SPLITS if s in saved), None) if split == "train" else None
    return train, ev


def _load_error(e: BaseException, files: list[str], kind: str = "JSON lines") -> str:
    """The line for a failed `load_dataset`: an OS error on a path that is not one of the data files is
    the datasets cache (a read-only HOME), not the data."""
    for cause in chain(e):
        if isinstance(cause, OSError) and cause.filename and str(cause.filename) not in files:
            return (
                f"data: cannot write the datasets cache ({cause.strerror or cause}: {cause.filename}); "
                f"set HF_DATASETS_CACHE (or HF_HOME) to a writable folder"
            )
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return f"data: could not read {', '.join(files)} as {kind}: {first}"


def _row_format(row: dict[str, Any]) -> str | None:
    """Which of TRL's formats a row's columns make (None: no known columns, e.g. before data.columns)."""
    keys = set(row)
    half = {"chosen", "rejected"} & keys
    if len(half) == 1:  # half a pair (a prompt-only row to the loop below)
        return f"{next(iter(half))}-only (no {({'chosen', 'rejected'} - half).pop()})"
    for name, needed in (
        ("preference (chosen, rejected)", {"chosen", "rejected"}),
        ("prompt-completion", {"prompt", "completion"}),
        ("messages", {"messages"}),
        ("ShareGPT conversations", {"conversations"}),
        ("text", {"text"}),
        ("prompt-only", {"prompt"}),
    ):
        if needed <= keys:
            return name
    return None


_rows_checked: set[tuple[str, int, int, int]] = set()  # files whose rows this process has read and passed


def check_jsonl(path: Path, split: str, max_line_bytes: int = MAX_LINE_BYTES) -> None:
    """Name the file and line of the first bad row: `datasets` only says the generation failed. Each file
    (by path, size and mtime) is read once per process: the launch's checks read it before the run dir
    exists (ablate.config.data_checks), the loader then trusts that."""
    if not path.is_file():
        raise DataError(f"data: {split} file not found: {path}")
    stat = path.stat()
    seen = (str(path.resolve()), stat.st_size, stat.st_mtime_ns, max_line_bytes)
    if seen in _rows_checked:
        return
    _check_rows(path, split, max_line_bytes)
    _rows_checked.add(seen)


def _check_rows(path: Path, split: str, max_line_bytes: int) -> None:
    rows, first = 0, None
    try:
        f = path.open("rb")
    except OSError as e:
        raise DataError(
            f"data: {split} file {path}: cannot read it ({e.strerror}); check its permissions"
        ) from None
    with f:
        for number, raw in enumerate(f, start=1):
            if len(raw) > max_line_bytes:
                raise DataError(
                    f"data: {path} line {number} is {len(raw) / 2**20:.1f} MiB, over data.max_line_bytes="
                    f"{max_line_bytes}: one example that long is usually a whole dataset on one line (JSON "
                    f"lines: one example per line); if it is one example, raise data.max_line_bytes"
                )
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise DataError(
                    f"data: {path} line {number} is not UTF-8 text (byte 0x{raw[e.start]:02x} at column "
                    f"{e.start + 1}); save the file as UTF-8" + _kinds_hint(number)
                ) from None
            if not line.strip():
                continue
            try:
                row = json.loads(line.rstrip("\r\n"))  # an error at the line's end: its own column
            except json.JSONDecodeError as e:
                raise DataError(
                    f"data: {path} line {number} is not valid JSON ({json_error(e)} at column {e.colno})"
                    + _kinds_hint(number)
                ) from None
            if not isinstance(row, dict):
                raise DataError(f"data: {path} line {number} is a JSON {type(row).__name__}, not an object")
            fmt = _row_format(row)
            if first is None and fmt is not None:
                first = (number, fmt)
            elif fmt is not None and fmt != first[1] and "only (no " in fmt + first[1]:
                half, pair = (fmt, first[1]) if "only (no " in fmt else (first[1], fmt)
                line = number if half == fmt else first[0]
                raise DataError(
                    f"data: {path} line {line} has half a pair ({half.replace('-only', ' only')}), line "
                    f"{first[0] if line == number else number} a whole {pair} row: a pair needs both answers"
                )
            elif fmt is not None and fmt != first[1]:
                raise DataError(
                    f"data: {path} line {number} is a {fmt} row, line {first[0]} a {first[1]} row: "
                    f"one format per file (put each kind of row in a file of its own)"
                )
            rows += 1
    if rows == 0:
        raise DataError(f"data: {split} file {path} has no examples")


def _kinds_hint(line: int) -> str:
    """After an error on a file's first line: it may be no JSON lines at all."""
    return f" (not JSON lines? ablate reads {KINDS}, by extension or content)" if line == 1 else ""


def packaged(
    name: str,
    with_eval: bool = True,
    max_train_samples: int | None = None,
    max_eval_samples: int | None = None,
    reward_funcs: Any = None,
    columns: Mapping[str, str | None] | None = None,
    max_line_bytes: int = MAX_LINE_BYTES,
    tools: list[Any] | None = None,
    max_completion_length: int | None = None,
) -> DataSplits:
    """Load one of the small datasets shipped inside the package (`ablate/data/tiny/<name>_*.jsonl`)."""
    train = PACKAGED / f"{name}_train.jsonl"
    if not train.is_file():
        known = sorted({p.name.rsplit("_", 1)[0] for p in PACKAGED.glob("*_train.jsonl")})
        raise DataError(f"data: no packaged dataset '{name}'; available: {', '.join(known)}")
    ev = PACKAGED / f"{name}_eval.jsonl"
    return local(
        str(train),
        str(ev) if with_eval and ev.is_file() else None,
        max_train_samples,
        max_eval_samples,
        reward_funcs,
        columns,
        max_line_bytes,
        tools,
        max_completion_length,
    )


def hub(
    path: str,
    name: str | None = None,
    train_split: str = "train",
    eval_split: str | None = None,
    revision: str | None = None,
    max_train_samples: int | None = None,
    max_eval_samples: int | None = None,
    reward_funcs: Any = None,
    columns: Mapping[str, str | None] | None = None,
    tools: list[Any] | None = None,
    max_completion_length: int | None = None,
) -> DataSplits:
    """Load a dataset with `datasets.load_dataset(path, name)`: a hub id, a local dir of data files
    (train.jsonl, test.jsonl, ...), a `save_to_disk` dir (a `DatasetDict` or one `Dataset`), or one
    .jsonl/.json/.parquet/.csv file (train only)."""
    local = Path(path).expanduser()
    builders = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
    from ablate.paths import hub_unreachable

    why = hub_unreachable() if not local.exists() else None
    if why is not None:  # datasets would retry each file 5 times, a warning each, then fail
        raise DataError(
            f"data: cannot load '{path}': {why}; connect to the internet, or save the dataset "
            f"locally (save_to_disk or .jsonl) and give its path (HF_HUB_OFFLINE=1 uses the cache)"
        )
    try:
        if local.is_file() and local.suffix in builders:  # one file: the train split, no eval split
            train = load_dataset(builders[local.suffix], data_files=str(local), split="train")
            return _splits(
                train,
                None,
                max_train_samples,
                max_eval_samples,
                columns,
                reward_funcs,
                tools,
                max_completion_length,
            )
        if (local / "dataset_dict.json").is_file() or (local / "state.json").is_file():
            saved = load_from_disk(str(local))
            if isinstance(saved, Dataset):  # one split saved: it is the train split
                return _splits(
                    saved,
                    None,
                    max_train_samples,
                    max_eval_samples,
                    columns,
                    reward_funcs,
                    tools,
                    max_completion_length,
                )
            for split in (train_split, eval_split):
                if split is not None and split not in saved:
                    raise ValueError(f"no split '{split}' (has {list(saved)})")
            train, ev = saved[train_split], saved[eval_split] if eval_split else None
        else:
            train = load_dataset(path, name, split=train_split, revision=revision)
            ev = load_dataset(path, name, split=eval_split, revision=revision) if eval_split else None
    except (ConnectionError, FileNotFoundError, ValueError) as e:  # offline, unknown id or split
        raise DataError(f"data: cannot load '{path}': {str(e).splitlines()[0]}") from e
    return _splits(
        train, ev, max_train_samples, max_eval_samples, columns, reward_funcs, tools, max_completion_length
    )
