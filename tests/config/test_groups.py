"""Every option of every config group composes, and every `_target_` in it instantiates.

Composes the real conf/ (as `ablate train` does) and shrinks it, lightning-hydra-template style.
Hub-only options (a model or dataset id that needs a download) compose, and their `_target_`
resolves, but are not instantiated: these machines have no hub access.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.utils import get_method, instantiate
from omegaconf import DictConfig, OmegaConf

from ablate.paths import conf_dir
from ablate.config.compose import register_resolvers

CONF = Path(conf_dir())
# groups in the root defaults list (`group=option`) and groups appended on demand (`+group=option`)
GROUPS = [
    "model",
    "method",
    "optimizer",
    "precision",
    "distributed",
    "speed",
    "cache",
    "data",
    "callbacks",
    "logger",
    "eval",
    "judge",
]
PLUS_GROUPS = sorted(
    p.name for p in CONF.iterdir() if p.is_dir() and p.name not in {*GROUPS, "hydra", "experiment", "debug"}
)
HUB = {
    ("model", "qwen2_5_0_5b"),
    ("model", "qwen2_5_7b"),
    ("model", "llama3_1_8b"),
    ("data", "ultrafeedback_binarized"),
}


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


ALL = [(g, o) for g in GROUPS for o in options(g)]
PLUS = [(g, o) for g in PLUS_GROUPS for o in options(g)]


def make_cfg(*overrides: str) -> DictConfig:
    register_resolvers()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    """A save_pretrained dir of the tiny model, for model=local (the real from_pretrained path)."""
    from ablate.models import tiny

    d = tmp_path_factory.mktemp("tiny_model")
    tok, model = tiny()
    tok.save_pretrained(d)
    model.save_pretrained(d)
    return d


def required(group: str, option: str, tiny_dir: Path, tmp_path: Path) -> list[str]:
    """Values a user must supply for some options (marked ??? in the YAML)."""
    if (group, option) == ("model", "local"):
        return [f"model.path={tiny_dir}"]
    if (group, option) in (("data", "jsonl"), ("data", "local")):
        src = Path(instantiate_packaged_path())
        return [f"data.train_path={src}"]
    if (group, option) == (
        "judge",
        "reward_model",
    ):  # a one-label sequence classifier's config is what it checks
        import json

        (tmp_path / "config.json").write_text(
            json.dumps({"architectures": ["LlamaForSequenceClassification"], "num_labels": 1})
        )
        return [f"judge.path={tmp_path}"]
    return []


def instantiate_packaged_path() -> str:
    from ablate.data import PACKAGED

    return str(PACKAGED / "sort_prefs_train.jsonl")


def test_every_group_has_options():
    for g in GROUPS:
        assert options(g), f"conf/{g}/ has no options"
    assert {"tiny", "local", "qwen2_5_0_5b"} <= set(options("model"))
    assert {"dpo", "dpo_hinge", "sft", "grpo", "reward", "kto", "rloo", "distill"} <= set(options("method"))
    assert {"adamw", "sgd"} <= set(options("optimizer"))
    assert {"fp32", "bf16", "fp16"} <= set(options("precision"))
    assert {"tiny_prefs", "tiny_sft", "jsonl", "ultrafeedback_binarized"} <= set(options("data"))
    assert {"default", "none"} <= set(options("callbacks"))
    assert {"none", "wandb"} <= set(options("logger"))


@pytest.mark.parametrize("group,option", ALL + PLUS)
def test_option_composes_and_documents_fields(group, option):
    cfg = make_cfg(f"{'+' if group in PLUS_GROUPS else ''}{group}={option}")
    assert cfg.method.name
    # every field of the option's own YAML carries a one-line comment (a `#` on the line or above it)
    lines = (CONF / group / f"{option}.yaml").read_text().splitlines()
    for i, line in enumerate(lines):
        s = line.strip()
        if not s or s.startswith("#") or s.startswith("- ") or s in ("{}", "null", "defaults:"):
            continue
        if s.endswith(":") or s.startswith(
            "_target_:"
        ):  # headers and targets: documented by their children/docstrings
            continue
        assert "#" in line or lines[i - 1].strip().startswith("#"), (
            f"{group}/{option}.yaml: no comment on '{s}'"
        )


# nested groups of the method group: (subgroup, the method each option belongs to, read from its target)
# each subgroup's node -> the trainer argument it reaches (`method.trainer.loss: ${..dpo_loss}`)
SUBGROUPS = {
    "dpo_loss": "loss",
    "kto_loss": "loss",
    "grpo_aggregation": "aggregation",
    "grpo_scale_rewards": "scale_rewards",
    "grpo_objective": "objective",
    "grpo_reward_aggregation": "reward_aggregation",
}
NESTED = [(sub, o) for sub in SUBGROUPS for o in options(f"method/{sub}")]


@pytest.mark.parametrize("sub,option", NESTED)
def test_method_subgroup_option_composes_and_reaches_the_trainer(sub, option):
    """`method/dpo_loss=NAME` and `method/grpo_scale_rewards=NAME`: every option composes under its method,
    documents its fields, and is handed to the trainer as a function (`_partial_`)."""
    import functools

    text = _with_schemas((CONF / "method" / sub / f"{option}.yaml").read_text())
    method = (
        "grpo"
        if "losses.grpo." in text or "losses.rloo." in text
        else "kto"
        if "losses.kto." in text
        else "dpo"
    )
    cfg = make_cfg(f"method={method}", f"method/{sub}={option}")
    assert cfg.method[sub]._target_ in text and cfg.method[sub]._partial_ is True
    fn = instantiate(cfg.method.trainer).keywords[SUBGROUPS[sub]]  # the trainer partial's own argument
    assert isinstance(fn, functools.partial)
    lines = text.splitlines()
    for i, line in enumerate(lines):
        s = line.strip()
        if not s or s.startswith("#") or s.startswith("- ") or s.endswith(":") or s.startswith("_target_:"):
            continue
        assert "#" in line or lines[i - 1].strip().startswith("#"), (
            f"method/{sub}/{option}.yaml: no comment on '{s}'"
        )


@pytest.mark.parametrize("option", [None, *options("method/rollouts")])
def test_generator_default_is_the_speed_plans_and_an_option_reaches_the_trainer(option):
    """No `method/rollouts` (the default) leaves `method.trainer.generator` null, so the speed plan picks
    the generator (speed.shared_prefill); `method/rollouts=NAME` hands the trainer that engine's class as
    a partial, built with (args, tokenizer)."""
    import functools

    cfg = make_cfg("method=grpo", *([f"method/rollouts={option}"] if option else []))
    given = instantiate(cfg.method.trainer).keywords["generator"]
    if option is None:
        assert given is None and "rollouts" not in cfg.method
        return
    text = (CONF / "method" / "rollouts" / f"{option}.yaml").read_text()
    assert isinstance(given, functools.partial) and cfg.method.rollouts._target_ in text
    assert f"{given.func.__module__}.{given.func.__name__}" == cfg.method.rollouts._target_


def _targets(node, path=""):
    if isinstance(node, DictConfig):
        if "_target_" in node:
            yield path, node
        for k in node:
            if k != "_target_" and not OmegaConf.is_missing(
                node, k
            ):  # ??? (teacher.path): the user's to give
                yield from _targets(node[k], f"{path}.{k}" if path else str(k))


@pytest.mark.parametrize("group,option", ALL)
def test_option_targets_instantiate(group, option, tiny_dir, tmp_path):
    """Instantiate each `_target_` of the option (hub options: the target only resolves)."""
    cfg = make_cfg(f"{group}={option}", *required(group, option, tiny_dir, tmp_path))
    node = cfg[group]
    targets = list(_targets(node)) if node else []
    if not targets:  # logger=none, callbacks=none, precision=*: no _target_, checked for what they do
        _check_targetless(group, option, cfg, tmp_path)
        return
    for path, target in targets:
        fn = get_method(target._target_)
        assert callable(fn), f"{group}.{path}: {target._target_} is not callable"
        if (group, option) in HUB:
            continue
        if group == "method" and path == "args":
            args = instantiate(target, output_dir=str(tmp_path))
            assert args.seed == cfg.seed
        elif group == "method" and path == "trainer":
            _build_trainer(cfg, tmp_path)
        elif group == "optimizer":
            import torch

            opt = instantiate(cfg.optimizer.optimizer)([torch.nn.Parameter(torch.zeros(2))])
            instantiate(cfg.optimizer.scheduler)(opt, num_training_steps=10)
        elif group == "logger":
            assert type(instantiate(target)).__name__.endswith("Tracker")
        elif group == "data" and path.startswith(
            "sources."
        ):  # a mix's source: built by the mix, its weight taken out
            obj = instantiate(OmegaConf.masked_copy(target, [k for k in target if k != "weight"]))
            assert obj.train is not None
        else:
            obj = instantiate(target)
            assert obj is not None


def _check_targetless(group: str, option: str, cfg: DictConfig, tmp_path: Path) -> None:
    """Options without a `_target_` still do something testable: off switches are empty (what
    ablate.train reads as "none"); precision flags land in TrainingArguments or are refused."""
    node = cfg[group]
    if (group, option) in {("logger", "none"), ("callbacks", "none")}:
        assert not node and OmegaConf.to_container(node) == {}, (
            f"{group}={option} should compose to an empty node"
        )
    elif group == "precision":
        import dataclasses

        from transformers import TrainingArguments

        from ablate.errors import ConfigError
        from ablate.config.machine import check_precision

        flags = OmegaConf.to_container(node)
        assert set(flags) <= {f.name for f in dataclasses.fields(TrainingArguments)}, flags
        if flags.get("fp16"):  # no GPU here: refused before any TrainingArguments exist
            with pytest.raises(ConfigError, match="needs a CUDA GPU"):
                check_precision(node)
            return
        device_args = check_precision(node)  # bf16 without a GPU: use_cpu
        args = instantiate(cfg.method.args, output_dir=str(tmp_path), **device_args, **flags)
        assert (args.bf16, args.fp16) == (flags["bf16"], flags["fp16"])
    elif group == "distributed":
        import dataclasses

        from transformers import TrainingArguments

        from ablate.errors import ConfigError
        from ablate.config.machine import check_distributed

        flags = OmegaConf.to_container(node)
        assert flags.pop("sequence_parallel") == 1  # off by default; the trainer's, not TrainingArguments'
        assert set(flags) <= {f.name for f in dataclasses.fields(TrainingArguments)}, flags
        if flags.get(
            "fsdp"
        ):  # one process: nothing to shard over, refused; CPU ranks shard over gloo (use_cpu)
            with pytest.raises(ConfigError, match="several processes"):
                check_distributed(node, processes=1)
            import torch

            assert check_distributed(node, processes=2) == (
                flags if torch.cuda.is_available() else {**flags, "use_cpu": True}
            )
            return
        assert check_distributed(node, processes=1) == flags  # the TrainingArguments keys
        args = instantiate(cfg.method.args, output_dir=str(tmp_path), **flags)
        assert not args.fsdp
    else:
        pytest.fail(f"{group}/{option} has no _target_ and no check here: add one")


@pytest.mark.parametrize("group,option", PLUS)
def test_plus_option_targets_resolve(group, option):
    """Appended groups (+ref_model=..., +compute_metrics=...) name importable targets; their runs are
    exercised end to end in tests/integration/test_customization.py."""
    for path, target in _targets(make_cfg(f"+{group}={option}")):
        assert callable(get_method(target._target_)), f"{group}/{option}: {path}"


def _build_trainer(cfg: DictConfig, tmp_path: Path) -> None:
    """The method's trainer, built with the tiny model and the method's own data, as ablate.train does."""
    from ablate.models.heads import with_head

    args = instantiate(cfg.method.args, output_dir=str(tmp_path), max_steps=1)
    tok, model = instantiate(cfg.model)
    model = with_head(model, cfg.method)  # method=reward's score head, as ablate.train puts it on
    data = instantiate(cfg.data)
    trainer = instantiate(cfg.method.trainer)(
        model=model, args=args, train_dataset=data.train, processing_class=tok
    )  # reward_funcs, if any, come from the config
    batch = next(iter(trainer.get_train_dataloader()))
    assert batch["input_ids"].shape[0] > 0 if "input_ids" in batch else batch


def test_resolved_config_has_no_missing_values():
    cfg = make_cfg()
    assert OmegaConf.missing_keys(cfg) == set()


@pytest.mark.parametrize("name", sorted(p.stem for p in (CONF / "experiment").glob("*.yaml")))
def test_experiment_files_compose(name):
    """`+experiment=NAME` (the Hydra way to append a group) composes and changes the config."""
    assert make_cfg(f"+experiment={name}") != make_cfg()


# conf/ mirrors src/ablate/: each group's ablate targets live in the module named after it (docs/architecture.md)
CODE = {
    "model": ("models",),
    "data": ("data", "rewards"),
    "method": ("methods", "rollouts", "models.heads", "models.teachers"),
    "method/dpo_loss": ("losses",),
    "method/kto_loss": ("losses",),
    "method/grpo_aggregation": ("losses",),
    "method/grpo_scale_rewards": ("losses",),
    "method/grpo_objective": ("losses",),
    "method/grpo_reward_aggregation": ("losses",),
    "method/rollouts": ("rollouts",),
    "optimizer": ("methods.optim",),
    "optimizer/scheduler": ("methods.schedules",),
    "callbacks": ("callbacks",),
    "logger": ("logger",),
    "compute_metrics": ("methods.compute_metrics",),
    "ref_model": ("models",),
    "peft": ("models",),
    "teacher": ("models",),
    "precision": (),
    "experiment": (),
    "hydra/launcher": (),
    # hydra/sweeper=optuna: the plugin is hydra_plugins/ablate_sweepers (outside src/ablate/), its sampler/pruner Optuna's
    "hydra/sweeper": (),
    "hydra/sweeper/sampler": (),
    "hydra/sweeper/pruner": (),
    "hydra/job_logging": (),
    "debug": ("callbacks",),
    "distributed": (),
    "speed": ("speed",),
    "eval": ("evaluation",),
    "judge": ("evaluation",),
    "cache": ("data.cache",),  # distributed: TrainingArguments keys
    "shrink": (),  # model.config_overrides values, no _target_ (read by ablate.models.architecture)
    "optimizer/lr": (),
}  # the optimizer's lr a model is fine-tuned at (no code)


def test_every_group_maps_onto_its_code():
    import re

    groups = {str(p.parent.relative_to(CONF)) for p in CONF.rglob("*.yaml") if p.parent != CONF}
    assert groups == set(CODE), "a new conf/ group: name the src/ablate/ module it maps onto in CODE"
    for group, modules in CODE.items():
        for path in (CONF / group).glob("*.yaml"):
            for target in re.findall(r"_target_:\s*ablate\.([\w.]+)", _with_schemas(path.read_text())):
                assert any(target == m or target.startswith(m + ".") for m in modules), (
                    f"conf/{group}/{path.name}: ablate.{target} is not in {modules}"
                )


def _with_schemas(text: str) -> str:
    """A YAML option's text, and the `_target_` of each structured config it selects (`- /schema@_here_: X`)."""
    import re

    from ablate.config.compose import stored

    named = {c.__name__: c for c in stored()}
    picked = re.findall(r"^\s*-\s*/schema@\S+:\s*(\w+)", text, re.M)
    return text + "".join(
        f"\n_target_: {named[n].targets[0]}" for n in picked if n in named and named[n].targets
    )
