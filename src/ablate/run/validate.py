"""Bad input gets one line naming what to fix, before anything is built or any run dir is touched.

- `check(cfg)`: the composed config: required fields, value types and ranges, unknown root keys,
  data/model paths, the optional packages a `_target_` needs. Raises `ConfigError`.
- `Validate`, a Hydra callback (conf/config.yaml `hydra.callbacks`): runs `check` and the run-dir
  checks in `on_run_start`, which Hydra calls after composing and *before* it creates the run dir or
  writes `.hydra/` and ablate.log into it; a mistake there leaves every existing dir as it was.
  A multirun job is checked by `ablate.train.run` instead (it fails, the sweep goes on).
- `one_line(e)`: Hydra's multi-line composition errors ("not in struct", "Could not find
  'method/dpoo'") as one line that names the key or option that was probably meant.

Only the values ablate's own config defines are range-checked (RULES below); any other
TrainingArguments field is checked by TrainingArguments itself. No torch import here: this runs in
the launching process.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import math
import os
import sys
from pathlib import Path
from typing import Any, Callable

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from ablate.errors import ConfigError, missing_extra

Check = Callable[[Any, DictConfig], bool]


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _grpo(cfg: DictConfig) -> bool:
    return str(OmegaConf.select(cfg, "method.args._target_", default="")).endswith("GRPOConfig")


# dotted key -> (test, what the value must be). A key absent from the config is not checked.
RULES: dict[str, tuple[Check, str]] = {
    "seed": (lambda v, c: _int(v), "an integer"),
    "peak_tflops": (lambda v, c: v is None or (_num(v) and v > 0), "null (measured) or a number > 0 (TFLOP/s)"),
    "optimizer.optimizer.lr": (lambda v, c: _num(v) and v > 0, "a number > 0"),
    "optimizer.optimizer.weight_decay": (lambda v, c: _num(v) and v >= 0, "a number >= 0"),
    "method.args.per_device_train_batch_size": (lambda v, c: _int(v) and v >= 1, "an integer >= 1"),
    "method.args.per_device_eval_batch_size": (lambda v, c: _int(v) and v >= 1, "an integer >= 1"),
    "method.args.gradient_accumulation_steps": (lambda v, c: _int(v) and v >= 1, "an integer >= 1"),
    "method.args.num_train_epochs": (lambda v, c: _num(v) and v > 0, "a number > 0"),
    # 0 is not "no training": Trainer runs one step. -1 means "use num_train_epochs".
    "method.args.max_steps": (lambda v, c: _int(v) and (v == -1 or v >= 1), "-1 (use num_train_epochs) or an integer >= 1"),
    "method.args.max_grad_norm": (lambda v, c: v is None or (_num(v) and v >= 0), "a number >= 0 (0 = no clipping)"),
    "method.args.logging_steps": (lambda v, c: _num(v) and v > 0, "a number > 0"),
    "method.args.eval_steps": (lambda v, c: v is None or (_num(v) and v > 0), "null or a number > 0"),
    "method.args.save_steps": (lambda v, c: _num(v) and v > 0, "a number > 0 (turn checkpoints off with method.args.save_strategy=no)"),
    "method.args.save_total_limit": (lambda v, c: v is None or (_int(v) and v >= 1), "null or an integer >= 1"),
    "method.args.eval_strategy": (lambda v, c: v in ("no", "steps", "epoch"), "one of no, steps, epoch"),
    "method.args.save_strategy": (lambda v, c: v in ("no", "steps", "epoch", "best"), "one of no, steps, epoch, best"),
    "method.args.dataloader_num_workers": (lambda v, c: _int(v) and v >= 0, "an integer >= 0"),
    # DPO's beta scales the implicit reward (beta=0 makes the loss constant; hinge divides by it);
    # GRPO's beta is a KL weight, where 0 turns the reference model off.
    "method.args.beta": (lambda v, c: _num(v) and (v >= 0 if _grpo(c) else v > 0),
                         "a number > 0 (GRPO: >= 0, where 0 means no KL term)"),
    "method.args.max_length": (lambda v, c: v is None or (_int(v) and v >= 1), "an integer >= 1"),
    "method.args.max_prompt_length": (lambda v, c: v is None or (_int(v) and v >= 1), "an integer >= 1"),
    "method.args.max_completion_length": (lambda v, c: (v is None and not _grpo(c)) or (_int(v) and v >= 1),
                                          "an integer >= 1 (DPO: or null)"),
    "method.args.num_generations": (lambda v, c: _int(v) and v >= 2, "an integer >= 2 (the group whose mean is the baseline)"),
    "method.args.steps_per_generation": (lambda v, c: _int(v) and v >= 1, "an integer >= 1"),
    "method.args.temperature": (lambda v, c: _num(v) and v > 0, "a number > 0"),
    "method.args.top_p": (lambda v, c: _num(v) and 0 < v <= 1, "a number in (0, 1]"),
    "method.args.epsilon": (lambda v, c: _num(v) and v >= 0, "a number >= 0"),
    "method.args.epsilon_high": (lambda v, c: v is None or (_num(v) and v >= 0), "null or a number >= 0"),
    "data.max_train_samples": (lambda v, c: v is None or (_int(v) and v >= 1), "null or an integer >= 1"),
    "data.max_eval_samples": (lambda v, c: v is None or (_int(v) and v >= 1), "null or an integer >= 1"),
    "model.dtype": (lambda v, c: v in ("float32", "bfloat16", "float16"), "one of float32, bfloat16, float16"),
}

# `_target_` prefix -> (import name, extra): optional packages, installed by `pip install 'ablate[extra]'`.
EXTRAS: dict[str, tuple[str, str]] = {
    "bitsandbytes.": ("bitsandbytes", "quant"),
    "transformers.BitsAndBytesConfig": ("bitsandbytes", "quant"),
    "ablate.logger.wandb.": ("wandb", "wandb"),
}
# hydra.launcher._target_ prefix -> (import name, extra, the override that chose it)
LAUNCHER_EXTRAS: dict[str, tuple[str, str, str]] = {
    "hydra_plugins.ablate_launchers.ray_launcher.": ("ray", "ray", "hydra/launcher=ray"),
}


def check(cfg: DictConfig, hc: Any = None, swept: frozenset[str] = frozenset()) -> None:
    """Raise ConfigError for the first mistake visible in the composed config `cfg`; `hc` is the
    hydra node (`cfg.hydra` when Hydra's callbacks pass the full config, else HydraConfig.get()).
    `swept`: keys a multirun sweeps, whose value in `cfg` is not what any job gets (not checked)."""
    if hc is None:
        hc = cfg.hydra if "hydra" in cfg else _hydra_node()
    try:
        _check(cfg, hc, swept)
    except OmegaConfBaseException as e:  # e.g. ${oc.env:UNSET}
        key = getattr(e, "full_key", None)
        raise ConfigError(f"{key + ': ' if key else ''}{str(e).splitlines()[0]}") from None


def _check(cfg: DictConfig, hc: Any, swept: frozenset[str]) -> None:
    _check_extras(cfg)  # first: the other checks may import modules that probe the optional packages
    _check_missing(cfg, hc, swept)
    _check_root_keys(cfg, hc)
    _check_added_args(cfg, hc)
    values = {key: OmegaConf.select(cfg, key, default=KeyError) for key in RULES}
    for key, (ok, what) in RULES.items():
        v = values[key]
        if v is not KeyError and key not in swept and not ok(v, cfg):
            raise ConfigError(f"{key}={_show(v)}: must be {what}")
    _check_paths(cfg)


def _show(v: Any) -> str:
    return "null" if v is None else str(v).lower() if isinstance(v, bool) else str(v)


def _hydra_node() -> Any:
    from hydra.core.hydra_config import HydraConfig

    return HydraConfig.get() if HydraConfig.initialized() else None


def _check_missing(cfg: DictConfig, hc: Any, swept: frozenset[str]) -> None:
    """`???` fields (data=jsonl's train_path, model=local's path): name the group and the fix."""
    task = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"]) if "hydra" in cfg else cfg
    missing = sorted(set(OmegaConf.missing_keys(task)) - swept)
    if missing:
        key = missing[0]
        root = key.split(".")[0]
        choice = OmegaConf.select(hc, f"runtime.choices.{root}", default=None) if hc is not None else None
        group = f" ({root}={choice} needs it)" if choice else ""
        raise ConfigError(f"{key} is required{group}: add {key}=...")


def _known_roots(hc: Any) -> set[str]:
    """Root keys that come from ablate's config: the primary config's own keys and config groups."""
    from ablate.paths import conf_dir

    known = {"hydra"}
    known |= {str(k) for k in OmegaConf.load(Path(conf_dir()) / "config.yaml") if k != "defaults"}
    choices = OmegaConf.select(hc, "runtime.choices", default=None) or {}
    known |= {str(group).split("/")[0].split("@")[0] for group in choices}
    return known


def _overrides(hc: Any) -> list[str] | None:
    """The task overrides as given (reading them through OmegaConf would resolve `${oc.env:...}`)."""
    node = OmegaConf.select(hc, "overrides.task", default=None) if hc is not None else None
    return None if node is None else [str(o) for o in OmegaConf.to_container(node, resolve=False)]


def _check_root_keys(cfg: DictConfig, hc: Any) -> None:
    """A `+key=value` at the root that is no config group (`+precison=bf16`) would compose as a plain
    value nothing reads, and the run would train without it: refuse it, naming the likely key."""
    overrides = _overrides(hc)
    if overrides is None:
        return
    added = {str(o).lstrip("+").split("=")[0].split(".")[0] for o in overrides if str(o).startswith("+")}
    known = _known_roots(hc)
    for root in sorted(added - known):
        if root in cfg:
            hint = difflib.get_close_matches(root, sorted(known - {"hydra"}), n=1)
            meant = f"did you mean '{hint[0]}'?" if hint else f"known keys: {', '.join(sorted(known - {'hydra'}))}"
            raise ConfigError(f"unknown root key '{root}' (nothing reads it; {meant})")


def _check_added_args(cfg: DictConfig, hc: Any) -> None:
    """`+method.args.<field>=...` must name a field of the method's arguments class. Only then is the
    class imported here (it pulls in transformers: seconds); every run checks it again at start."""
    overrides = _overrides(hc)
    if any(str(o).lstrip("+").startswith("method.args.") and str(o).startswith("+") for o in overrides or []):
        check_method_args(cfg)


def _check_paths(cfg: DictConfig) -> None:
    """Data files and a local model dir exist (checked before the model is loaded)."""
    data = cfg.get("data") or {}
    for key in ("train_path", "eval_path"):
        path = data.get(key) if isinstance(data, DictConfig) else None
        if isinstance(path, str) and not Path(path).expanduser().is_file():
            what = "is a directory, not a JSON-lines file" if Path(path).expanduser().is_dir() else "not found"
            raise ConfigError(f"data.{key}={path}: {what}")
    model = cfg.get("model") or {}
    path = model.get("path") if isinstance(model, DictConfig) else None
    if isinstance(path, str) and path.startswith(("/", ".", "~")) or (isinstance(path, str) and Path(path).exists()):
        local = Path(path).expanduser()
        if not (local / "config.json").is_file() and not (local / "adapter_config.json").is_file():  # a +peft run's model/ loads too
            why = "not found" if not local.exists() else "no config.json there"
            raise ConfigError(f"model.path={path} is not a save_pretrained directory ({why})")


def _targets(node: Any, prefix: str = "") -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    if isinstance(node, DictConfig):
        for k in node.keys():
            if k == "hydra" and not prefix:
                continue
            v = node._get_node(k)
            if k == "_target_":
                out.append((prefix + "_target_", str(node[k])))
            elif isinstance(v, DictConfig):
                out += _targets(v, f"{prefix}{k}.")
    return out


def _check_extras(cfg: DictConfig) -> None:
    for key, target in _targets(cfg):
        for prefix, (module, extra) in EXTRAS.items():
            if target.startswith(prefix) and not installed(module):
                raise missing_extra(module, extra, f"{key}={target}")


def check_launcher(hc: Any) -> None:
    """The multirun's launcher needs an optional package that is missing: one line naming the extra."""
    target = str(OmegaConf.select(hc, "launcher._target_", default="") or "")
    for prefix, (module, extra, what) in LAUNCHER_EXTRAS.items():
        if target.startswith(prefix) and not installed(module):
            raise missing_extra(module, extra, what)


def installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def check_dir(path: Path, key: str) -> None:
    """`path` (hydra.run.dir / hydra.sweep.dir) is, or can be created as, a writable directory.
    Nothing is written into an existing dir (the write test is os.access)."""
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{key}={path} is a file, not a directory")
    parent = path
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise ConfigError(f"{key}={path}: {parent} is a file, not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f"{key}={path}: {parent} is not writable")
    if parent != path:  # create it now: a failure is ours to report, and nothing existing is touched
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ConfigError(f"{key}={path}: cannot create it ({e.strerror})") from None


def check_run_dir(run_dir: Path, hc: Any) -> None:
    """A single run's dir is absent, empty, or an ablate run dir (a readable run.json) of the same
    overrides, and no live process holds its lock: checked before Hydra writes `.hydra/` and
    ablate.log into it, so a user's dir (or another run's) is refused untouched. `ablate.train`
    checks the same again, for multirun jobs and for a process that took the dir in between."""
    from ablate.run import rundir
    from ablate.run.secrets import mask

    if not rundir.is_main_process():  # rank 0 checks (and then holds) the dir its other ranks share
        return
    rundir.is_usable(run_dir)
    rundir.check_unlocked(run_dir)
    info = rundir.read_json_checked(run_dir / rundir.RUN) if run_dir.is_dir() else None
    overrides = _overrides(hc)
    if info is not None and overrides is not None and sorted(info.get("overrides", [])) != sorted(mask(overrides)):
        raise ConfigError(f"{run_dir.resolve()} holds another run (overrides {info.get('overrides')}); "
                          "pick a new hydra.run.dir, or repeat that run's exact overrides to resume it")


class Validate(Callback):
    """Hydra callback: a single run's config and run dir are checked before Hydra touches the dir.
    Hydra turns a callback's exception into a warning, so a refusal exits here (code 2)."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        def checks() -> None:
            check(config)  # first: reading hydra.run.dir may resolve a bad ${oc.env:...} override
            run_dir = Path(str(config.hydra.run.dir))
            check_dir(run_dir, "hydra.run.dir")
            check_run_dir(run_dir, config.hydra)

        _exit_on_error(checks)

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        """A mistake in a sweep's fixed values would fail every job: refuse the sweep instead. The
        config here is the defaults plus the fixed overrides; when a group is swept the jobs'
        configs differ from it too much to judge, so each job is checked when it starts."""
        _exit_on_error(lambda: check_launcher(config.hydra))  # before any job is submitted
        swept = _swept(config)
        if swept is None:
            _exit_on_error(lambda: check_dir(Path(str(config.hydra.sweep.dir)), "hydra.sweep.dir"))
        else:
            _exit_on_error(lambda: (check(config, swept=swept),
                                    check_dir(Path(str(config.hydra.sweep.dir)), "hydra.sweep.dir")))


def _swept(config: DictConfig) -> frozenset[str] | None:
    """The keys a multirun sweeps, or None when it sweeps a config group (or they cannot be read)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    choices = OmegaConf.select(config, "hydra.runtime.choices", default=None) or {}
    try:
        parsed = OverridesParser.create().parse_overrides(_overrides(config.hydra) or [])
    except Exception:  # noqa: BLE001 - Hydra parsed them already; never refuse a sweep on our own parse
        return None
    keys = {o.key_or_group for o in parsed if o.is_sweep_override()}
    return None if any(k in choices or "/" in k for k in keys) else frozenset(keys)


def _exit_on_error(fn: Callable[[], Any]) -> None:
    from ablate.run.rundir import RunDirError

    try:
        fn()
    except (ConfigError, RunDirError) as e:
        from ablate.run.secrets import mask_text

        print(f"ablate: error: {mask_text(str(e))}", file=sys.stderr)
        sys.exit(2)


def one_line(e: BaseException) -> str | None:
    """The user-facing line for a config/composition error, or None for anything else (a bug)."""
    from hydra.errors import (
        HydraException,
        MissingConfigException,
        OverrideParseException,
    )

    from ablate.errors import USER_ERRORS

    cause = e
    while cause is not None:
        if isinstance(cause, USER_ERRORS):
            return str(cause).splitlines()[0] if str(cause) else type(cause).__name__
        cause = cause.__cause__
    line = _bad_config_file(e)
    if line is not None:
        return line
    if isinstance(e, OverrideParseException):
        return f"cannot parse the override '{e.override}': {str(e).splitlines()[0]}"
    if isinstance(e, MissingConfigException):
        return _missing_option(e)
    if isinstance(e, HydraException) and isinstance(e.__cause__, OmegaConfBaseException) \
            and "not in struct" in str(e.__cause__):
        return _unknown_key(e.__cause__)
    if isinstance(e, (HydraException, OmegaConfBaseException)):
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
        return " ".join(lines[:3]) if lines else type(e).__name__
    return None


def _bad_config_file(e: BaseException) -> str | None:
    """A config file (conf/, a sweep config, --config-dir) that is not YAML or not UTF-8."""
    import yaml

    while e is not None:
        if isinstance(e, yaml.MarkedYAMLError):
            mark = e.problem_mark or e.context_mark
            where = f"{mark.name} line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "a config file"
            return f"{where}: not valid YAML ({e.problem or e.context})"
        if isinstance(e, UnicodeDecodeError):
            return f"a config file is not UTF-8 text (byte 0x{e.object[e.start]:02x}); save it as UTF-8"
        e = e.__cause__ or e.__context__
    return None


def _missing_option(e: Any) -> str:
    missing = str(getattr(e, "missing_cfg_file", "") or "")
    group, _, option = missing.rpartition("/")
    if missing.startswith("hydra/launcher/submitit"):
        return missing_extra("hydra_plugins.hydra_submitit_launcher", "slurm", "hydra/launcher=slurm").args[0]
    options = list(getattr(e, "options", None) or [])
    if not group or not options:
        return str(e).splitlines()[0]
    hint = difflib.get_close_matches(option, options, n=1)
    meant = f"did you mean {group}={hint[0]}? " if hint else ""
    return f"no option '{option}' in config group '{group}' ({meant}options: {', '.join(options)})"


def _unknown_key(cause: Any) -> str:
    key = str(getattr(cause, "full_key", "") or "")
    parent = getattr(cause, "parent_node", None)
    leaf = key.rsplit(".", 1)[-1]
    prefix = key[: -len(leaf)]
    known = [str(k) for k in parent.keys()] if isinstance(parent, DictConfig) else []
    hint = difflib.get_close_matches(leaf, known, n=1)
    if hint:
        return f"unknown config key '{key}' (did you mean '{prefix}{hint[0]}'?)"
    return f"unknown config key '{key}'; known under '{prefix.rstrip('.') or '<root>'}': {', '.join(known)}" \
           f" (to add a new field on purpose: +{key}=...)"


# ---- checks at run time: on the method, the device and the built objects (need torch) ----


def check_method_args(cfg: DictConfig) -> None:
    """Every `method.args` field is one of the method's arguments class (the only list of them there
    is), else one line naming the closest field."""
    from hydra.utils import get_class

    cls = get_class(cfg.method.args._target_)
    known = {f.name for f in dataclasses.fields(cls)}
    for k in cfg.method.args:
        if k not in known and k != "_target_":
            hint = difflib.get_close_matches(str(k), known, n=1)
            meant = f" (did you mean 'method.args.{hint[0]}'?)" if hint else ""
            raise ConfigError(f"method.args.{k}: {cls.__name__} has no such field{meant}")


def check_precision(args: Any) -> dict[str, Any]:
    """`args`: the precision node (fp16 / tf32 flags), checked before any TrainingArguments exist.
    Returns extra TrainingArguments: bf16 on a machine without any accelerator trains on the CPU
    (`use_cpu`), where torch autocasts to bfloat16; transformers refuses bf16 there without it."""
    import torch
    from transformers.utils import is_torch_bf16_gpu_available

    if getattr(args, "fp16", False) and not torch.cuda.is_available():
        # accelerate silently ignores fp16 on CPU (no autocast, no scaler): refuse rather than pretend
        raise ConfigError("precision=fp16 needs a CUDA GPU (on CPU it would silently train in fp32); use precision=bf16 or fp32")
    if getattr(args, "tf32", None) and not torch.cuda.is_available():
        raise ConfigError("precision.tf32=true needs an Ampere or newer CUDA GPU; leave it null on CPU")
    if getattr(args, "bf16", False) and not is_torch_bf16_gpu_available():
        if has_accelerator():  # never move a GPU run to the CPU behind the user's back
            raise ConfigError("precision=bf16 needs a GPU with bfloat16 support (CUDA: Ampere or newer); "
                              "use precision=fp32 (or fp16 on CUDA)")
        return {"use_cpu": True}
    return {}


def has_accelerator() -> bool:
    """Any GPU-like device torch can use (CUDA, ROCm, MPS, XPU, ...)."""
    import torch

    accelerator = getattr(torch, "accelerator", None)  # torch >= 2.6
    if accelerator is not None:
        return bool(accelerator.is_available())
    return torch.cuda.is_available() or torch.backends.mps.is_available()


def check_distributed(args: Any) -> None:
    """`args`: the distributed node. accelerate runs CPU processes as MULTI_CPU (DDP) whatever `fsdp`
    says: refuse rather than pretend the model is sharded."""
    import torch

    if getattr(args, "fsdp", False) and not torch.cuda.is_available():
        raise ConfigError("distributed=fsdp needs CUDA GPUs (on CPU accelerate would silently run plain DDP); "
                          "use distributed=ddp")


def check_trainable(model: Any) -> None:
    """A quantized policy trains only through adapters (transformers refuses it deep in Trainer)."""
    if getattr(model, "is_quantized", False) and not hasattr(model, "peft_config"):
        raise ConfigError("the policy model is quantized (quantization_config) and has no trainable adapters; "
                          "add adapters (+peft=qlora), quantize only the reference (method.trainer.ref_model), "
                          "or load the policy unquantized")


def check_trainer_class(cls: Any) -> None:
    """The optimizer group reaches a trainer only through ConfiguredOptimizer's hooks: a trainer
    without them would silently train with Trainer's default optimizer instead."""
    from ablate.methods.optim import ConfiguredOptimizer

    if not (isinstance(cls, type) and issubclass(cls, ConfiguredOptimizer)):
        name = getattr(cls, "__qualname__", repr(cls))
        raise ConfigError(f"method.trainer._target_: {name} does not subclass ablate.methods.optim.ConfiguredOptimizer, "
                          "so the optimizer group cannot reach it; subclass one of ablate's trainers or add "
                          "ConfiguredOptimizer as its first base")
