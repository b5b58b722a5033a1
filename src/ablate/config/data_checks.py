"""The checks of a run's data and local files, before the run dir exists and before torch is imported
(ablate.config.validate runs them): the files exist and can be read, a local file's columns fit the method
and a JSON-lines file's rows are sound (each row read once), a model or teacher dir holds a readable config
(a teacher's a causal LM's), method=distill without a teacher is on the data its scripted teacher knows, an
eval split exists when evaluation is asked for, the datasets cache can be written, and the reuse cache's dir
is a dir."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from ablate.config.hints import at
from ablate.errors import ConfigError
from ablate.paths import local_model_path

MIX = "ablate.data.mixture.mix"  # data=mix: its sources are the data configs the run loads


def data_nodes(cfg: DictConfig) -> list[tuple[str, DictConfig]]:
    """The data configs a run loads, each with its key: `data`, or each source of a mix
    (`data.sources.NAME`)."""
    data = at(cfg, "data")
    if not isinstance(data, DictConfig):
        return []
    sources = data.get("sources") if str(data.get("_target_", "")) == MIX else None
    if isinstance(sources, DictConfig):
        return [
            (f"data.sources.{name}", node) for name, node in sources.items() if isinstance(node, DictConfig)
        ]
    return [("data", data)]


def check_eval_data(cfg: DictConfig, swept: frozenset[str]) -> None:
    """Evaluation asked for, with data whose loader (a known one) has no eval split (a mix: no source has
    one)."""
    strategy = at(cfg, "method.args.eval_strategy")
    if strategy in (None, "no") or "method.args.eval_strategy" in swept:
        return
    lacking = [(key, _no_eval(node)) for key, node in data_nodes(cfg)]
    if lacking and all(field_ is not None for _, field_ in lacking):
        key, field_ = lacking[0]
        fix = f"{key}.with_eval=true" if field_ == "with_eval" else f"{key}.{field_}=..."
        whose = "the data has no eval split" if key == "data" else "no source of the mix has an eval split"
        raise ConfigError(
            f"method.args.eval_strategy={strategy} but {whose}: add {fix}, "
            f"or leave evaluation off (method.args.eval_strategy=no)"
        )


def _no_eval(data: DictConfig) -> str | None:
    """The field that would give `data` an eval split when its loader (a known one) has none; else None."""
    target = str(data.get("_target_", ""))
    # data=local: a save_to_disk dir as train_path may bring its own eval split
    local = (
        "eval_path",
        lambda: data.get("eval_path") is None and not Path(str(data.get("train_path"))).expanduser().is_dir(),
    )
    missing = {
        "ablate.data.local": local,
        "ablate.data.jsonl": local,
        "ablate.data.hub": ("eval_split", lambda: data.get("eval_split") is None),
        "ablate.data.packaged": (
            "with_eval",
            lambda: not data.get("with_eval", True) or not packaged_eval(data),
        ),
    }
    return missing[target][0] if target in missing and missing[target][1]() else None


def packaged_eval(data: DictConfig) -> bool:
    return packaged_file(data, "eval").is_file()


def packaged_file(data: DictConfig, split: str) -> Path:
    """A shipped dataset's file (`ablate.data.packaged`)."""
    return Path(__file__).resolve().parents[1] / "data" / "tiny" / f"{data.get('name')}_{split}.jsonl"


def check_paths(cfg: DictConfig) -> None:
    """Data files and a local model dir exist (checked before the model is loaded)."""
    for at_, data in data_nodes(cfg):
        for key in ("train_path", "eval_path"):
            path = data.get(key)
            local = Path(path).expanduser() if isinstance(path, str) else None
            if local is not None and not local.is_file() and not saved_dataset(local):
                what = (
                    "is a directory but no save_to_disk dataset (no dataset_dict.json or state.json)"
                    if local.is_dir()
                    else "not found"
                )
                raise ConfigError(f"{at_}.{key}={path}: {what}")
            if isinstance(path, str) and not os.access(Path(path).expanduser(), os.R_OK):
                raise ConfigError(
                    f"{at_}.{key}={path}: not readable (permission denied); check its permissions (ls -l)"
                )
    for key, node in _model_nodes(cfg):
        path = node.get("path")
        why = local_model_path(path) if isinstance(path, str) else None
        if why is not None:
            _check_model_dir(Path(path).expanduser(), f"{key}.path={path}", key == "teacher", why)


# loads its `path`: a local dir or a hub id (ablate.paths.local_model_path tells which)
PRETRAINED = "ablate.models.pretrained"


