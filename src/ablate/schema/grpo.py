"""`method.args` of the methods that sample their completions: GRPO (conf/method/grpo.yaml: TRL 1.16's
GRPOConfig names and defaults for what ablate's GRPOTrainer implements; batches count completions, whole
groups), RLOO (GRPO's with its own) and on-policy distillation, each field with its check."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ablate.schema import (
    ABSENT,
    BOOL,
    Problem,
    Rule,
    choice,
    field,
    integer,
    is_int,
    is_num,
    nullable,
    number,
)
from ablate.schema.args import MAX_STEPS, STEPS, TOKENS_SEEN, TrainArgs


def _groups(eval_only: bool = False) -> Rule:
    """A batch of whole groups: a multiple of num_generations (an eval batch only when evaluating)."""

    def test(v: Any, n: Any) -> bool:
        g = n.num_generations
        skip = (eval_only and n.eval_strategy == "no") or not is_int(g) or g < 1
        return is_int(v) and v >= 1 and (skip or v % g == 0)

    why = "" if eval_only else " (GRPO's batch counts completions, whole groups)"
    return Rule(
        test, lambda n, at: f"an integer >= 1 and a multiple of {at}.num_generations={n.num_generations}{why}"
    )


def _is_async(n: Any) -> bool:
    """Rounds are sampled ahead by a worker (ablate.rollouts.ahead): its options apply."""
    return is_int(n.max_staleness) and n.max_staleness > 0


def _delta(v: Any, n: Any) -> bool:
    high = n.epsilon if n.epsilon_high is None else n.epsilon_high
    return v is None or (is_num(v) and (not is_num(high) or v > 1 + high))


# vllm_importance_sampling_mode's options, `<token|sequence>_<truncate|mask>`
# (ablate.losses.is_correction.MODES)
IS_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
TOOL_CALL_FORMATS = ("auto", "chat_template", "hermes")  # ablate.rollouts.tool_calls.ToolFormat reads each


def _code(v: Any) -> bool:
    """A function or class named as config: a dotted path, a {_target_: ...} node, or (from Python) the
    object."""
    return isinstance(v, str) or (isinstance(v, Mapping) and "_target_" in v) or callable(v)


def _environment(v: Any, n: Any) -> bool:
    return v is None or (_code(v) and not _is_async(n))


def _environment_words(n: Any, at: str) -> str:
    # the worker's process would hold the instances: their state, get_reward() out of reach
    if _code(n.environment):
        return (
            f"null with {at}.max_staleness > 0 (environment with max_staleness > 0: the async worker would "
            "hold "
            "the environments, out of the trainer's reach; use max_staleness=0)"
        )
    return "null or {_target_: pkg.Class, ...} (one instance per rollout: TRL's environment_factory)"


@dataclass
class SamplingArgs(TrainArgs):
    """What a method that samples its completions (GRPO, RLOO, distillation) samples them with."""

    from_data = ("max_completion_length",)  # data=tiny_repeat scores 8 characters: its completions are 8 long

    max_prompt_length: int | None = field(
        None,
        nullable(integer(1), "whole prompts"),
        "Keep each prompt's last N tokens (a warning counts them); null = whole prompts, as TRL 1.16.",
    )
    max_completion_length: int = field(256, integer(1), "New tokens generated per completion.")
    temperature: float = field(
        1.0, number(above=0), "Sampling temperature (also applied when scoring: distillation's softmax's)."
    )
    top_p: float = field(
        1.0, Rule(lambda v, n: is_num(v) and 0 < v <= 1, "a number in (0, 1]"), "Nucleus sampling mass."
    )
    top_k: int = field(
        0, integer(0, " (0 = off)"), "Sample among the k most likely tokens; 0 = off (TRL's default)."
    )


@dataclass
class GRPOArgs(SamplingArgs):
    targets = ("ablate.methods.grpo_config.GRPOConfig",)
    recursive = (
        False  # tools/environment `_target_` nodes reach the config as config: the trainer builds them
    )
    from_data = ("max_completion_length", "tools")  # data=calc_tools: 128 tokens, its prompts' calculator
    per_device_train_batch_size: int = field(
        64, _groups(), "Completions (not prompts) per micro-batch; 8 whole groups (TRL: 8)."
    )
    per_device_eval_batch_size: int = field(8, _groups(eval_only=True), "Completions per eval micro-batch.")
    num_generations: int = field(
        8, integer(2, " (the group whose mean is the baseline)"), "Completions per prompt."
    )
    steps_per_generation: int = field(1, integer(1), "Micro-steps served by one generation round.")
    max_steps: int = field(
        200, MAX_STEPS, "Optimizer steps: the tiny task's reward reaches 0.9 by ~80 (spg=1), ~140 (spg=8)."
    )
    logging_steps: float = field(10, STEPS, "Steps between log events: metrics.jsonl, W&B, progress.")
    include_num_input_tokens_seen: str = field(
        "no", TOKENS_SEEN, "Trainer cannot count GRPO's batches; the trainer counts its own."
    )
    num_iterations: int = field(
        1, integer(1, " (passes over each generation round)"), "Passes (mu) over each round's slices."
    )
    max_staleness: int = field(
        0,
        integer(0, " (0 = synchronous GRPO)"),
        "Async GRPO: rounds sampled this many rounds ahead (round k by the weights at round k - s's "
        "start) by the vLLM engine (method/rollouts=vllm|vllm_server), else a forked CPU worker; "
        "0 = synchronous.",
    )
    generation_dtype: str | None = field(
        None,
        Rule(
            lambda v, n: v is None or (v in ("float32", "bfloat16") and _is_async(n)),
            "null, float32 or bfloat16, with method.args.max_staleness > 0 "
            "(the async generation worker's dtype)",
        ),
        "Async worker's dtype: null = the trainer's | bfloat16 (pi_old is the bf16 sampler's own log-probs).",
    )
    async_threads: str = field(
        "split",
        Rule(
            lambda v, n: v == "split" or (v == "balanced" and _is_async(n)),
            "split, or balanced with method.args.max_staleness > 0 (the trainer "
            "taking the idle async worker's threads)",
        ),
        "split = fixed halves (reproducible) | balanced = the trainer also takes the idle "
        "worker's (last bits timing-dependent: ablate.rollouts.cores).",
    )
    worker_timeout_s: float = field(
        900.0,
        number(above=0, why=" (seconds)"),
        "Async GRPO: seconds the trainer waits for a round from its worker before it "
        "counts it as stalled (stopped, hung) and stops the run in one line (resumable).",
    )
    epsilon: float = field(0.2, number(at_least=0), "Lower clip range: ratio >= 1 - epsilon.")
    epsilon_high: float | None = field(
        None, nullable(number(at_least=0)), "Upper clip range; null = epsilon."
    )
    beta: float = field(
        0.0, number(at_least=0, why=" (0 = no KL term)"), "KL weight; 0 = no reference model."
    )
    reward_weights: list[float] | None = field(
        None,
        Rule(
            lambda v, n: v is None or (isinstance(v, list) and all(is_num(w) for w in v)),
            "null or a list of numbers",
        ),
        "One weight per reward function (null: all 1).",
    )
    importance_sampling_level: str = field(
        "token",
        choice("token", "sequence", words="token (GRPO) or sequence (GSPO)"),
        "token (GRPO) | sequence (GSPO: one ratio per completion).",
    )
    delta: float | None = field(
        None,
        Rule(
            _delta,
            "null or a number > 1 + epsilon_high (two-sided clipping caps the ratio above the clip range)",
        ),
        "Two-sided clipping: cap the ratio at delta; null = off.",
    )
    use_bias_correction_kl: bool = field(
        True, BOOL, "KL term times the importance ratio (TRL 1.16's default)."
    )
    mask_truncated_completions: bool = field(False, BOOL, "Completions without EOS get no loss (DAPO).")
    vllm_importance_sampling_correction: bool = field(
        True,
        BOOL,
        "Weight the policy loss by pi_trainer / pi_engine when the generator returns engine log-probs.",
    )
    vllm_importance_sampling_mode: str = field(
        "sequence_mask", choice(*IS_MODES), "How the engine ratio is bounded."
    )
    vllm_importance_sampling_clip_min: float | None = field(
        None, nullable(number(at_least=0)), "Lower bound of the engine ratio; null = none."
    )
    vllm_importance_sampling_clip_max: float | None = field(
        3.0, nullable(number(at_least=0)), "Upper bound of the engine ratio; null = none."
    )
    off_policy_mask_threshold: float | None = field(
        None,
        nullable(number(at_least=0)),
        "Drop A<0 completions whose mean KL(sampler -> policy) exceeds "
        "this (DeepSeek-V3.2 eq. 9); null = off.",
    )
    # tools over several turns (TRL 1.16's names; ablate.rollouts.turns)
    tools: list[Any] | None = field(
        None,
        Rule(
            lambda v, n: v is None or (isinstance(v, list) and all(map(_code, v))),
            "null or a list of functions ([ablate.tools.calculator] or [{_target_: mymodule.fn}])",
        ),
        "Functions the model may call while it generates; signature + docstring = "
        "the schema it is shown (TRL's tools).",
    )
    environment: Any = field(
        None,
        Rule(_environment, _environment_words),
        "{_target_: pkg.Class}: one instance per rollout, reset(**row); its public methods are "
        "tools, get_reward() a reward (TRL's environment_factory).",
    )
    max_tool_calling_iterations: int | None = field(
        None,
        nullable(integer(0), "no limit"),
        "Turns of tool calls per rollout; null = until a turn calls none.",
    )
    tool_timeout: float | None = field(
        10.0,
        nullable(number(above=0, why=" (seconds)"), "no limit"),
        "Seconds a call may run; past it the model reads a timeout error.",
    )
    max_tool_result_length: int | None = field(
        None,
        nullable(integer(1), "max_completion_length"),
        "Tokens of a tool result kept (cut in characters first); null = max_completion_length.",
    )
    tool_call_format: str = field(
        "auto",
        choice(*TOOL_CALL_FORMATS, words="auto, chat_template or hermes (ablate.rollouts.tool_calls)"),
        "auto | chat_template (the template's own) | hermes (<tool_call>{json}</tool_call>).",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        self.epsilon_high = self.epsilon if self.epsilon_high is None else self.epsilon_high

    def relations(self, cfg: Mapping[str, Any]) -> Iterator[Problem]:
        funcs = (cfg.get("data") or {}).get("reward_funcs")
        # named, or the short form's list
        if isinstance(funcs, (Mapping, Sequence)) and not isinstance(funcs, str):
            problem = reward_weights_problem(self.reward_weights, reward_names(funcs))
            if problem is not None:
                yield problem
        problem = no_reward(cfg, type(self).__name__.removesuffix("Args"))
        if problem is not None:
            yield problem


SHORT_FORM = "data.reward_funcs=[MODULE.FUNCTION] (MODULE.py in the directory you run ablate from)"


def no_reward(cfg: Any, method: str) -> Problem | None:
    """The method trains on rewards: a reward function of the data's, or an environment that scores its
    episodes; every function set to null (`data.reward_funcs.NAME=null` drops one) leaves none. Judged
    when the trainer takes the data's (`method.trainer.reward_funcs: ${oc.select:data.reward_funcs,...}`).
    Each function's own contract: ablate.config.code_checks, ablate.rewards.calls."""
    from omegaconf import DictConfig, OmegaConf

    trainer = OmegaConf.select(cfg, "method.trainer", default=None) if isinstance(cfg, DictConfig) else None
    given = None
    if isinstance(trainer, DictConfig) and "reward_funcs" in trainer:
        given = OmegaConf.to_container(trainer, resolve=False)["reward_funcs"]  # as written: an interpolation
    if (
        not str(given).startswith("${oc.select:data.reward_funcs")
        or OmegaConf.select(cfg, "method.args.environment", default=None) is not None
    ):
        return None  # rewards given some other way, or an environment's get_reward() may score the episodes
    funcs = OmegaConf.select(cfg, "data.reward_funcs", default=None)
    if not isinstance(funcs, (Mapping, Sequence)) or isinstance(funcs, str) or not len(funcs):
        data = _data_choice(cfg)
        return (
            "data.reward_funcs",
            ABSENT,
            f"{method} needs a reward function, and data={data or '...'} has "
            f"none: add yours, {SHORT_FORM}, or use data that scores itself (data=tiny_repeat); "
            "docs/methods.md",
        )
    if not reward_names(funcs):
        return (
            "data.reward_funcs",
            ABSENT,
            f"{method} needs a reward function, and every entry is null "
            f"({', '.join(map(str, funcs))}); keep one, or add yours: {SHORT_FORM}",
        )
    return None


