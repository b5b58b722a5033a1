"""Hydra composes `method.args` and `speed` from their schema dataclasses (ablate.config.store): a
method's defaults are its schema's, the same as its config class's from Python; a method YAML wires only
what depends on the rest of the config; a user's config class is a schema option of its own."""

from __future__ import annotations

import dataclasses
from pathlib import Path

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


def _called_nodes():
    """Every node of conf/ (Hydra's own group aside) that calls an ablate function or class."""
    import yaml

    def walk(node, where):
        if isinstance(node, dict):
            target = node.get("_target_")
            if isinstance(target, str) and target.startswith(("ablate.", "hydra_plugins.ablate_")):
                yield where, node
            for key, value in node.items():
                yield from walk(value, f"{where}.{key}")
        elif isinstance(node, list):
            for i, value in enumerate(node):
                yield from walk(value, f"{where}[{i}]")

    for path in sorted(Path(conf_dir()).rglob("*.yaml")):
        if "hydra" not in path.relative_to(conf_dir()).parts:
            yield from walk(yaml.safe_load(path.read_text()), str(path.relative_to(conf_dir())))


def test_a_called_nodes_defaults_are_its_functions_declared_once():
    """A keyword of a function or class a config node calls (a loss's `label_smoothing`, LoRA's `r`, the
    tiny model's `hidden_size`) is declared with its default once, in Python: its YAML holds
    `${ablate_default:}` (read from the source, not imported), never a copy of the value."""
    import importlib
    import inspect

    from ablate.config.targets import keyword_default

    read = 0
    for where, node in _called_nodes():
        module, _, name = node["_target_"].rpartition(".")
        params = inspect.signature(getattr(importlib.import_module(module), name)).parameters
        for key, value in node.items():
            if key.startswith("_") or key not in params or params[key].default is inspect.Parameter.empty:
                continue
            if value == "${ablate_default:}":
                assert keyword_default(node["_target_"], key) == params[key].default, (where, key)
                read += 1
            else:
                assert params[key].default != value or type(value) is not type(params[key].default), (
                    where,
                    key,
                    value,
                )
    assert read >= 60  # losses, the vLLM engine, data, models, LoRA, callbacks, the logger, schedules


def test_a_keyword_without_a_default_is_one_line():
    from ablate.config.targets import keyword_default

    with pytest.raises(ConfigError, match=r"^ablate.losses.dpo.sigmoid: no default for 'beta' "):
        keyword_default("ablate.losses.dpo.sigmoid", "beta")


@pytest.mark.parametrize("method", ["dpo", "grpo", "distill", "reward", "kto", "sft"])
def test_the_composed_config_holds_the_functions_defaults_not_placeholders(method):
    """conf/ is read through hydra_plugins.ablate_conf, which fills `${ablate_default:}` in as each file is
    loaded: what `--cfg job` prints, .hydra/config.yaml saves and W&B logs are the values."""
    register_resolvers()
    with initialize_config_dir(str(conf_dir()), version_base=None):
        cfg = compose("config", [f"method={method}", "+peft=lora"])
    text = OmegaConf.to_yaml(cfg)
    assert "ablate_default" not in text
    if method == "dpo":
        assert cfg.method.dpo_loss.label_smoothing == 0.0 and cfg.peft.r == 16


def test_a_users_target_keeps_the_siblings_values():
    """Hydra's rule: `method.dpo_loss._target_=my.loss` keeps the node's other keys, with the values
    ablate's function declares (filled in when the file was read, against the file's own `_target_`)."""
    register_resolvers()
    with initialize_config_dir(str(conf_dir()), version_base=None):
        cfg = compose("config", ["method=dpo", "method.dpo_loss._target_=my_code.loss"])
    assert OmegaConf.to_container(cfg.method.dpo_loss, resolve=True) == {
        "_target_": "my_code.loss",
        "_partial_": True,
        "label_smoothing": 0.0,
    }