def _model_nodes(node: Any, key: str = "") -> list[tuple[str, DictConfig]]:
    """Every node that loads a model from its `path` by `from_pretrained` (model, teacher, a reference given
    a model of its own), each with its key; an interpolation (`${model}`) is its source's. A reward model's
    path is a local dir, always: ablate.rewards.reward_model.model_dir checks it."""
    if isinstance(node, ListConfig):
        items = [(str(i), i) for i in range(len(node))]
    elif isinstance(node, DictConfig):
        items = [(str(k), k) for k in node if k != "hydra"]
    else:
        return []
    here = [(key, node)] if isinstance(node, DictConfig) and str(node.get("_target_")) == PRETRAINED else []
    for name, k in items:
        if not OmegaConf.is_interpolation(node, k):
            here += _model_nodes(node[k], f"{key}.{name}" if key else name)
    return here


def _check_model_dir(local: Path, given: str, teacher: bool, why: str = "a path") -> None:
    """A local model dir (model.path, teacher.path: `why` it is read as one, ablate.paths.local_model_path)
    holds a save_pretrained model whose config.json can be read; a teacher's is a causal LM (a reward
    model's sequence classifier has no next-token distribution)."""
    from ablate.rewards.reward_model import read_config

    config = local / "config.json"
    # a +peft run's model/ loads too
    if not config.is_file() and not (local / "adapter_config.json").is_file():
        what = "no config.json there" if local.exists() else "not found"
        if not local.exists() and why != "a path":  # it could have been meant as a hub id: say why not
            what += f"; read as a local path: {why}"
        raise ConfigError(f"{given} is not a save_pretrained directory ({what})")
    if not config.is_file():
        return
    try:
        archs = read_config(config, f"{given}: ").get("architectures") or []
    except OSError:
        return  # unreadable: the loader says so
    classifier = next((str(a) for a in archs if str(a).endswith("ForSequenceClassification")), None)
    if teacher and classifier is not None:
        raise ConfigError(
            f"{given} holds a {classifier} (a reward model), not a causal LM: distillation learns the "
            f"teacher's next-token distribution; give a causal LM's dir (e.g. a method=sft run's model/)"
        )


def check_data_columns(cfg: DictConfig, swept: frozenset[str]) -> None:
    """A local or shipped file's columns (its header: ablate.data.peek) match a format of the method's kind
    (`method.data_kind`, ablate.data.kinds), after `data.columns`: a file of the wrong columns is one line
    before the run dir exists and before torch is imported, not a failed run 10 s later. The sources of a mix
    hold rows of one kind, whatever the method."""
    from ablate.data import kinds, peek
    from ablate.data.formats import mapped_columns, mixed_kinds, row_kind
    from ablate.errors import DataError

    name = None if "method.data_kind" in swept else at(cfg, "method.data_kind")
    kinds.kind(name)  # a kind the registry has
    method = str(at(cfg, "method.name", ""))
    # rows already tokenised: ablate's trainers tokenise their rows themselves; a user's may keep them as they
    # are
    ids_ok = not str(at(cfg, "method.trainer._target_", "")).startswith("ablate.")
    splits = ("train", "eval") if at(cfg, "method.args.eval_strategy") not in (None, "no") else ("train",)
    found_kinds: list[tuple[str, str]] = []
    for node_key, data in data_nodes(cfg):
        for split in splits:
            key, value, path = _file(data, split)
            found = peek.columns(path) if path is not None and f"{node_key}.{key}" not in swept else None
            if found is None:
                continue
            try:
                columns = data.get("columns")
                found = mapped_columns(found, OmegaConf.to_container(columns) if columns else None)
                if name is not None and not (ids_ok and kinds.tokenized(name, found)):
                    kinds.detect_columns(found, name, method)
            except DataError as e:  # a mix's source: its own columns node
                why = str(e).removeprefix("data: ").replace("data.columns", f"{node_key}.columns")
                raise ConfigError(f"{node_key}.{key}={value}: {why}") from None
            if split == "train" and row_kind(found) is not None:
                found_kinds.append((node_key.rsplit(".", 1)[-1], row_kind(found)))
    other = next((k for k in found_kinds if k[1] != found_kinds[0][1]), None)
    if other is not None:
        raise ConfigError(mixed_kinds(*found_kinds[0], *other))


def _file(data: DictConfig, split: str) -> tuple[str, Any, Path | None]:
    """The key naming a data config's `split` file, its value, and the file when ablate reads it (a local
    loader's path, a shipped dataset's file), else None."""
    target = str(data.get("_target_"))
    if target in LOCAL_LOADERS:
        value = data.get(f"{split}_path")
        return f"{split}_path", value, Path(value).expanduser() if isinstance(value, str) else None
    if target == "ablate.data.packaged" and (split == "train" or data.get("with_eval", True)):
        return "name", data.get("name"), packaged_file(data, split)
    return "", None, None


