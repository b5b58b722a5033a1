"""A content-addressed cache of what a sweep's jobs would otherwise each compute again: the tokenized
dataset, DPO's precomputed reference log-probs and the initial policy's eval forwards at step 0
(ablate.methods.initial_eval) (config: the `cache` group, `cache=off`).

An entry's key is the sha256 of everything that could change one bit of it: the rows themselves (not
the file's name or date), the tokenizer's saved files and chat template, every argument, the model's
weights, precision, device and thread count, the versions of torch/transformers/datasets and the
source of ablate and of the trainer's classes (any code change misses). A hit is therefore the same
bytes a computation would give (tests/integration/test_cache_losses.py trains with and without it:
bitwise equal losses).

Entries live in `<dir>/<kind>/<key>/` (dir: `cache.dir`, else `$ABLATE_CACHE/entries`, by default
~/.cache/ablate/entries), each a `save_to_disk` dataset in `data/` and `manifest.json`, written last,
with every file's sha256. An entry is built in a `.tmp-*` dir and renamed into place, so a writer
killed mid-way (kill -9) leaves no entry; one whose manifest or checksum does not match is said in one
line, removed and computed again. Jobs racing for one key take a file lock (filelock's FileLock: a
flock, which the kernel drops when its holder dies, kill -9 included): one computes, the others wait
and load. `ablate cache ls|clear` lists and removes entries: only dirs proven to be
ablate's (a `<kind>/<sha256>` dir holding the marker file written before anything else, or a manifest),
so a `--dir` pointed at a folder of other things never deletes them (`foreign` names what is left).
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import json
import logging
import os
import platform
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from datasets import Dataset
from filelock import FileLock

from ablate.paths import cache_root
from ablate.schema import nodes

log = logging.getLogger("ablate")
MANIFEST = "manifest.json"
DATA = "data"
KINDS = ("tokenized", "ref_logps", "initial_eval")  # what ablate caches (the first level of the cache dir)
MARKER = ".ablate-cache-entry"  # written first into every entry being built: proves a dir is ablate's
_ENTRY_NAME = re.compile(r"[0-9a-f]{64}")  # an entry's dir: its key's sha256
_TMP_NAME = re.compile(r"\.tmp-[0-9a-f]{64}-\d+")  # an entry being written (or left by a killed writer)
_LOCK_NAME = re.compile(r"[0-9a-f]{64}\.lock")
_SOURCE = Path(__file__).resolve().parents[1]  # the ablate package: its code is part of every key


def default_dir() -> Path:
    """`$ABLATE_CACHE/entries` (default ~/.cache/ablate/entries; XDG_CACHE_HOME respected)."""
    return cache_root() / "entries"


class Cache:
    """The cache a trainer uses (`conf/cache/`): `enabled` false computes everything, as before.
    `events` lists this run's hits and misses (run.json's `cache`)."""

    def __init__(self, enabled: bool = nodes.Cache.enabled, dir: str | None = nodes.Cache.dir) -> None:
        self.enabled = enabled
        self.dir = Path(dir).expanduser() if dir else default_dir()
        self.events: list[dict[str, Any]] = []

    def record(self) -> dict[str, Any]:
        """What run.json says: where the entries are and each lookup's outcome."""
        return {"enabled": self.enabled, "dir": str(self.dir), "entries": self.events}

    def dataset(
        self, kind: str, what: str, key: Callable[[], Mapping[str, Any]], compute: Callable[[], Dataset]
    ) -> Dataset:
        """The entry of `key()` (a dict of strings and numbers; not computed when the cache is off)
        loaded, or `compute()`d and stored. Warnings the computation logged are stored with it and
        said again on a hit."""
        with self.slot(kind, what, key) as slot:
            if slot.found is not None:
                return slot.found
            with _said() as said:
                out = compute()
            slot.store(out, said)
            return out

    @contextlib.contextmanager
    def slot(self, kind: str, what: str, key: Callable[[], Mapping[str, Any]]) -> Iterator[Slot]:
        """The entry of `key()` held (its lock taken) for the block: `slot.found` is the loaded dataset on a
        hit, else None, and the block computes it and calls `slot.store(dataset)`. For results made
        while something else runs (the initial policy's eval forwards, recorded during the eval)."""
        slot = Slot(self, kind, what)
        if not self.enabled:
            yield slot
            return
        slot.t0 = time.perf_counter()
        try:
            parts = key()
        except Exception as e:  # e.g. weights it cannot read: no key, no reuse, same result
            log.warning(
                "cache: cannot key %s (%s: %s); computing it without the cache", what, type(e).__name__, e
            )
            yield slot
            return
        digest = key_digest(kind, parts)
        entry = self.dir / kind / digest
        held = contextlib.ExitStack()
        try:
            entry.parent.mkdir(parents=True, exist_ok=True)
            # racing jobs: one computes, the rest wait
            held.enter_context(FileLock(entry.parent / f"{digest}.lock"))
        except OSError as e:  # a read-only or full disk: the cache only saves time
            log.warning("cache: cannot use %s (%s); computing %s without it", self.dir, e.strerror or e, what)
            yield slot
            return
        with held:
            found = load(entry)
            if found is not None:
                for line in found[1].get("said", []):
                    log.warning("%s", line)
                self._event(kind, what, digest, True, slot.t0)
                log.info(
                    "cache: %s loaded (%s/%s, %.1f s)", what, kind, digest[:12], time.perf_counter() - slot.t0
                )
                slot.found = found[0]
            else:
                slot.entry, slot.digest, slot.parts = entry, digest, dict(parts)
            yield slot

    def _event(self, kind: str, what: str, digest: str, hit: bool, t0: float) -> None:
        self.events.append(
            {
                "what": what,
                "entry": f"{kind}/{digest[:16]}",
                "hit": hit,
                "seconds": round(time.perf_counter() - t0, 3),
            }
        )


