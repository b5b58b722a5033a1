"""One schema per config node (ablate.schema): each value is checked once, where the node is made, in
the same words whether the config is composed (before torch) or a method's config class is created."""

from __future__ import annotations

import dataclasses

import pytest
from transformers import TrainingArguments

from ablate.errors import ConfigError
from ablate.losses import is_correction
from ablate.methods.dpo import DPOConfig
from ablate.methods.grpo import GRPOConfig
from ablate.methods.sft import SFTConfig
from ablate.schema import Schema, schema_for
from ablate.schema.args import DPOArgs, SFTArgs, TrainArgs
from ablate.schema.grpo import IS_MODES, GRPOArgs, reward_weights_problem
from ablate.schema.models import TinyModel
from ablate.schema.nodes import Optimizer, Root


def test_a_default_other_than_trainingarguments_says_so():
    """A method's config class inherits its schema's fields, the command line's defaults: where one differs
    from TrainingArguments' (a run made from Python would differ from a plain Trainer's), its help names
    TrainingArguments' value."""
    theirs = {f.name: f.default for f in dataclasses.fields(TrainingArguments)}
    differ = {
        f.name: f.metadata["help"] for f in dataclasses.fields(TrainArgs) if f.default != theirs[f.name]
    }
    assert {"max_steps", "logging_steps", "save_steps", "num_train_epochs"} <= set(differ)
    assert all("TrainingArguments" in help for help in differ.values()), differ


def test_each_method_default_is_declared_once(tmp_path):
    """Hydra composes method.args from the schema (ablate.config.compose): no conf/ file sets a schema field to
    a value of its own, and the composed defaults are the Python class's."""
    import yaml
    from pathlib import Path

    from ablate.config.compose import method_schemas
    from ablate.paths import conf_dir

    fields = {f.name for cls in method_schemas() for f in dataclasses.fields(cls)}
    for path in Path(conf_dir(), "method").glob("*.yaml"):
        args = yaml.safe_load(path.read_text()).get("args") or {}
        literal = {k: v for k, v in args.items() if k in fields and not str(v).startswith("${")}
        assert not literal, f"{path.name} re-declares {literal}"
    assert not Path(conf_dir(), "training_args.yaml").exists()


@pytest.mark.parametrize(
    "config,schema", [(DPOConfig, DPOArgs), (SFTConfig, SFTArgs), (GRPOConfig, GRPOArgs)]
)
def test_each_method_config_is_its_schema(tmp_path, config, schema):
    """The config class's checked fields are exactly its schema's; each has a one-line help."""
    assert (
        issubclass(config, schema)
        and schema_for("method.args", f"{config.__module__}.{config.__name__}") is schema
    )
    checked = {f.name for f in dataclasses.fields(config) if f.metadata.get("check") is not None}
    assert checked == {f.name for f in dataclasses.fields(schema)}
    assert all(f.metadata["help"] for f in dataclasses.fields(schema))
    config(output_dir=str(tmp_path), report_to="none")  # the defaults pass their own checks


@pytest.mark.parametrize(
    "config,kw,line",
    [
        (DPOConfig, {"beta": 0}, "method.args.beta=0: must be a number > 0"),
        (
            DPOConfig,
            {"max_steps": 0},
            "method.args.max_steps=0: must be -1 (use num_train_epochs) or an integer >= 1",
        ),
        (SFTConfig, {"max_length": 0}, "method.args.max_length=0: must be null or an integer >= 1"),
        (GRPOConfig, {"beta": -1}, "method.args.beta=-1: must be a number >= 0 (0 = no KL term)"),
        (
            GRPOConfig,
            {"num_generations": 4, "per_device_train_batch_size": 6},
            "method.args.per_device_train_batch_size=6: must be an integer >= 1 and a multiple of method.args.num_generations=4",
        ),
        (GRPOConfig, {"delta": 1.1}, "method.args.delta=1.1: must be null or a number > 1 + epsilon_high"),
        # checked here only: the losses take the value as given (ablate.losses.grpo, ablate.losses.is_correction)
        (
            GRPOConfig,
            {"importance_sampling_level": "tokens"},
            "method.args.importance_sampling_level=tokens: must be token (GRPO) or sequence (GSPO)",
        ),
        (
            GRPOConfig,
            {"vllm_importance_sampling_mode": "sequence"},
            "method.args.vllm_importance_sampling_mode=sequence: must be one of token_truncate, token_mask, "
            "sequence_truncate, sequence_mask",
        ),
    ],
)
def test_a_bad_value_is_one_line_from_python_too(tmp_path, config, kw, line):
    with pytest.raises(ConfigError) as e:
        config(output_dir=str(tmp_path), report_to="none", **kw)
    assert str(e.value).startswith(line) and "\n" not in str(e.value)