def check_data_rows(cfg: DictConfig, swept: frozenset[str]) -> None:
    """A local JSON-lines file's rows (the data's, or each source's of a mix), each read once
    (`ablate.data.check_jsonl`: UTF-8, JSON objects, one format per file, no line over data.max_line_bytes,
    not empty): a mistake in any row is refused before the run dir exists, in the loader's words (a mix's
    source named as its loader names it, ablate.data.mixture); the loader does not read a file this process
    checked again."""
    from ablate.data import MAX_LINE_BYTES, check_jsonl, file_kind
    from ablate.errors import DataError

    for node_key, data in data_nodes(cfg):
        if str(data.get("_target_")) not in LOCAL_LOADERS:
            continue
        for key, split in (("train_path", "train"), ("eval_path", "eval")):
            path = data.get(key)
            swept_here = f"{node_key}.{key}" in swept or "data" in swept
            local = Path(path).expanduser() if isinstance(path, str) and not swept_here else None
            if local is None or not local.is_file():
                continue
            try:
                if file_kind(local)[0] == "jsonl":
                    check_jsonl(local, split, data.get("max_line_bytes", MAX_LINE_BYTES))
            except DataError as e:
                source = "" if node_key == "data" else f"{node_key}: "
                raise ConfigError(source + (str(e).removeprefix("data: ") if source else str(e))) from None


SCRIPTED_TEACHER = (
    "ablate.models.teachers.letter_teacher"  # knows data=tiny_repeat's task alone (its docstring)
)


def check_teacher(cfg: DictConfig, hc: Any, swept: frozenset[str]) -> None:
    """method=distill with no +teacher distils from the scripted teacher of the packaged letter task: on any
    other data it would teach that task's letters, silently. Other data needs a real teacher."""
    if str(at(cfg, "method.trainer.teacher._target_", "")) != SCRIPTED_TEACHER or any(
        k.startswith("data") for k in swept
    ):
        return
    if (
        str(at(cfg, "data._target_", "")) == "ablate.data.packaged"
        and at(cfg, "data.name") == "repeat_letter"
    ):
        return
    data = OmegaConf.select(hc, "runtime.choices.data", default="") if hc is not None else ""
    raise ConfigError(
        f"method=distill with data={data or '...'} needs a teacher: without +teacher the teacher is the "
        "scripted one of data=tiny_repeat's letter task, which knows nothing of other prompts; give "
        "yours: +teacher=local teacher.path=DIR (a causal LM's save_pretrained dir, e.g. a finished "
        "run's model/), +teacher=smollm2_135m or +teacher=tiny (conf/teacher/)"
    )


LOCAL_LOADERS = ("ablate.data.local", "ablate.data.jsonl")
# through datasets' cache
DATA_LOADERS = ("ablate.data.local", "ablate.data.jsonl", "ablate.data.packaged", "ablate.data.hub", MIX)


def check_datasets_cache(cfg: DictConfig) -> None:
    """`datasets` writes every file it loads into its cache: a read-only HOME would fail the run after
    its dir exists, in words about the data files. Where the cache goes is datasets' own rule."""
    if str(at(cfg, "data._target_", "")) not in DATA_LOADERS:
        return
    env = os.environ
    home = env.get("HF_HOME") or os.path.join(
        env.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "huggingface"
    )
    cache = Path(env.get("HF_DATASETS_CACHE") or os.path.join(home, "datasets")).expanduser()
    existing = cache
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not os.access(existing, os.W_OK | os.X_OK):
        where = "" if existing == cache else f" ({existing} is not writable)"
        raise ConfigError(
            f"the datasets cache {cache} cannot be written{where}: data files are cached there; set "
            f"HF_DATASETS_CACHE (or HF_HOME) to a writable folder, e.g. HF_DATASETS_CACHE=/tmp/hf_datasets"
        )


def saved_dataset(path: Path) -> bool:
    """A `save_to_disk` dir (data=local reads it)."""
    return (path / "dataset_dict.json").is_file() or (path / "state.json").is_file()


def check_cache_dir(cfg: DictConfig) -> None:
    """The reuse cache's dir (`cache.dir`, else under $ABLATE_CACHE) is not under a file: the run would
    go on without its cache, saying so at each lookup, and with no cached speed probe either."""
    from ablate.paths import cache_root

    given = at(cfg, "cache.dir")
    for key, path in (("cache.dir", given), ("ABLATE_CACHE", os.environ.get("ABLATE_CACHE"))):
        above = Path(str(path)).expanduser() if path else None
        while above is not None and not above.exists() and above != above.parent:
            above = above.parent
        if above is not None and above.exists() and not above.is_dir():
            where = "" if above == Path(str(path)).expanduser() else f" ({above} is a file)"
            raise ConfigError(
                f"{key}={path} is a file, not a directory{where}: the cache needs a directory of its own"
                f" (unset it for the default, {cache_root() if key == 'cache.dir' else '~/.cache/ablate'})"
            )