class Slot:
    """One lookup of `Cache.slot`: `found` (a hit's dataset) or, on a miss, where `store` writes."""

    def __init__(self, cache: Cache, kind: str, what: str) -> None:
        self.cache, self.kind, self.what = cache, kind, what
        self.found: Dataset | None = None
        self.entry: Path | None = None  # set on a miss with the cache on: the entry to write
        self.digest, self.parts, self.t0 = "", {}, 0.0

    def store(self, dataset: Dataset, said: list[str] | None = None) -> None:
        """Write the computed `dataset` as the entry (nothing when the cache is off or this was a hit)."""
        if self.entry is None:
            return
        store(
            self.entry,
            dataset,
            {
                "kind": self.kind,
                "what": self.what,
                "rows": len(dataset),
                "said": said or [],
                "parts": self.parts,
            },
        )
        self.cache._event(self.kind, self.what, self.digest, False, self.t0)
        self.entry = None


@contextlib.contextmanager
def _said() -> Iterator[list[str]]:
    """The warning lines logged on the "ablate" logger meanwhile (e.g. "dropped 3 of 512 pairs")."""
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    handler = Keep(logging.WARNING)
    log.addHandler(handler)
    try:
        yield lines
    finally:
        log.removeHandler(handler)


# ---- entries on disk ----


def load(entry: Path) -> tuple[Dataset, dict[str, Any]] | None:
    """The entry's dataset and manifest, or None: absent, or damaged (said in one line, removed)."""
    if not entry.exists():
        return None
    why = check(entry)
    if why is None:
        from datasets import load_from_disk

        try:  # in memory: datasets would write its select/map cache files into a mapped entry's dir
            return load_from_disk(str(entry / DATA), keep_in_memory=True), json.loads(
                (entry / MANIFEST).read_text()
            )
        except Exception as e:  # any unreadable entry is recomputed
            why = f"unreadable ({type(e).__name__})"
    log.warning("cache: entry %s/%s is %s; recomputing it", entry.parent.name, entry.name[:12], why)
    shutil.rmtree(entry, ignore_errors=True)
    return None


def check(entry: Path) -> str | None:
    """Why `entry` cannot be used (no manifest: never finished; a file missing or changed), or None."""
    try:
        manifest = json.loads((entry / MANIFEST).read_text())
        files = manifest["files"]
    except FileNotFoundError:
        return "incomplete (no manifest)"
    except (OSError, ValueError, KeyError, TypeError):
        return "corrupt (unreadable manifest)"
    for name, sha in files.items():
        try:
            if file_sha256(entry / name) != sha:
                return f"corrupt ({name}: checksum mismatch)"
        except OSError:
            return f"incomplete ({name} missing)"
    return None


