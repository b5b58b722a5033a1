"""GRPO's arguments (`method.args`, conf/method/grpo.yaml): TrainingArguments plus TRL 1.16's GRPOConfig
names and defaults for what ablate's GRPOTrainer (ablate.methods.grpo) implements, checked on creation
(one line per refusal)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from transformers import TrainingArguments

from ablate.errors import ConfigError
from ablate.losses import grpo as grpo_losses
from ablate.losses import is_correction
from ablate.rewards import resolve
from ablate.rollouts.tools import FORMATS, schema


@dataclass
class GRPOConfig(TrainingArguments):
    kl_in_reward: ClassVar[bool] = False  # GRPO's KL (beta) is a loss term; RLOO's (RLOOConfig) a reward penalty
    num_generations: int = field(default=8, metadata={"help": "Completions per prompt (the group), >= 2."})
    steps_per_generation: int = field(default=1, metadata={"help": "Micro-steps served by one generation round."})
    num_iterations: int = field(default=1, metadata={"help": "Passes (mu) over each generation round's slices."})
    max_prompt_length: int | None = field(default=512, metadata={"help": "Keep the last N prompt tokens."})
    max_completion_length: int = field(default=256, metadata={"help": "New tokens generated per completion."})
    temperature: float = field(default=1.0, metadata={"help": "Sampling temperature (also applied when scoring)."})
    top_p: float = field(default=1.0, metadata={"help": "Nucleus sampling mass."})
    top_k: int = field(default=0, metadata={
        "help": "Sample among the k most likely tokens; 0 = off (TRL 1.16's default; generate's own default is 50)."})
    epsilon: float = field(default=0.2, metadata={"help": "Lower clip range: ratio >= 1 - epsilon."})
    epsilon_high: float | None = field(default=None, metadata={"help": "Upper clip range; None = epsilon."})
    beta: float = field(default=0.0, metadata={"help": "KL weight; 0 = no reference model."})
    reward_weights: list[float] | None = field(default=None, metadata={"help": "One weight per reward function."})
    importance_sampling_level: str = field(
        default="token", metadata={"help": "token (GRPO) | sequence (GSPO: one ratio per completion)."})
    delta: float | None = field(default=None, metadata={"help": "Two-sided clipping: cap the ratio at delta."})
    use_bias_correction_kl: bool = field(
        default=True, metadata={"help": "Multiply the KL term by the importance ratio (TRL 1.16's default)."})
    mask_truncated_completions: bool = field(
        default=False, metadata={"help": "Completions without EOS get no loss (their tokens are masked out)."})
    vllm_importance_sampling_correction: bool = field(default=True, metadata={
        "help": "Weight each token's policy loss by pi_trainer / pi_engine when the generator returns the engine's "
                "log-probs (vLLM); TRL 1.16's default."})
    vllm_importance_sampling_mode: str = field(default="sequence_mask", metadata={
        "help": "token_truncate | token_mask | sequence_truncate | sequence_mask (TRL's modes and default)."})
    vllm_importance_sampling_clip_min: float | None = field(default=None, metadata={
        "help": "Lower bound of the engine IS ratio (clamped or masked below); None = none."})
    vllm_importance_sampling_clip_max: float | None = field(default=3.0, metadata={
        "help": "Upper bound of the engine IS ratio (clamped or masked above); None = none."})
    off_policy_mask_threshold: float | None = field(default=None, metadata={
        "help": "Drop negative-advantage completions whose mean KL from the sampling policy exceeds this "
                "(DeepSeek-V3.2 eq. 9); None = off."})
    max_staleness: int = field(default=0, metadata={
        "help": "Asynchronous GRPO: rounds sampled this many rounds ahead by a worker process with its own copy "
                "of the weights (round k by the weights at round k - max_staleness's start); 0 = synchronous."})
    generation_dtype: str | None = field(default=None, metadata={
        "help": "Async GRPO's worker: its weights' and compute's dtype; None = the trainer's | bfloat16 (half the "
                "memory read per token; pi_old is the bf16 sampler's own log-probs, so the ratio sees the mismatch)."})
    async_threads: str = field(default="split", metadata={
        "help": "Async GRPO's torch threads: split = fixed halves for the trainer and the worker (reproducible) | "
                "balanced = the trainer also takes the worker's while it is idle (faster when the worker is; the "
                "trainer's last bits then depend on timing: ablate.rollouts.cores)."})
    worker_timeout_s: float = field(default=900.0, metadata={
        "help": "Async GRPO: seconds the trainer waits for a round from its generation worker before it counts the "
                "worker as stalled (stopped, hung) and stops the run in one line (resumable)."})
    tools: list[Any] | None = field(default=None, metadata={
        "help": "Functions the model may call while it generates (each a dotted path, e.g. ablate.tools.calculator, "
                "or {_target_: path}); their signature and docstring are the schema it is shown (TRL's tools)."})
    environment: Any = field(default=None, metadata={
        "help": "{_target_: pkg.Class, ...kwargs}: one instance per rollout, reset(**row) each round; its public "
                "methods are tools, its get_reward() scores the episode (TRL's environment_factory contract)."})
    max_tool_calling_iterations: int | None = field(default=None, metadata={
        "help": "Turns of tool calls per rollout; None = until a turn calls no tool (TRL's default)."})
    tool_timeout: float | None = field(default=10.0, metadata={
        "help": "Seconds a tool call may run; past it, the model reads a timeout error (a failed call). None = no limit."})
    tool_call_format: str = field(default="auto", metadata={
        "help": "auto | chat_template (the model's own tool format) | hermes (<tool_call>{json}</tool_call> in the "
                "text, tools listed in a system turn: for chat templates without tools); ablate.rollouts.tools."})
    remove_unused_columns: bool = False  # reward functions receive every dataset column

    def __post_init__(self) -> None:
        super().__post_init__()
        self.epsilon_high = self.epsilon if self.epsilon_high is None else self.epsilon_high
        checks = [
            (self.num_generations >= 2, f"num_generations must be >= 2 (a group), got {self.num_generations}"),
            (self.steps_per_generation >= 1, f"steps_per_generation must be >= 1, got {self.steps_per_generation}"),
            (self.num_iterations >= 1, f"num_iterations must be >= 1, got {self.num_iterations}"),
            (self.max_staleness >= 0, f"max_staleness must be >= 0 (0 = synchronous), got {self.max_staleness}"),
            (self.generation_dtype in (None, "float32", "bfloat16"), f"generation_dtype must be float32 or bfloat16 "
             f"(null = the trainer's), got '{self.generation_dtype}'"),
            (self.generation_dtype is None or self.max_staleness > 0, "generation_dtype is the async worker's "
             "(max_staleness > 0); a synchronous run samples with the policy itself (an engine: method/generator=vllm)"),
            (isinstance(self.worker_timeout_s, (int, float)) and self.worker_timeout_s > 0,
             f"worker_timeout_s must be a number of seconds > 0, got {self.worker_timeout_s}"),
            (self.async_threads in ("split", "balanced"), f"async_threads must be split or balanced, got '{self.async_threads}'"),
            (self.async_threads == "split" or self.max_staleness > 0, "async_threads=balanced shares the cores with the "
             "async worker (max_staleness > 0); a synchronous run uses every thread throughout"),
            (self.vllm_importance_sampling_mode in is_correction.MODES,
             f"vllm_importance_sampling_mode must be one of {', '.join(is_correction.MODES)}, "
             f"got '{self.vllm_importance_sampling_mode}'"),
            (self.importance_sampling_level in ("token", "sequence"),
             f"importance_sampling_level must be token or sequence, got '{self.importance_sampling_level}'"),
            (self.delta is None or self.delta > 1 + self.epsilon_high,
             f"delta ({self.delta}) must exceed 1 + epsilon_high ({1 + self.epsilon_high})"),
            (self.per_device_train_batch_size % self.num_generations == 0,
             f"per_device_train_batch_size ({self.per_device_train_batch_size}) counts completions and must be "
             f"a multiple of num_generations ({self.num_generations})"),
            (self.eval_strategy == "no" or self.per_device_eval_batch_size % self.num_generations == 0,
             f"per_device_eval_batch_size ({self.per_device_eval_batch_size}) must be a multiple of "
             f"num_generations ({self.num_generations})"),
        ]
        checks += self._tool_checks()
        for ok, msg in checks:
            if not ok:
                raise ConfigError(f"method.args: {msg}")
        self.tools, self.environment = plain(self.tools), plain(self.environment)
        for i, tool in enumerate(self.tool_functions()):  # importable, callable, a schema: one line each, before the model
            schema(tool, f"method.args.tools[{i}]")
        self.environment_factory()  # importable and callable (its methods' schemas: when the trainer makes one)

    def _tool_checks(self) -> list[tuple[bool, str]]:
        return [
            (self.tools is None or isinstance(plain(self.tools), list),
             "tools must be a list of functions ([ablate.tools.calculator] or [{_target_: mymodule.fn}])"),
            (self.max_tool_calling_iterations is None or (isinstance(self.max_tool_calling_iterations, int)
                                                          and self.max_tool_calling_iterations >= 0),
             f"max_tool_calling_iterations must be null (no limit) or an integer >= 0, got "
             f"{self.max_tool_calling_iterations}"),
            (self.tool_timeout is None or self.tool_timeout > 0, f"tool_timeout must be null (no limit) or a number of "
             f"seconds > 0, got {self.tool_timeout}"),
            (self.tool_call_format in FORMATS, f"tool_call_format must be one of {', '.join(FORMATS)}, got "
             f"'{self.tool_call_format}'"),
            (self.environment is None or self.max_staleness == 0, "environment with max_staleness > 0: the async "
             "worker would hold the environments in its own process, where their state and get_reward() are out of the "
             "trainer's reach; use max_staleness=0"),
        ]

    def tool_functions(self) -> list[Callable[..., Any]]:
        """method.args.tools as functions."""
        return [resolve.function(t, f"method.args.tools[{i}]") for i, t in enumerate(self.tools or [])]

    def environment_factory(self) -> Callable[[], Any] | None:
        """method.args.environment as a factory of instances (its other keys bound as keyword arguments)."""
        return None if self.environment is None else resolve.function(self.environment, "method.args.environment")


def plain(value: Any) -> Any:
    """A config node as plain Python (a DictConfig/ListConfig from Hydra: method.args is built non-recursively, so
    `_target_` nodes of tools and environments arrive as config, and are built by the trainer)."""
    if type(value).__name__ in ("DictConfig", "ListConfig"):
        from omegaconf import OmegaConf

        return OmegaConf.to_container(value, resolve=True)
    return value


def longest_row(args: GRPOConfig) -> int | None:
    """The longest row of TRL's layout (prompt + completion): a sliding window at least this long never
    cuts one (ablate.speed.plan); None when prompts are not capped."""
    if args.max_prompt_length is None:
        return None
    return args.max_prompt_length + args.max_completion_length


def check_aggregation(aggregation: grpo_losses.Aggregation) -> grpo_losses.Aggregation:
    """A one-line error when `loss` is not a GRPO aggregation (e.g. a DPO loss picked with
    `method.trainer.aggregation._target_=ablate.losses.dpo.hinge`)."""
    try:
        inspect.signature(aggregation).bind(torch.zeros(1, 1), torch.ones(1, 1), num_items=1.0, max_completion_length=1)
    except TypeError as e:
        name = getattr(getattr(aggregation, "func", aggregation), "__name__", repr(aggregation))
        raise ConfigError(f"method.aggregation: {name} is not a GRPO aggregation (one takes per_token_loss, mask, "
                          f"num_items=..., max_completion_length=...): {e}") from None
    return aggregation