def _data_choice(cfg: Any) -> str:
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    hc = cfg.get("hydra") or (HydraConfig.get() if HydraConfig.initialized() else None)
    return str(OmegaConf.select(hc, "runtime.choices.data", default="") or "") if hc is not None else ""


def reward_names(funcs: Any) -> list[str]:
    """data.reward_funcs' functions, without those set to null (dropped, as a null callback is): a mapping's
    names, or the short form's dotted paths (`data.reward_funcs=[myrew.short]`)."""
    if isinstance(funcs, Mapping):
        return [str(k) for k, v in funcs.items() if v is not None]
    if isinstance(funcs, Sequence) and not isinstance(funcs, str):
        return [
            str(v.get("_target_", v)) if isinstance(v, Mapping) else str(v) for v in funcs if v is not None
        ]
    return []


def reward_weights_problem(weights: Any, names: list[str]) -> Problem | None:
    """One weight per reward function, or none given: checked against the data's reward functions when
    the config is (their names), and by the trainer against the ones it was handed."""
    if weights is None or not isinstance(weights, list) or len(weights) == len(names):
        return None
    return (
        "method.args.reward_weights",
        weights,
        f"null or a list of {len(names)} numbers, one per data.reward_funcs entry ({', '.join(names)})",
    )


@dataclass
class DistillArgs(SamplingArgs):
    targets = ("ablate.methods.distill.DistillConfig",)
    per_device_train_batch_size: int = field(16, integer(1), "Prompts (one completion each) per micro-batch.")
    include_num_input_tokens_seen: str = field(
        "no", TOKENS_SEEN, "Trainer cannot count prompt rows' tokens; the trainer counts its own."
    )
    beta: float = field(
        1.0,
        Rule(lambda v, n: is_num(v) and 0 <= v <= 1, "a number in [0, 1] (0 = forward KL, 1 = reverse KL)"),
        "Generalised JSD: 0 = forward KL, 1 = reverse KL (TRL's default).",
    )


