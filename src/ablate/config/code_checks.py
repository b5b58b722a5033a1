"""Checks that need the method's code (transformers, torch; what the machine can run: ablate.config.machine),
run after every cheap check of ablate.config.checks: before the run dir exists for a single run (the Validate
callback, in the process that then trains), at the start of each sweep job, and on the objects a run builds.
"""

from __future__ import annotations

import dataclasses
import difflib
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from ablate.config.hints import elsewhere, hydra_node, raw
from ablate.config.machine import check_distributed, check_precision
from ablate.errors import ConfigError
from ablate.rewards import calls
from ablate.schema import BOOL, Schema, call_mismatch, is_int, is_num, refusal


def check_code(
    cfg: DictConfig, swept: frozenset[str] | None = frozenset(), processes: int | None = None
) -> None:
    """The checks that need the method's code (its arguments class and trainer: transformers, torch),
    run after every cheap one: `method.args` fields and their types, each function handed to the
    trainer (the loss, ...) against the call the trainer makes, the trainer class, and whether this
    machine can run the precision and distributed groups. `swept`: keys a multirun sweeps; `processes`:
    the job's ranks when this process is one of them (None: a sweep's driver)."""
    swept = swept or frozenset()
    check_method_args(cfg, swept)
    if cfg.get("eval"):  # eval=[...] at the end of the run: an unknown task or a missing judge refused now
        from ablate.evaluation import results

        results.check(cfg, swept)
    if OmegaConf.select(cfg, "method.trainer._target_") is not None:
        check_trainer_functions(cfg)
        check_reference_free(cfg)
        check_assistant_template(cfg, swept)
        check_reward_functions(cfg)
        environment = OmegaConf.select(cfg, "method.args.environment", default=None)
        # made with no arguments (TRL's)
        if environment is not None and "method.args.environment" not in swept:
            from ablate.rewards import resolve

            resolve.environment(environment, "method.args.environment")
        from hydra.utils import get_class

        check_trainer_class(get_class(cfg.method.trainer._target_))
    if isinstance(cfg.get("precision"), DictConfig):
        check_precision(cfg.precision)
    if isinstance(cfg.get("speed"), DictConfig) and "_target_" in cfg.speed:
        from hydra.utils import get_class

        # whether this machine can run the opt-in switches (ablate.schema.speed.SpeedSwitches: speed.liger
        # needs CUDA); built directly, so its ConfigError is the one line (Hydra's instantiate would wrap it)
        switches = {
            k: v for k, v in OmegaConf.to_container(cfg.speed, resolve=True).items() if k != "_target_"
        }
        get_class(cfg.speed._target_)(**switches)
    if isinstance(cfg.get("distributed"), DictConfig):
        check_distributed(cfg.distributed, processes)


def check_method_args(cfg: DictConfig, swept: frozenset[str] = frozenset()) -> None:
    """Every `method.args` field is one of the method's arguments class (the only list of them there
    is), else one line naming the closest field. A class of the user's that subclasses one of ablate's
    (its schema has no `_target_` of its own) is checked against that schema now; a field that no
    schema checks, typed bool, int or float, must hold one."""
    from hydra.utils import get_class

    cls = get_class(cfg.method.args._target_)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    checked = {f.name for f in dataclasses.fields(cls) if f.metadata.get("check") is not None}
    for k in cfg.method.args:
        if k not in fields and k not in ("_target_", "_recursive_"):
            there = elsewhere(cfg, f"method.args.{k}", raw(cfg.method.args, k))
            hint = difflib.get_close_matches(str(k), fields, n=1)
            meant = f"; {there}" if there else f" (did you mean 'method.args.{hint[0]}'?)" if hint else ""
            raise ConfigError(f"method.args.{k}: {cls.__name__} has no such field{meant}")
        key = f"method.args.{k}"
        if k in fields and key not in swept and k not in checked:
            what = _type_problem(cfg.method.args[k], fields[k].type)
            if what is not None:
                raise ConfigError(refusal(key, cfg.method.args[k], what))
    if issubclass(cls, Schema) and cls not in Schema.declared:
        values = OmegaConf.to_container(cfg.method.args, resolve=True)
        for key, value, what in cls.of(values).problems("method.args"):
            if key not in swept:
                raise ConfigError(refusal(key, value, what))


