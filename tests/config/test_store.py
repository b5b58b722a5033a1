"""Hydra composes `method.args` and `speed` from their schema dataclasses (ablate.config.store): a
method's defaults are its schema's, the same as its config class's from Python; a method YAML wires only
what depends on the rest of the config; a user's config class is a schema option of its own."""

from __future__ import annotations

import dataclasses

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from ablate.config.compose import register_resolvers
from ablate.config.store import method_schemas, user_node
from ablate.errors import ConfigError
from ablate.paths import conf_dir


def _args(*overrides: str) -> dict:
    register_resolvers()
    with initialize_config_dir(str(conf_dir()), version_base=None):
        cfg = compose("config", list(overrides))
    return OmegaConf.to_container(cfg.method.args, resolve=True)


@pytest.mark.parametrize("method", ["dpo", "sft", "kto", "reward", "rloo", "orpo", "cpo", "simpo"])
def test_the_composed_defaults_are_the_schemas(method):
    args = _args(f"method={method}")
    cls = next(c for c in method_schemas() if c.targets[0] == args["_target_"])
    wired = {"max_completion_length", "tools"} if method == "rloo" else set()  # GRPO's: the data's (below)
    for f in dataclasses.fields(cls):
        if f.name in wired:
            continue
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        assert args[f.name] == default, (method, f.name)
    assert args["seed"] == args["data_seed"] == 0 and args["_recursive_"] is cls.recursive


def test_grpo_takes_the_datas_completion_length_and_tools_else_its_own():
    assert _args("method=grpo")["max_completion_length"] == 8  # data=tiny_repeat's
    calc = _args("method=grpo", "data=calc_tools")
    assert calc["max_completion_length"] == 128 and calc["tools"] == ["ablate.tools.calculator"]
    own = _args("method=grpo", "data=one_word_prompts")
    assert own["max_completion_length"] == 256 and own["tools"] is None  # GRPOArgs' defaults
    assert (
        _args("method=grpo", "data=calc_tools", "method.args.max_completion_length=7")[
            "max_completion_length"
        ]
        == 7
    )


def test_a_class_that_is_no_method_config_is_one_line():
    @dataclasses.dataclass
    class Mine:
        x: int = 1

    with pytest.raises(
        ConfigError, match=r"^schema/.*Mine: not a subclass of an ablate method config \("
    ) as e:
        user_node(Mine)
    assert "\n" not in str(e.value)


def test_a_user_subclass_adds_its_own_fields_and_keeps_the_schemas():
    from ablate.schema.args import DPOArgs

    @dataclasses.dataclass
    class MyArgs(DPOArgs):
        my_coef: float = 0.25
        beta: float = 0.5  # a default of its own for an inherited field

    node = OmegaConf.to_container(user_node(MyArgs))
    assert node["my_coef"] == 0.25 and node["beta"] == 0.5 and node["max_length"] == 512
    assert node["_target_"].endswith("MyArgs")
