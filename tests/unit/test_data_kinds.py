"""The registry of data kinds (ablate.data.kinds): every method names one, in its YAML only; the functions it
names are the ones the trainers tokenise with; a file's header is judged by it before the run (ablate.config.
data_checks), already tokenised rows included."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.utils import get_class, get_method

from ablate.config import data_checks
from ablate.config.compose import register_resolvers
from ablate.data.kinds import KINDS, detect_columns
from ablate.errors import ConfigError, DataError
from ablate.paths import conf_dir

METHODS = sorted(p.stem for p in (Path(conf_dir()) / "method").glob("*.yaml"))


def _cfg(*overrides: str):
    register_resolvers()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=conf_dir(), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


@pytest.mark.parametrize("method", METHODS)
def test_every_method_names_its_kind_in_its_yaml_only(method):
    """The kind is the YAML's (`method.data_kind`), not the trainer's: no class attribute says another."""
    cfg = _cfg(f"method={method}")
    assert cfg.method.data_kind in KINDS, cfg.method.get("data_kind")
    trainer = get_class(cfg.method.trainer._target_)
    assert not hasattr(trainer, "data_kind"), trainer
    tokenize = getattr(trainer, "tokenize", None)  # DPO's and SFT's: the registry's function for their kind
    if tokenize is not None:
        assert tokenize is get_method(KINDS[cfg.method.data_kind].tokenize), (method, tokenize)


@pytest.mark.parametrize("name", list(KINDS))
def test_each_kind_names_functions_that_exist(name):
    kind = KINDS[name]
    for ref in (kind.tokenize, kind.row):
        assert callable(get_method(ref)), ref
    for fmt, needed in kind.formats:  # each format's columns are found as that format
        assert detect_columns(list(needed), name) == fmt


@pytest.mark.parametrize(
    "name,found,says",
    [
        (
            "unpaired",
            ["prompt", "completion"],
            "KTO found columns ['completion', 'prompt'], expected one of [unpaired "
            "preference: prompt, completion, label; preference: prompt, chosen, rejected; implicit-prompt preference: chosen, "
            "rejected]: missing 'label' (unpaired preference;",
        ),
        (
            "reward",
            ["prompt", "good", "bad", "margin"],
            "reward modelling found columns ['bad', 'good', 'margin', "
            "'prompt'], expected one of [preference: prompt, chosen, rejected; implicit-prompt preference: chosen, rejected]: "
            "missing 'chosen', 'rejected' (preference;",
        ),
        (
            "prompt",
            ["question"],
            "GRPO found columns ['question'], expected one of [prompt-only: prompt]: missing 'prompt' "
            "(prompt-only;",
        ),
    ],
)
def test_a_missing_column_is_named(name, found, says):
    with pytest.raises(DataError) as e:
        detect_columns(found, name)
    assert says in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_the_line_names_a_method_the_kinds_words_do_not():
    with pytest.raises(DataError, match=r"^data: method=distill found columns \['question'\]"):
        detect_columns(["question"], "prompt", "distill")
    with pytest.raises(DataError, match=r"^data: GRPO found columns"):
        detect_columns(["question"], "prompt", "grpo")


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_tokenized_rows_pass_the_check_before_a_users_trainer(tmp_path):
    """Rows already tokenised for the method pass the header check when the trainer is the user's (it may keep
    them, as examples/custom_batch's does); ablate's own trainers tokenise their rows, so they are refused."""
    ids = _write(tmp_path / "ids.jsonl", [{"prompt_ids": [1], "chosen_ids": [2], "rejected_ids": [3]}])
    mine = "method.trainer._target_=my_batch.KeepDatasetDPOTrainer"
    data_checks.check_data_columns(_cfg("data=jsonl", f"data.train_path={ids}", mine), frozenset())
    with pytest.raises(ConfigError, match="DPO found columns"):
        data_checks.check_data_columns(_cfg("data=jsonl", f"data.train_path={ids}"), frozenset())
    with pytest.raises(ConfigError, match="SFT found columns"):  # not tokenised for SFT
        data_checks.check_data_columns(
            _cfg("method=sft", "data=jsonl", f"data.train_path={ids}", mine.replace("DPO", "SFT")),
            frozenset(),
        )


@pytest.mark.parametrize(
    "method,row,missing",
    [
        ("kto", {"prompt": "p", "completion": "c"}, "'label'"),
        ("reward", {"prompt": "p", "good": "a", "bad": "b"}, "'chosen', 'rejected'"),
        ("distill", {"question": "q"}, "'prompt'"),
    ],
)
def test_every_methods_file_is_checked_before_the_run(tmp_path, method, row, missing):
    path = _write(tmp_path / "rows.jsonl", [row])
    cfg = _cfg(f"method={method}", "data=jsonl", f"data.train_path={path}")
    with pytest.raises(ConfigError) as e:
        data_checks.check_data_columns(cfg, frozenset())
    assert str(e.value).startswith(f"data.train_path={path}: ") and f"missing {missing}" in str(e.value), str(
        e.value
    )
    data_checks.check_data_columns(cfg, frozenset({"data.train_path"}))  # swept: each job checks its own file


def test_an_unknown_kind_is_one_line():
    with pytest.raises(
        ConfigError, match=r"^method.data_kind=pairs: no such kind of data; one of preference, sft, "
    ):
        data_checks.check_data_columns(_cfg("method.data_kind=pairs"), frozenset())


def test_the_kind_is_not_part_of_a_runs_identity():
    """A run started before its method named a kind resumes as the same run (the kind changes no training)."""
    from ablate.record.identity import identity

    cfg = _cfg("method=kto")
    before = _cfg("method=kto", "~method.data_kind")
    assert "data_kind" not in before.method
    assert identity(cfg)["config_hash"] == identity(before)["config_hash"]


def test_a_kinds_own_columns_can_be_mapped(tmp_path):
    """KTO's `label` and reward modelling's `margin` are roles `data.columns` maps onto, as prompt or chosen are."""
    path = _write(tmp_path / "kto.jsonl", [{"prompt": "p", "completion": "c", "is_good": True}])
    cfg = _cfg("method=kto", "data=jsonl", f"data.train_path={path}", "+data.columns.label=is_good")
    data_checks.check_data_columns(cfg, frozenset())
    with pytest.raises(ConfigError, match="missing 'label'"):
        data_checks.check_data_columns(
            _cfg("method=kto", "data=jsonl", f"data.train_path={path}"), frozenset()
        )