def _type_problem(v: Any, annotation: Any) -> str | None:
    """What `v` must be for a dataclass field annotated `annotation` (bool, int, float, their unions
    with None or str), or None when it fits or the annotation is anything else (not checked)."""
    text = annotation.__name__ if isinstance(annotation, type) else str(annotation).strip("'\"")
    kinds = {
        t.strip().replace("NoneType", "None") for t in text.replace("Optional[", "").rstrip("]").split("|")
    }
    if not kinds <= {"bool", "int", "float", "str", "None"} or not kinds & {"bool", "int", "float"}:
        return None
    fits = (
        (v is None and "None" in kinds)
        or (isinstance(v, bool) and "bool" in kinds)
        or (is_int(v) and kinds & {"int", "float"})
        or (is_num(v) and "float" in kinds)
        or (isinstance(v, str) and "str" in kinds)
    )
    if fits:
        return None
    what = {"bool": BOOL.words(None, ""), "int": "an integer", "float": "a number"}
    main = next(k for k in ("bool", "int", "float") if k in kinds)
    return what[main] + (" or null" if "None" in kinds else "")


def check_trainer_functions(cfg: DictConfig) -> None:
    """Each function the config hands the trainer (`method.trainer.loss` and the like: `_partial_`
    nodes) must take the call the trainer makes of it, judged by the trainer's own default for that
    argument: a DPO loss picked under method=grpo (`method/dpo_loss=hinge`), or a GRPO aggregation under
    method=dpo, is refused here, before anything is built, naming the options that do fit."""
    import inspect

    from hydra.utils import get_class, instantiate

    node = cfg.method.trainer
    params = inspect.signature(get_class(node._target_).__init__).parameters
    for name, param in params.items():
        value = node.get(name) if name in node else None
        if (
            not inspect.isfunction(param.default)
            or not isinstance(value, DictConfig)
            or "_target_" not in value
        ):
            continue
        problem = call_mismatch(instantiate(value), param.default)
        if problem is not None:
            raise ConfigError(_misfit(cfg, node, name, value, param.default, problem))


def check_reference_free(cfg: DictConfig) -> None:
    """A reference model (`+ref_model=...`) for a loss that reads none (ORPO, CPO, SimPO: marked
    `reference_free`, ablate.losses.reference_free) would be dropped unread: refused before it is loaded."""
    from hydra.utils import instantiate

    from ablate.losses.reference_free import declares

    node = cfg.method.trainer
    loss, ref = node.get("loss"), node.get("ref_model")
    if not isinstance(ref, DictConfig) or not isinstance(loss, DictConfig) or "_target_" not in loss:
        return
    if declares(instantiate(loss), "reference_free"):
        raise ConfigError(
            f"+ref_model with method={OmegaConf.select(cfg, 'method.name', default='?')}: its loss "
            f"({loss._target_}) is reference-free, it reads no reference log-probs, so the reference model "
            "would be loaded for nothing; drop +ref_model"
        )


def check_assistant_template(cfg: DictConfig, swept: frozenset[str]) -> None:
    """`method.args.assistant_only_loss=true` with a local model whose chat template puts no assistant token
    in the loss (ablate.data.chat_templates.masks_no_assistant): the template's fault, named, before the run
    dir exists (the rows would each be blamed)."""
    from ablate.paths import local_model_path

    path = OmegaConf.select(cfg, "model.path", default=None)
    if (
        OmegaConf.select(cfg, "method.args.assistant_only_loss", default=False) is not True
        or not {"method.args.assistant_only_loss", "model.path", "model"}.isdisjoint(swept)
        or not isinstance(path, str)
        or local_model_path(path) is None
        or not (Path(path).expanduser() / "tokenizer_config.json").is_file()
    ):
        return
    from transformers import AutoTokenizer

    from ablate.data.chat_templates import masks_no_assistant

    rendered = masks_no_assistant(AutoTokenizer.from_pretrained(Path(path).expanduser()))
    if rendered is not None:
        where = next(
            f
            for f in ("chat_template.jinja", "tokenizer_config.json")
            if (Path(path).expanduser() / f).is_file()
        )
        raise ConfigError(
            f"method.args.assistant_only_loss=true, but the chat template of model.path={path} ({where}) "
            "puts no token of an assistant turn in the loss: a user turn 'Hi' and an assistant turn 'Hello' "
            f"render as {rendered}, none of it marked the assistant's (render assistant turns, inside "
            "{% generation %} ... {% endgeneration %} if it has markers), or set "
            "method.args.assistant_only_loss=false"
        )