def store(entry: Path, dataset: Dataset, meta: dict[str, Any]) -> None:
    """Write `dataset` as `entry` atomically: a tmp dir, the manifest last, one rename. The caller
    holds the entry's lock; a failed write (disk full) is said in one line and leaves no entry."""
    from datasets.utils.logging import disable_progress_bar, enable_progress_bar, is_progress_bar_enabled

    for stale in entry.parent.glob(f".tmp-{entry.name}-*"):  # a writer killed mid-way (we hold the lock)
        shutil.rmtree(stale, ignore_errors=True)
    tmp = entry.parent / f".tmp-{entry.name}-{os.getpid()}"
    shown = is_progress_bar_enabled()
    disable_progress_bar()
    try:
        tmp.mkdir()
        (tmp / MARKER).write_text("an entry of ablate's reuse cache (ablate.data.cache)\n")
        dataset.save_to_disk(str(tmp / DATA))
        files = {
            str(p.relative_to(tmp)): file_sha256(p) for p in sorted((tmp / DATA).rglob("*")) if p.is_file()
        }
        size = sum((tmp / f).stat().st_size for f in files)
        manifest = {**meta, "files": files, "bytes": size, "created": time.strftime("%Y-%m-%dT%H:%M:%S")}
        _write_synced(tmp / MANIFEST, json.dumps(manifest, indent=1, default=str))
        if entry.exists():  # a damaged one the load above did not remove
            shutil.rmtree(entry)
        os.replace(tmp, entry)
    except OSError as e:
        log.warning(
            "cache: could not store %s/%s (%s); the run goes on without it",
            entry.parent.name,
            entry.name[:12],
            e.strerror or e,
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if shown:
            enable_progress_bar()


def _write_synced(path: Path, text: str) -> None:
    """Write and fsync every file of the entry's dir first, then the manifest: a crash leaves no
    manifest naming a file whose bytes never reached the disk."""
    for p in path.parent.rglob("*"):
        if p.is_file():
            with p.open("rb") as f:
                os.fsync(f.fileno())
    with path.open("w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def ours(path: Path) -> bool:
    """Whether `path` is proven to be an entry ablate wrote (or is writing): `<kind>/<sha256>` (or its
    `.tmp-<sha256>-<pid>`) under one of KINDS, holding the marker or a manifest with its files."""
    if path.parent.name not in KINDS or not path.is_dir() or path.is_symlink():
        return False
    if not (_ENTRY_NAME.fullmatch(path.name) or _TMP_NAME.fullmatch(path.name)):
        return False
    if (path / MARKER).is_file():
        return True
    try:  # an entry from before the marker: its manifest lists its files
        return isinstance(json.loads((path / MANIFEST).read_text()).get("files"), dict)
    except (OSError, ValueError, AttributeError):
        return False


def entries(root: Path) -> list[dict[str, Any]]:
    """Every entry of ablate's under `root` (`ours`), with its manifest's facts (an entry without one:
    `incomplete`); a `.tmp-*` dir (being written, or left by a killed writer) is none."""
    out = []
    for kind in KINDS:
        kind_dir = root / kind
        for entry in sorted(p for p in kind_dir.iterdir() if ours(p)) if kind_dir.is_dir() else []:
            if entry.name.startswith(".tmp-"):
                continue
            try:
                manifest = json.loads((entry / MANIFEST).read_text())
            except (OSError, ValueError):
                manifest = {"what": "incomplete (no manifest)"}
            size = sum(p.stat().st_size for p in entry.rglob("*") if p.is_file())
            out.append(
                {
                    "kind": kind,
                    "entry": entry.name,
                    "what": manifest.get("what", ""),
                    "bytes": size,
                    "rows": manifest.get("rows"),
                    "created": manifest.get("created", ""),
                    "path": str(entry),
                }
            )
    return out


def leftovers(root: Path, kind: str) -> list[Path]:
    """Entries a killed writer left half-written under `root/kind` (ablate's own `.tmp-*` dirs)."""
    kind_dir = root / kind
    return [p for p in kind_dir.glob(".tmp-*") if ours(p)] if kind_dir.is_dir() else []


def foreign(root: Path) -> list[str]:
    """What under `root` is not ablate's (paths relative to it): anything beside the kind dirs, and in
    a kind dir anything but entries, their lock files and their half-written `.tmp-*` dirs."""
    if not root.is_dir():
        return []
    out = [p.name for p in sorted(root.iterdir()) if p.name not in KINDS or not p.is_dir()]
    for kind in KINDS:
        if (root / kind).is_dir() and not (root / kind).is_symlink():
            out += [
                f"{kind}/{p.name}"
                for p in sorted((root / kind).iterdir())
                if not ours(p) and not (_LOCK_NAME.fullmatch(p.name) and p.is_file())
            ]
    return out


# ---- digests: the parts of a key ----


def tokenized_key(dataset: Dataset, tokenizer: Any, trainer: type, args: Mapping[str, Any]) -> dict[str, Any]:
    """A tokenized dataset's key: its rows, the tokenizer (files, chat template), every tokenization
    argument (`args`: lengths, loss masks), the code (ablate's, the trainer's) and library versions."""
    return {
        "rows": rows_digest(dataset),
        "tokenizer": tokenizer_digest(tokenizer),
        "args": dict(args),
        "code": code_digest(trainer),
        "libraries": environment(),
    }


def key_digest(kind: str, key: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps({"kind": kind, **key}, sort_keys=True, default=str).encode()).hexdigest()


def file_sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def rows_digest(dataset: Dataset) -> str:
    """sha256 of a dataset's rows as they are (features and every value, in order), whatever the Arrow
    layout they are stored in (chunks, slices, memory-mapped or not): the same rows give the same digest."""
    h = hashlib.sha256(str(dataset.features).encode())
    for table in dataset.with_format("arrow").iter(batch_size=8192):
        for name in table.column_names:
            h.update(name.encode())
            _hash_values(h, table.column(name).combine_chunks())
    return h.hexdigest()


def _hash_values(h: Any, values: Any) -> None:
    """Arrow values into `h`, layout-free: lists as their lengths then their flattened values, numbers
    as their bytes, anything else (text, structs) as JSON."""
    import pyarrow as pa
    import pyarrow.compute as pc

    t = values.type
    h.update(str(t).encode())
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        h.update(
            pc.list_value_length(values)
            .fill_null(-1)
            .to_numpy(zero_copy_only=False)
            .astype("int64")
            .tobytes()
        )
        _hash_values(h, pc.list_flatten(values))
    elif (pa.types.is_integer(t) or pa.types.is_floating(t)) and values.null_count == 0:
        h.update(values.to_numpy(zero_copy_only=False).tobytes())
    else:
        h.update(json.dumps(values.to_pylist(), sort_keys=True, default=str).encode())


def tokenizer_digest(tokenizer: Any) -> str:
    """sha256 of the tokenizer's saved files (vocabulary, merges, special tokens, chat template) and
    of its class's source when it is not the library's (e.g. the tiny byte tokenizer)."""
    h = hashlib.sha256(type(tokenizer).__qualname__.encode())
    h.update(str(getattr(tokenizer, "chat_template", None)).encode())
    with tempfile.TemporaryDirectory(prefix="ablate-tok-") as tmp:
        tokenizer.save_pretrained(tmp)
        for p in sorted(Path(tmp).rglob("*")):
            if p.is_file():
                h.update(p.name.encode())
                h.update(p.read_bytes())
    h.update(code_digest(type(tokenizer)).encode())
    return h.hexdigest()


def weights_digest(model: Any) -> str:
    """sha256 of the model's class, config and every tensor of its state dict (names, dtypes, bytes)."""
    h = hashlib.sha256(type(model).__qualname__.encode())
    config = getattr(model, "config", None)
    if config is not None:
        h.update(config.to_json_string(use_diff=False).encode())
        h.update(str(getattr(config, "_attn_implementation", None)).encode())
    for name, tensor in model.state_dict().items():
        hash_tensor(h, name, tensor)
    return h.hexdigest()


def hash_tensor(h: Any, name: str, tensor: Any) -> None:
    """A named tensor into `h`: its name, dtype, shape, then its bytes."""
    import torch

    t = tensor.detach()
    h.update(f"{name}|{t.dtype}|{tuple(t.shape)}".encode())
    h.update(t.reshape(-1).contiguous().view(torch.uint8).cpu().numpy().tobytes())


def code_digest(*classes: type) -> str:
    """sha256 of ablate's own source and of the source files of `classes` and their bases that are
    neither ablate's nor a library's pinned by version (a trainer or tokenizer of your own)."""
    h = hashlib.sha256()
    for p in sorted(_SOURCE.rglob("*.py")):
        h.update(p.read_bytes())
    files = set()
    for cls in classes:
        for base in inspect.getmro(cls):
            if base.__module__.split(".")[0] in ("ablate", "builtins", "transformers", "torch", "tokenizers"):
                continue
            with contextlib.suppress(TypeError, OSError):
                files.add(inspect.getsourcefile(base))
    for f in sorted(x for x in files if x):
        h.update(Path(f).read_bytes())
    return h.hexdigest()


def environment() -> dict[str, Any]:
    """Library versions (behaviour changes with them), for every key."""
    import datasets
    import tokenizers
    import torch
    import transformers

    return {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "datasets": datasets.__version__,
        "tokenizers": tokenizers.__version__,
        "python": platform.python_version(),
    }


def device_facts(device: Any) -> dict[str, Any]:
    """What a forward's bits depend on beyond the model and the inputs: device type and model, CPU
    instruction set, thread count (a reduction's blocking), matmul precision, CUDA/cuDNN versions."""
    import torch

    from ablate.models.precision import fp32_precision

    facts: dict[str, Any] = {
        "type": str(getattr(device, "type", device)),
        "machine": platform.machine(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "threads": torch.get_num_threads(),
        # TF32 and the like, per op, through torch's new API (ablate.models.precision)
        "fp32_precision": fp32_precision(torch),
        "deterministic": torch.are_deterministic_algorithms_enabled(),
    }
    if facts["type"] == "cuda":
        facts.update(
            name=torch.cuda.get_device_name(device),
            cuda=torch.version.cuda,
            cudnn=torch.backends.cudnn.version(),
        )
    return facts
