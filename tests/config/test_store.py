"""Hydra composes `method.args` and `speed` from their schema dataclasses (ablate.config.compose): a
method's defaults are its schema's, the same as its config class's from Python; a method YAML wires only
what depends on the rest of the config; a user's config class is a schema option of its own."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from ablate.config.compose import register_resolvers
from ablate.config.compose import method_schemas, user_node
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


def test_a_called_nodes_defaults_are_declared_once():
    """A keyword of a function or class a config node calls (a loss's `label_smoothing`, LoRA's `r`, the tiny
    model's `hidden_size`) is declared with its default once: in the node's structured config (ablate.schema),
    which its YAML selects and the function's signature reads (`r: int = LoRA.r`); a YAML that names its
    `_target_` itself never copies a function's default."""
    import ast
    import importlib
    import inspect

    from ablate.config.compose import stored

    read = 0
    for cls in stored():
        for target in cls.targets:
            module, _, name = target.rpartition(".")
            fn = getattr(importlib.import_module(module), name)
            if dataclasses.is_dataclass(
                fn
            ):  # a method's config class, the speed switches: the schema's own fields
                continue
            fn = fn.__init__ if inspect.isclass(fn) else fn
            tree = ast.parse(_dedent(fn))
            args = tree.body[0].args
            defaults = dict(
                zip([a.arg for a in (args.posonlyargs + args.args)][-len(args.defaults) :], args.defaults)
            )
            defaults |= {a.arg: d for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None}
            for key, expr in defaults.items():
                f = cls.__dataclass_fields__.get(key)
                if (
                    f is None
                    or f.default_factory is not dataclasses.MISSING
                    or str(f.default).startswith("${")
                ):
                    continue  # the config wires it (`seed: ${seed}`, `job_type: ${method.name}`, W&B's tags)
                assert isinstance(expr, ast.Attribute) and expr.attr == key, (target, key, ast.unparse(expr))
                # the node's own, or its base's (+teacher=tiny's sizes are not tiny()'s)
                theirs = {
                    getattr(c, key, None)
                    for c in cls.__mro__
                    if key in getattr(c, "__dataclass_fields__", {})
                }
                assert inspect.signature(fn).parameters[key].default in theirs, (target, key)
                read += 1
    for where, node in _called_nodes():
        module, _, name = node["_target_"].rpartition(".")
        params = inspect.signature(getattr(importlib.import_module(module), name)).parameters
        for key, value in node.items():
            if key.startswith("_") or key not in params or params[key].default is inspect.Parameter.empty:
                continue
            if node["_target_"].startswith("ablate.data."):  # the loaders: see docs/limits.md
                continue
            assert params[key].default != value or type(value) is not type(params[key].default), (where, key)
    assert read >= 40  # losses, models, LoRA, the engine, callbacks, the logger, the cache


def _dedent(fn):
    import inspect
    import textwrap

    return textwrap.dedent(inspect.getsource(fn))


@pytest.mark.parametrize("method", ["dpo", "grpo", "distill", "reward", "kto", "sft"])
def test_the_composed_config_holds_the_schemas_defaults(method):
    """A node selected from its structured config holds its values: what `--cfg job` prints, .hydra/config.yaml
    saves and W&B logs are numbers, typed (`peft.r=abc` is refused while composing)."""
    register_resolvers()
    with initialize_config_dir(str(conf_dir()), version_base=None):
        cfg = compose("config", [f"method={method}", "+peft=lora"])
    assert cfg.peft.r == 16 and cfg.model.hidden_size == 64 and cfg.optimizer.scheduler.warmup_ratio == 0.1
    if method == "dpo":
        assert cfg.method.dpo_loss.label_smoothing == 0.0
    if method == "reward":
        assert cfg.method.model_head.num_labels == 1


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


def test_the_schema_group_survives_a_commands_own_search_path(tmp_path):
    """A command that gives its own `hydra.searchpath` (`ablate data --config-dir`, a user's experiments dir)
    replaces conf/config.yaml's list; ablate's structured configs stay selectable (hydra_plugins.ablate_schemas'
    SchemaSearchPath), so every method, loss and engine still composes."""
    (tmp_path / "experiment").mkdir()
    (tmp_path / "experiment" / "mine.yaml").write_text("# @package _global_\nseed: 7\n")
    args = _args("method=cpo", "+experiment=mine", f"hydra.searchpath=[file://{tmp_path}]")
    assert args["beta"] == 0.1 and args["seed"] == 7


@pytest.mark.parametrize(
    "method,data",
    [(m, d) for m in ("grpo", "rloo", "distill") for d in ("tiny_repeat", "calc_tools", "tiny_prefs")],
)
def test_a_sampling_method_takes_what_its_data_says_else_its_schema_default(method, data):
    """`from_data` fields (GRPOArgs: max_completion_length, tools) are the data node's where it has the key
    (data=tiny_repeat scores 8 characters, data=calc_tools offers its calculator), else the schema's own default;
    an override of the field still wins. Declared once: the value in the data's YAML, the default in Python."""
    register_resolvers()
    with initialize_config_dir(str(conf_dir()), version_base=None):
        cfg = compose("config", [f"method={method}", f"data={data}"])
    args = OmegaConf.to_container(cfg.method.args, resolve=True)
    cls = next(c for c in method_schemas() if c.targets[0] == args["_target_"])
    assert cls.from_data and set(cls.from_data) <= set(args)
    for name in cls.from_data:
        own = cls.__dataclass_fields__[name].default
        want = OmegaConf.to_container(cfg.data)[name] if name in cfg.data else own
        assert args[name] == want, (name, args[name], want)
    said = [name for name in cls.from_data if name in cfg.data]
    assert bool(said) == (data != "tiny_prefs")  # the two prompt tasks say, the preference pairs do not
    given = _args(f"method={method}", f"data={data}", "method.args.max_completion_length=5")
    assert given["max_completion_length"] == 5