def check_reward_functions(cfg: DictConfig) -> None:
    """The data's reward functions, when the trainer takes them (GRPO), each against the call GRPO makes
    (ablate.rewards.calls): a dotted path (the short form, `data.reward_funcs=[myrew.short]`) or a function
    node handed over as it is (`_partial_: true`: else Hydra would call it now, with no arguments), or a class
    (a reward model: `{_target_: ablate.rewards.RewardModel, path: DIR}`, built once) whose instances take
    it."""
    import inspect

    from hydra.utils import get_class

    from ablate.rewards.reward_model import RewardModel, checked_dir

    funcs = OmegaConf.select(cfg, "data.reward_funcs", default=None)
    trainer = get_class(cfg.method.trainer._target_)
    if (
        not isinstance(funcs, (DictConfig, ListConfig))
        or "reward_funcs" not in inspect.signature(trainer.__init__).parameters
    ):
        return
    items = funcs.items() if isinstance(funcs, DictConfig) else ((f"[{i}]", v) for i, v in enumerate(funcs))
    for name, node in items:
        key = f"data.reward_funcs{name}" if str(name).startswith("[") else f"data.reward_funcs.{name}"
        node_given = isinstance(node, DictConfig) and "_target_" in node
        if not node_given and not isinstance(node, str):
            continue
        target = str(node._target_) if node_given else str(node)
        fn = _located(target, key)
        if fn is None:
            continue
        partial = bool(node.get("_partial_", False)) if node_given else True
        if inspect.isclass(fn):
            problem = _class_problem(fn, key, target, partial)
            if problem is not None:
                raise ConfigError(problem)
            if issubclass(fn, RewardModel) and node_given and node.get("path") is not None:
                # its dir and config.json now, before the run dir (the weights: in the run)
                checked_dir(str(node.path))
            fn = next(k.__dict__["__call__"] for k in fn.__mro__ if "__call__" in k.__dict__)
        elif not partial:
            raise ConfigError(
                f"{key}: add _partial_: true ({key}._partial_=true): {target} is a reward function "
                "the trainer calls each round; without it Hydra would call it now, with no arguments"
            )
        problem = calls.call_problem(fn)
        if problem is not None:
            params = (
                str(inspect.signature(fn)).replace("(self, ", "(")
                if calls._parameters(fn) is not None
                else "(...)"
            )
            raise ConfigError(
                f"{key}: {target}{params} cannot be called as GRPO calls a reward function, "
                f"{calls.CALL} ({problem}); add those arguments, or **kwargs"
            )


def _located(target: str, key: str) -> Any:
    """The object a reward entry names (a module in the current directory too), or None when it cannot be
    found (the target checks said so already)."""
    from ablate.rewards import resolve

    try:
        return resolve.locate(target, key)
    except Exception:  # not found, or its module failed to import: said by the target checks
        return None


def _class_problem(cls: type, key: str, target: str, partial: bool) -> str | None:
    """Why a class listed as a reward cannot be one: its instance is the reward (built once, then called each
    round), so it needs a `__call__` and no `_partial_`."""
    if partial:
        return (
            f"{key}: {target} is a class: drop _partial_ ({key}._partial_=false): the run builds one "
            "instance (a reward model), which it calls each round"
        )
    if not any("__call__" in k.__dict__ for k in cls.__mro__[:-1]):
        return (
            f"{key}: {target} is a class whose instances cannot be called: a reward is a function, or a "
            "class "
            f"with __call__{calls.CALL[1:]} (as ablate.rewards.RewardModel)"
        )
    return None