def _clip_range(v: Any, n: Any) -> bool:
    return v is None or (isinstance(v, list) and len(v) == 2 and all(map(is_num, v)) and v[0] <= v[1])


@dataclass
class RLOOArgs(GRPOArgs):
    """GRPO's arguments (the same rollouts) with RLOO's: its KL is a reward penalty, its ratio one per
    completion."""

    targets = ("ablate.methods.rloo_config.RLOOConfig",)
    beta: float = field(
        0.05,
        number(at_least=0, why=" (0 = no KL penalty)"),
        "Weight of the KL penalty in the reward; 0 = no reference model.",
    )
    normalize_advantages: bool = field(
        False, BOOL, "Normalise the advantages over the generation batch (mean 0, std 1)."
    )
    reward_clip_range: list[float] | None = field(
        None,
        Rule(_clip_range, "null or [min, max] with min <= max"),
        "Clip the rewards into [min, max] before the KL penalty; null = off.",
    )
    importance_sampling_level: str = field(
        "token",
        choice("token", words="token (GRPO's option: RLOO's ratio is always one per completion)"),
        "GRPO's; RLOO's ratio is exp of the completion's summed token log-ratios.",
    )
    vllm_importance_sampling_correction: bool = field(
        False,
        Rule(lambda v, n: v is False, "false (TRL's RLOO has no engine correction)"),
        "GRPO's; TRL's RLOO has none.",
    )