def test_epsilon_high_defaults_to_epsilon(tmp_path):
    assert GRPOConfig(output_dir=str(tmp_path), report_to="none", epsilon=0.3).epsilon_high == 0.3


def test_the_losses_modes_are_the_schemas():
    """The schema names the modes (IS_MODES); the loss reads each name: one ratio per completion for
    `sequence_*`, a clamp for `*_truncate`, else a mask."""
    assert tuple(is_correction.MODES) == IS_MODES
    assert {m: (seq, fn.__name__) for m, (seq, fn) in is_correction.MODES.items()} == {
        "token_truncate": (False, "truncate"),
        "token_mask": (False, "mask_outside"),
        "sequence_truncate": (True, "truncate"),
        "sequence_mask": (True, "mask_outside"),
    }


def test_absent_keys_are_not_checked_and_siblings_are():
    """A node's schema checks the keys it holds, its defaults the others; a check against a sibling names it."""
    assert list(TinyModel.of({}).problems()) == []
    assert list(TinyModel.of({"hidden_size": 10, "num_heads": 4}).problems()) == [
        ("model.hidden_size", 10, "an integer >= 1 divisible by model.num_heads=4")
    ]
    assert [k for k, _, _ in Optimizer.of({"lr": 0, "momentum": -1}).problems()] == [
        "optimizer.optimizer.lr",
        "optimizer.optimizer.momentum",
    ]
    assert [k for k, _, _ in Root.of({"seed": -1, "tags": "x"}).problems()] == ["seed", "tags"]


def test_reward_weights_against_the_reward_functions():
    assert (
        reward_weights_problem(None, ["a"]) is None and reward_weights_problem([1.0, 2.0], ["a", "b"]) is None
    )
    assert (
        reward_weights_problem([1.0], ["a", "b"])[2]
        == "null or a list of 2 numbers, one per data.reward_funcs entry (a, b)"
    )


def test_a_user_subclass_is_checked_before_the_run_dir(tmp_path):
    """A config class of the user's own (no schema registered for its `_target_`) subclassing ablate's is
    checked against the inherited schema by the code checks (ablate.config.code_checks), before any run dir."""
    from omegaconf import OmegaConf

    from ablate.config.code_checks import check_method_args

    cfg = OmegaConf.create({"method": {"args": {"_target_": "test_schema.MyDPOConfig", "beta": -1.0}}})
    with pytest.raises(ConfigError, match=r"^method.args.beta=-1: must be a number > 0$"):
        check_method_args(cfg)


@dataclasses.dataclass
class MyDPOConfig(DPOConfig):
    my_weight: float = 1.0


def test_every_schema_field_has_a_check_or_a_default_and_its_help():
    """A field of a node's schema is there to be checked, or declares the node's default (a structured config's
    field: its one-line help says what it is)."""
    from ablate.schema import ABSENT

    def all_subclasses(c):
        return set(c.__subclasses__()).union(*(all_subclasses(s) for s in c.__subclasses__()))

    for schema in all_subclasses(Schema):
        if schema.__module__.startswith("ablate.schema"):
            for f in dataclasses.fields(schema):
                checked = f.metadata.get("check") is not None
                assert checked or (f.default is not ABSENT and f.metadata.get("help")), (schema, f.name)