def _misfit(
    cfg: DictConfig, node: DictConfig, name: str, value: DictConfig, default: Any, problem: str
) -> str:
    """The line for a function that does not fit its trainer argument: the key and group option it
    came from, the call the trainer makes, and the options of that group that fit."""
    import inspect

    key = _source_key(node, name)
    group = key.replace(".", "/")
    hc = hydra_node() if "hydra" not in cfg else cfg.hydra
    choice = OmegaConf.select(hc, f"runtime.choices.{group}", default=None) if hc is not None else None
    task = list(OmegaConf.select(hc, "overrides.task", default=None) or []) if hc is not None else []
    # the option is not what runs
    retargeted = any(str(o).lstrip("+~").startswith(f"{key}._target_=") for o in task)
    picked = (
        f"{group}={choice} ({value._target_})"
        if choice and not retargeted
        else f"{key}._target_={value._target_}"
    )
    method = OmegaConf.select(cfg, "method.name", default="this method")
    trainer = str(node._target_).rsplit(".", 1)[-1]
    call = f"{default.__module__}.{default.__name__}{inspect.signature(default, follow_wrapped=False)}"
    call = call.split(" ->")[0]
    fitting = _fitting_options(group, default)
    options = f"; options that fit: {group}={'|'.join(fitting)}" if fitting else ""
    return (
        f"{picked} does not fit method={method}: {trainer} calls its {name} like {call} ({problem}){options}"
    )


def _source_key(node: DictConfig, name: str) -> str:
    """The config key a trainer argument comes from (`method.trainer.loss: ${..dpo_loss}` ->
    method.dpo_loss)."""
    import re

    ref = re.fullmatch(r"\$\{(\.*)([\w.]+)\}", str(raw(node, name)))
    if ref is None:  # not an interpolation of another key
        return f"method.trainer.{name}"
    dots, key = ref.groups()  # `${..dpo_loss}` from method.trainer: method.dpo_loss
    base = ["method", "trainer"][: 3 - len(dots)] if dots else []
    return ".".join([*base, key])


def _fitting_options(group: str, default: Any) -> list[str]:
    """The options of config group `group` (ablate's conf/) whose function fits like `default`."""
    from hydra.utils import instantiate

    from ablate.paths import conf_dir

    out = []
    for path in sorted((Path(conf_dir()) / group).glob("*.yaml")):
        try:
            option = OmegaConf.load(path)
            if (
                isinstance(option, DictConfig)
                and "_target_" in option
                and call_mismatch(instantiate(option), default) is None
            ):
                out.append(path.stem)
        except Exception:  # an option that does not build is not one to suggest
            continue
    return out


def check_trainable(model: Any) -> None:
    """A quantized policy trains only through adapters (transformers refuses it deep in Trainer)."""
    if getattr(model, "is_quantized", False) and not hasattr(model, "peft_config"):
        raise ConfigError(
            "the policy model is quantized (quantization_config) and has no trainable adapters; "
            "add adapters (+peft=qlora), quantize only the reference (method.trainer.ref_model), "
            "or load the policy unquantized"
        )


def check_trainer_class(cls: Any) -> None:
    """The optimizer group reaches a trainer only through AblateTrainer's hooks: a trainer
    without them would silently train with Trainer's default optimizer instead."""
    from ablate.methods.base import AblateTrainer

    if not (isinstance(cls, type) and issubclass(cls, AblateTrainer)):
        name = getattr(cls, "__qualname__", repr(cls))
        raise ConfigError(
            f"method.trainer._target_: {name} does not subclass ablate.methods.base.AblateTrainer, "
            "so the optimizer group cannot reach it; subclass one of ablate's trainers or "
            "AblateTrainer instead of transformers.Trainer"
        )
