"""The value rules of ablate's config (`RULES`: key -> test, what the value must be), and how a
refused value is said. No torch, no transformers: the launching process checks a config with them
(ablate.run.validate) before any run dir exists.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from omegaconf import DictConfig, ListConfig, OmegaConf

from ablate.run.memory import MAX_THRESHOLD as MAX_MMAP_THRESHOLD

Check = Callable[[Any, DictConfig], bool]


def is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def is_grpo(cfg: DictConfig) -> bool:
    """GRPO's arguments, or RLOO's (GRPO's rollouts and batches)."""
    return str(OmegaConf.select(cfg, "method.args._target_", default="")).endswith(("GRPOConfig", "RLOOConfig"))


def _is_distill(cfg: DictConfig) -> bool:
    return str(OmegaConf.select(cfg, "method.args._target_", default="")).endswith("DistillConfig")


def _is(cfg: DictConfig, config_class: str) -> bool:
    return str(OmegaConf.select(cfg, "method.args._target_", default="")).endswith(config_class)


def at(cfg: DictConfig, key: str, default: Any = None) -> Any:
    return OmegaConf.select(cfg, key, default=default)


def _fraction(v: Any, high: float = 1.0) -> bool:
    return is_num(v) and 0 <= v <= high


def _grpo_batch(v: Any, c: DictConfig) -> bool:
    """GRPO's batches count completions: whole groups of num_generations."""
    g = at(c, "method.args.num_generations")
    return not is_grpo(c) or not is_int(g) or g < 1 or v % g == 0


def _eval_batch(v: Any, c: DictConfig) -> bool:
    return at(c, "method.args.eval_strategy") == "no" or _grpo_batch(v, c)


def _delta(v: Any, c: DictConfig) -> bool:
    high = at(c, "method.args.epsilon_high")
    high = at(c, "method.args.epsilon") if high is None else high
    return v is None or (is_num(v) and (not is_num(high) or v > 1 + high))


FLOAT32_MAX = 3.4028234663852886e38  # the parameters' dtype bounds every update the optimizer computes


def _lr(v: Any, c: DictConfig) -> bool:
    """An lr torch can use: > 0, and Adam's first update lr / (1 - beta1) a float32 (1e38 overflowed inside AdamW)."""
    betas = at(c, "optimizer.optimizer.betas")
    beta1 = betas[0] if isinstance(betas, ListConfig) and len(betas) and is_num(betas[0]) and betas[0] < 1 else 0.0
    return is_num(v) and 0 < v and v / (1 - beta1) < FLOAT32_MAX


def reward_names(c: DictConfig) -> list[str]:
    """The data's reward functions, without those set to null (dropped, as a null callback is): a mapping's
    names, or the short form's dotted paths (`data.reward_funcs=[myrew.short]`)."""
    funcs = at(c, "data.reward_funcs")
    if isinstance(funcs, ListConfig):
        return [str(v.get("_target_", v)) if isinstance(v, DictConfig) else str(v) for v in funcs if v is not None]
    return [str(k) for k, v in funcs.items() if v is not None] if isinstance(funcs, DictConfig) else []


def _reward_weights(v: Any, c: DictConfig) -> bool:
    funcs = at(c, "data.reward_funcs")
    n = len(reward_names(c)) if isinstance(funcs, (DictConfig, ListConfig)) else None  # a mapping, or the short form's list
    return v is None or (isinstance(v, ListConfig) and all(is_num(w) for w in v) and (n is None or len(v) == n))


def _heads_divide(v: Any, c: DictConfig) -> bool:
    heads = at(c, "model.num_heads")
    return is_int(v) and v >= 1 and (not is_int(heads) or heads < 1 or v % heads == 0)


def _labels(v: Any) -> bool:
    return isinstance(v, ListConfig) and all(isinstance(t, (str, int, float)) for t in v)


def _bool(v: Any, c: DictConfig) -> bool:
    return isinstance(v, bool)


BOOL = "true or false"


# dotted key -> (test, what the value must be: text, or text made from the config). A key absent
# from the config is not checked.
RULES: dict[str, tuple[Check, str | Callable[[DictConfig], str]]] = {
    "seed": (lambda v, c: is_int(v) and 0 <= v < 2**32, "an integer in 0..4294967295 (numpy's seed range)"),
    "threads": (lambda v, c: v is None or (is_int(v) and v >= 1), "null (the cores available) or an integer >= 1"),
    "malloc_mmap_threshold": (lambda v, c: v is None or (is_int(v) and 0 <= v <= MAX_MMAP_THRESHOLD),
                              f"null (malloc's default) or bytes in 0..{MAX_MMAP_THRESHOLD} (e.g. 131072)"),
    "tags": (lambda v, c: v is None or _labels(v), "a list: tags=[baseline] (several: 'tags=[baseline,v2]')"),
    "optimizer.optimizer.betas": (lambda v, c: isinstance(v, ListConfig) and len(v) == 2 and all(is_num(b) and 0 <= b < 1 for b in v),
                                  "two numbers in [0, 1): 'optimizer.optimizer.betas=[0.9,0.999]'"),
    "optimizer.optimizer.momentum": (lambda v, c: is_num(v) and v >= 0, "a number >= 0"),
    "optimizer.optimizer.eps": (lambda v, c: is_num(v) and v > 0, "a number > 0"),
    "optimizer.scheduler.warmup_ratio": (lambda v, c: _fraction(v), "a fraction of the steps in [0, 1]"),
    "optimizer.scheduler.warmup_steps": (lambda v, c: is_int(v) and v >= 0, "an integer >= 0"),
    "optimizer.scheduler.min_ratio": (lambda v, c: _fraction(v), "a fraction of the peak lr in [0, 1]"),
    "optimizer.scheduler.step_size": (lambda v, c: is_int(v) and v >= 1, "an integer >= 1"),
    "optimizer.scheduler.gamma": (lambda v, c: is_num(v) and v > 0, "a number > 0"),
    "model.hidden_size": (_heads_divide, lambda c: f"an integer >= 1 divisible by model.num_heads={at(c, 'model.num_heads')}"),
    "model.num_layers": (lambda v, c: is_int(v) and v >= 1, "an integer >= 1"),
    "model.num_heads": (lambda v, c: is_int(v) and v >= 1, "an integer >= 1"),
    "model.intermediate_size": (lambda v, c: is_int(v) and v >= 1, "an integer >= 1"),
    "model.max_position_embeddings": (lambda v, c: is_int(v) and v >= 1, "an integer >= 1"),
    "peft.r": (lambda v, c: is_int(v) and v >= 1, "an integer >= 1 (the adapter rank)"),
    "peft.lora_alpha": (lambda v, c: is_num(v) and v > 0, "a number > 0"),
    "peft.lora_dropout": (lambda v, c: is_num(v) and 0 <= v < 1, "a number in [0, 1)"),
    "peft.target_modules": (lambda v, c: v == "all-linear" or (isinstance(v, ListConfig) and len(v) > 0
                                                               and all(isinstance(m, str) for m in v)),
                            "all-linear or a list of module names: 'peft.target_modules=[q_proj,v_proj]'"),
    "peft.bias": (lambda v, c: v in ("none", "all", "lora_only"), "one of none, all, lora_only"),
    "peft.use_rslora": (_bool, BOOL),
    "peft.use_dora": (_bool, BOOL),
    "peft.save_merged": (_bool, BOOL),
    "perf.liger": (_bool, BOOL),
    "perf.compile": (_bool, BOOL),
    "precision.bf16": (_bool, BOOL),
    "precision.fp16": (_bool, BOOL),
    "precision.tf32": (lambda v, c: v is None or isinstance(v, bool), "true, false or null"),
    "logger.mode": (lambda v, c: v in ("online", "offline", "disabled"), "one of online, offline, disabled"),
    "callbacks.early_stop.mode": (lambda v, c: v in ("min", "max"), "min (lower is better) or max"),
    "callbacks.early_stop.patience": (lambda v, c: is_int(v) and v >= 1, "an integer >= 1"),
    "callbacks.early_stop.min_delta": (lambda v, c: is_num(v) and v >= 0, "a number >= 0"),
    # a probability that a preference label is flipped (robust, cDPO): 0.5 makes the labels noise
    "method.loss.label_smoothing": (lambda v, c: is_num(v) and 0 <= v < 0.5, "a number in [0, 0.5)"),
    "peak_tflops": (lambda v, c: v is None or (is_num(v) and v > 0), "null (measured) or a number > 0 (TFLOP/s)"),
    "optimizer.optimizer.lr": (_lr, lambda c: "a number > 0" + (
        f" with lr / (1 - beta1) under float32's largest, {FLOAT32_MAX:.3g} (Adam's first update: torch cannot "
        f"represent it)" if isinstance(at(c, "optimizer.optimizer.betas"), ListConfig) else
        f" under float32's largest, {FLOAT32_MAX:.3g}")),
    "optimizer.optimizer.weight_decay": (lambda v, c: is_num(v) and v >= 0, "a number >= 0"),
    "method.args.per_device_train_batch_size": (
        lambda v, c: is_int(v) and v >= (2 if _is(c, "KTOConfig") else 1) and _grpo_batch(v, c),
        lambda c: "an integer >= 1" + (f" and a multiple of method.args.num_generations={at(c, 'method.args.num_generations')} "
                                       "(GRPO's batch counts completions, whole groups)" if is_grpo(c) else "")
        if not _is(c, "KTOConfig") else "an integer >= 2 (KTO's KL estimate pairs each example with another's output)"),
    "method.args.per_device_eval_batch_size": (
        lambda v, c: is_int(v) and v >= 1 and _eval_batch(v, c),
        lambda c: "an integer >= 1" + (f" and a multiple of method.args.num_generations={at(c, 'method.args.num_generations')}"
                                       if is_grpo(c) else "")),
    "method.args.gradient_accumulation_steps": (lambda v, c: is_int(v) and v >= 1, "an integer >= 1"),
    "method.args.num_train_epochs": (lambda v, c: is_num(v) and v > 0, "a number > 0"),
    # 0 is not "no training": Trainer runs one step. -1 means "use num_train_epochs".
    "method.args.max_steps": (lambda v, c: is_int(v) and (v == -1 or v >= 1), "-1 (use num_train_epochs) or an integer >= 1"),
    "method.args.max_grad_norm": (lambda v, c: v is None or (is_num(v) and v >= 0), "a number >= 0 (0 = no clipping)"),
    "method.args.logging_steps": (lambda v, c: is_num(v) and v > 0, "a number > 0"),
    "method.args.eval_steps": (lambda v, c: v is None or (is_num(v) and v > 0), "null or a number > 0"),
    "method.args.save_steps": (lambda v, c: is_num(v) and v > 0, "a number > 0 (turn checkpoints off with method.args.save_strategy=no)"),
    "method.args.save_total_limit": (lambda v, c: v is None or (is_int(v) and v >= 1), "null or an integer >= 1"),
    "method.args.eval_strategy": (lambda v, c: v in ("no", "steps", "epoch"), "one of no, steps, epoch"),
    "method.args.save_strategy": (lambda v, c: v in ("no", "steps", "epoch", "best"), "one of no, steps, epoch, best"),
    "method.args.dataloader_num_workers": (lambda v, c: is_int(v) and v >= 0, "an integer >= 0"),
    # DPO's beta scales the implicit reward (beta=0 makes the loss constant; hinge divides by it);
    # GRPO's and RLOO's beta is a KL weight, where 0 turns the reference model off; distillation's picks the
    # divergence (0 = forward KL, 1 = reverse KL)
    "method.args.beta": (lambda v, c: is_num(v) and (v >= 0 if is_grpo(c) else 0 <= v <= 1 if _is_distill(c) else v > 0),
                         "a number > 0 (GRPO, RLOO: >= 0, where 0 means no KL term; distill: in [0, 1])"),
    "method.args.max_length": (lambda v, c: v is None or (is_int(v) and v >= 1), "an integer >= 1"),
    "method.args.max_prompt_length": (lambda v, c: v is None or (is_int(v) and v >= 1), "an integer >= 1"),
    "method.args.max_completion_length": (lambda v, c: (v is None and not is_grpo(c)) or (is_int(v) and v >= 1),
                                          "an integer >= 1 (DPO: or null)"),
    "method.args.num_generations": (lambda v, c: is_int(v) and v >= 2, "an integer >= 2 (the group whose mean is the baseline)"),
    "method.args.steps_per_generation": (lambda v, c: is_int(v) and v >= 1, "an integer >= 1"),
    "method.args.max_staleness": (lambda v, c: is_int(v) and v >= 0, "an integer >= 0 (0 = synchronous GRPO)"),
    "method.args.generation_dtype": (  # the async worker's (ablate.rollouts.ahead): a synchronous run has none
        lambda v, c: v is None or (v in ("float32", "bfloat16") and is_int(s := at(c, "method.args.max_staleness")) and s > 0),
        "null, float32 or bfloat16, with method.args.max_staleness > 0 (the async generation worker's dtype)"),
    "method.args.async_threads": (  # ablate.rollouts.cores: the async worker's idle cores; a synchronous run has all
        lambda v, c: v == "split" or (v == "balanced" and is_int(s := at(c, "method.args.max_staleness")) and s > 0),
        "split, or balanced with method.args.max_staleness > 0 (the trainer taking the idle async worker's threads)"),
    # tools over several turns (ablate.rollouts.turns; GRPOConfig checks the same at run time)
    "method.args.tool_call_format": (lambda v, c: v in ("auto", "chat_template", "hermes"),
                                     "auto, chat_template or hermes (ablate.rollouts.tools)"),
    "method.args.max_tool_calling_iterations": (lambda v, c: v is None or (is_int(v) and v >= 0),
                                                "null (no limit) or an integer >= 0"),
    "method.args.tool_timeout": (lambda v, c: v is None or (is_num(v) and v > 0), "null (no limit) or seconds > 0"),
    "method.args.environment": (  # the async worker's process would hold the environments, out of the trainer's reach
        lambda v, c: v is None or not is_int(s := at(c, "method.args.max_staleness")) or s == 0,
        "null when method.args.max_staleness > 0 (the async worker would hold the environments, out of the trainer's "
        "reach; use max_staleness=0)"),
    "method.args.vllm_importance_sampling_mode": (  # ablate.losses.is_correction.MODES (TRL's)
        lambda v, c: v in ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask"),
        "one of token_truncate, token_mask, sequence_truncate, sequence_mask"),
    "method.args.off_policy_mask_threshold": (lambda v, c: v is None or (is_num(v) and v >= 0), "null or a number >= 0"),
    "method.args.temperature": (lambda v, c: is_num(v) and v > 0, "a number > 0"),
    "method.args.top_p": (lambda v, c: is_num(v) and 0 < v <= 1, "a number in (0, 1]"),
    "method.args.epsilon": (lambda v, c: is_num(v) and v >= 0, "a number >= 0"),
    "method.args.epsilon_high": (lambda v, c: v is None or (is_num(v) and v >= 0), "null or a number >= 0"),
    "method.args.top_k": (lambda v, c: is_int(v) and v >= 0, "an integer >= 0 (0 = off)"),
    "method.args.num_iterations": (lambda v, c: is_int(v) and v >= 1, "an integer >= 1 (passes over each generation round)"),
    "method.args.importance_sampling_level": (
        lambda v, c: v == "token" if _is(c, "RLOOConfig") else v in ("token", "sequence"),
        lambda c: "token: RLOO's ratio is always one per completion (sequence is GRPO's GSPO)" if _is(c, "RLOOConfig")
        else "token (GRPO) or sequence (GSPO)"),
    "method.args.train_sampling_strategy": (
        lambda v, c: v == "sequential" or not _is(c, "KTOConfig"),
        "sequential for KTO (the KL pairs are fixed in the data's order; TRL's KTO samples sequentially too)"),
    "method.args.delta": (_delta, "null or a number > 1 + epsilon_high (two-sided clipping caps the ratio above the clip range)"),
    "method.args.reward_weights": (
        _reward_weights, lambda c: f"null or a list of {len(reward_names(c))} numbers, one per "
                                   f"data.reward_funcs entry ({', '.join(reward_names(c))})"),
    # the new methods' own values (issue 35), checked here before torch as well as in their dataclasses
    "method.args.center_rewards_coefficient": (lambda v, c: v is None or (is_num(v) and v >= 0),
                                               "null (off) or a number >= 0 (reward: the centring term's weight)"),
    "method.args.desirable_weight": (lambda v, c: is_num(v) and v > 0, "a number > 0 (KTO: a weight of its examples' losses)"),
    "method.args.undesirable_weight": (lambda v, c: is_num(v) and v > 0, "a number > 0 (KTO: a weight of its examples' losses)"),
    "method.args.reward_clip_range": (
        lambda v, c: v is None or (isinstance(v, ListConfig) and len(v) == 2 and all(map(is_num, v)) and v[0] <= v[1]),
        "null or [min, max] with min <= max (RLOO: rewards clipped to it)"),
    "method.args.use_cpu": (_bool, BOOL),
    "method.args.disable_tqdm": (_bool, BOOL),
    "data.max_train_samples": (lambda v, c: v is None or (is_int(v) and v >= 1), "null or an integer >= 1"),
    "data.max_eval_samples": (lambda v, c: v is None or (is_int(v) and v >= 1), "null or an integer >= 1"),
    "model.dtype": (lambda v, c: v in ("float32", "bfloat16", "float16"), "one of float32, bfloat16, float16"),
}

def refusal(key: str, v: Any, what: str) -> str:
    """`key=value: must be ...`; a number written as a quoted string gets the spelling that makes it one."""
    if isinstance(v, str) and _looks_numeric(v) and ("number" in what or "integer" in what):
        return (f"{key}='{v}' is a string (quoted), not a number: write it unquoted, {key}={v} (in a YAML file "
                f"{key.rsplit('.', 1)[-1]}: {v} without quotes; YAML 1.1 reads 1e-3 as text: write 1.0e-3)")
    return f"{key}={show(v)}: must be {what}"


def _looks_numeric(v: str) -> bool:
    try:
        float(v)
    except ValueError:
        return False
    return True


def show(v: Any) -> str:
    if isinstance(v, ListConfig):
        return "[" + ",".join(show(x) for x in v) + "]"
    return "null" if v is None else str(v).lower() if isinstance(v, bool) else str(v)


# TrainingArguments fields that ablate's optimizer group replaces (ablate.methods.optim builds the
# optimizer and schedule from `optimizer`): set in method.args they would be silently ignored.
OPTIMIZER_FIELDS = {
    "learning_rate": "optimizer.optimizer.lr={v}",
    "weight_decay": "optimizer.optimizer.weight_decay={v}",
    "adam_beta1": "'optimizer.optimizer.betas=[{v},0.999]'",
    "adam_beta2": "'optimizer.optimizer.betas=[0.9,{v}]'",
    "adam_epsilon": "+optimizer.optimizer.eps={v}",
    "optim": "optimizer=adamw|adamw_8bit|sgd (conf/optimizer/)",
    "optim_args": "optimizer.optimizer.<field>=... (the optimizer's own arguments)",
    "lr_scheduler_type": "optimizer/scheduler=constant|cosine|step (conf/optimizer/scheduler/)",
    "lr_scheduler_kwargs": "optimizer.scheduler.<field>=... (the schedule's own arguments)",
    "warmup_ratio": "optimizer.scheduler.warmup_ratio={v} (the cosine schedule)",
    "warmup_steps": "optimizer/scheduler=constant optimizer.scheduler.warmup_steps={v}, or "
                    "optimizer.scheduler.warmup_ratio=... (cosine)",
}


def optimizer_field_hint(key: str, value: Any = "...") -> str | None:
    """For `method.args.learning_rate` and the like: what to write instead (the optimizer group)."""
    field_ = key.rsplit(".", 1)[-1]
    if not key.startswith("method.args.") or field_ not in OPTIMIZER_FIELDS:
        return None
    return (f"{key} is not used: the optimizer group builds the optimizer and its schedule "
            f"(Trainer's own {field_} is ignored); use {OPTIMIZER_FIELDS[field_].format(v=show(value))}")


def elsewhere(cfg: DictConfig, key: str, value: Any = "...") -> str | None:
    """For a key that is not where it was written (`max_steps=5`, `method.args.lr=1e-3`): the full
    paths where a key of that name is in the composed config, as "'max_steps' is method.args.max_steps:
    write method.args.max_steps=5"; None when there is none (a typo: the caller suggests a close name)."""
    leaf = key.rsplit(".", 1)[-1]
    found = [path for path in _paths(cfg) if path.rsplit(".", 1)[-1] == leaf and path != key]
    if not found:
        return None
    return f"'{leaf}' is {' or '.join(found[:3])}: write {found[0]}={show(value) if value != '...' else value}"


def _paths(node: Any, prefix: str = "") -> list[str]:
    """Every key's full path in `node` (Hydra's own node and `_target_`s left out), values not resolved."""
    out: list[str] = []
    if isinstance(node, DictConfig):
        for k in node.keys():
            if (k == "hydra" and not prefix) or str(k).startswith("_"):
                continue
            out.append(f"{prefix}{k}")
            out += _paths(node._get_node(k), f"{prefix}{k}.")
    return out


def hydra_node() -> Any:
    from hydra.core.hydra_config import HydraConfig

    return HydraConfig.get() if HydraConfig.initialized() else None
