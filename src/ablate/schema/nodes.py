"""The schemas of the nodes that are not a method's arguments: the root, the optimizer and its schedule,
the model, adapters, precision, data, the logger, early stopping, DPO's loss. Their values go to code
ablate does not always own (any torch.optim class, a user's loader), so a field defaults to ABSENT:
a key the node does not hold is not checked."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

from ablate.schema import (
    BOOL,
    Problem,
    Rule,
    Schema,
    choice,
    field,
    fraction,
    integer,
    is_int,
    is_num,
    nullable,
    number,
)

# glibc refuses more (HEAP_MAX_SIZE / 2 on 64-bit): ablate.process.memory
MAX_MMAP_THRESHOLD = 32 * 1024 * 1024


def _labels(v: Any, n: Any) -> bool:
    return v is None or (isinstance(v, list) and all(isinstance(t, (str, int, float)) for t in v))


@dataclass
class Root(Schema):
    node = ""
    seed: int = field(check=integer(0, at_most=2**32 - 1, why=" (numpy's seed range)"))
    tags: list[str] | None = field(
        check=Rule(_labels, "a list: tags=[baseline] (several: 'tags=[baseline,v2]')")
    )
    peak_tflops: float | None = field(check=nullable(number(above=0, why=" (TFLOP/s)"), "measured"))
    threads: int | None = field(check=nullable(integer(1), "the cores available"))
    malloc_mmap_threshold: int | None = field(
        check=nullable(
            Rule(
                lambda v, n: is_int(v) and 0 <= v <= MAX_MMAP_THRESHOLD,
                f"bytes in 0..{MAX_MMAP_THRESHOLD} (e.g. 131072)",
            ),
            "malloc's default",
        )
    )


def _betas(v: Any, n: Any) -> bool:
    return isinstance(v, list) and len(v) == 2 and all(is_num(b) and 0 <= b < 1 for b in v)


FLOAT32_MAX = 3.4028234663852886e38  # the parameters' dtype bounds every update the optimizer computes


def _lr(v: Any, n: Any) -> bool:
    """An lr torch can use: > 0, and Adam's first update lr / (1 - beta1) a float32 (1e38 overflowed inside
    AdamW)."""
    beta1 = n.betas[0] if _betas(n.betas, n) else 0.0
    return is_num(v) and 0 < v and v / (1 - beta1) < FLOAT32_MAX


def _lr_words(n: Any, at: str) -> str:
    if isinstance(n.betas, list):
        return (
            f"a number > 0 with lr / (1 - beta1) under float32's largest, {FLOAT32_MAX:.3g} (Adam's first "
            "update: torch cannot represent it)"
        )
    return f"a number > 0 under float32's largest, {FLOAT32_MAX:.3g}"


@dataclass
class Optimizer(Schema):
    node = "optimizer.optimizer"
    lr: float = field(check=Rule(_lr, _lr_words))
    weight_decay: float = field(check=number(at_least=0))
    betas: list[float] = field(
        check=Rule(_betas, "two numbers in [0, 1): 'optimizer.optimizer.betas=[0.9,0.999]'")
    )
    momentum: float = field(check=number(at_least=0))
    eps: float = field(check=number(above=0))


@dataclass
class Cosine(Schema):
    """Linear warm-up, then cosine decay to min_ratio * lr at the last step (ablate.methods.schedules)."""

    node = "optimizer.scheduler"
    targets = ("ablate.methods.schedules.cosine",)
    partial: ClassVar[bool] = (
        True  # called by the trainer's create_scheduler with the optimizer and its steps
    )
    warmup_ratio: float = field(0.1, fraction("a fraction of the steps"), "Steps spent warming up linearly.")
    min_ratio: float = field(
        0.0, fraction("a fraction of the peak lr"), "Final lr as a fraction of the peak."
    )


@dataclass
class Constant(Schema):
    """A constant lr after an optional linear warm-up."""

    node = "optimizer.scheduler"
    targets = ("ablate.methods.schedules.constant",)
    partial: ClassVar[bool] = True
    warmup_steps: int = field(0, integer(0), "Optimizer steps of linear warm-up.")


@dataclass
class Step(Schema):
    """Step decay, the TRL docs' StepLR(step_size=30, gamma=0.1): lr *= gamma every step_size steps."""

    node = "optimizer.scheduler"
    targets = ("ablate.methods.schedules.step",)
    partial: ClassVar[bool] = True
    step_size: int = field(30, integer(1), "Optimizer steps between decays.")
    gamma: float = field(0.1, number(above=0), "Multiplicative decay factor.")


@dataclass
class Precision(Schema):
    node = "precision"
    bf16: bool = field(check=BOOL)
    fp16: bool = field(check=BOOL)
    tf32: bool | None = field(
        check=Rule(lambda v, n: v is None or isinstance(v, bool), "true, false or null")
    )


@dataclass
class Data(Schema):
    node = "data"
    max_train_samples: int | None = field(check=nullable(integer(1)))
    max_eval_samples: int | None = field(check=nullable(integer(1)))


@dataclass
class Columns:
    """`data.columns`: your column name for each of TRL's (`data.columns.prompt=question`); null: the same.
    Every data config selects it (`- /schema@columns: Columns`)."""

    prompt: str | None = None  # the prompt (string or messages); absent in implicit-prompt preference data
    chosen: str | None = None  # preferred completion (or whole conversation, implicit prompt)
    rejected: str | None = None  # dispreferred completion (or whole conversation, implicit prompt)
    completion: str | None = None  # SFT target completion
    messages: str | None = None  # SFT conversation ({role, content} list), loss on every token
    text: str | None = None  # SFT plain text, loss on every token


MIX_TARGET = "ablate.data.mixture.mix"
WEIGHT = number(at_least=0, why=" (the source's share of the mix is its weight over the sum of the weights)")


def _mapping(v: Any, n: Any) -> bool:
    return isinstance(v, dict) and len(v) > 0


@dataclass
class Mix(Schema):
    """`data=mix`: named sources, each a data config (its own `_target_`) with a `weight`."""

    node = "data"
    targets = (MIX_TARGET,)
    sources: dict[str, Any] = field(
        check=Rule(_mapping, "named data configs: +data@data.sources.NAME=OPTION (an option of conf/data)")
    )
    seed: int = field(check=integer(0, at_most=2**32 - 1, why=" (numpy's seed range)"))
    size: int | None = field(
        check=nullable(integer(1), "as many rows as the sources give without repeating one")
    )

    def problems(self, at: str | None = None) -> Iterator[Problem]:
        """The node's fields, then each source: a data config, its weight a number >= 0 (one of them > 0),
        its row limits."""
        at = self.node if at is None else at
        yield from super().problems(at)
        if not _mapping(self.sources, self):
            return
        for name, source in self.sources.items():
            if not isinstance(source, dict) or "_target_" not in source:
                yield (
                    f"{at}.sources.{name}",
                    source,
                    f"a data config (an option of conf/data: +data@{at}.sources.{name}"
                    f"=OPTION adds one); to drop the source: ~{at}.sources.{name}",
                )
                return
            if not WEIGHT.test(weight := source.get("weight", 1), self):
                yield f"{at}.sources.{name}.weight", weight, WEIGHT.words(self, at)
            yield from Data.of(source).problems(f"{at}.sources.{name}")
        if all(source.get("weight", 1) == 0 for source in self.sources.values()):
            yield (
                f"{at}.sources.{next(iter(self.sources))}.weight",
                0,
                "a number > 0 for at least one source (every weight is 0: the mix would have no rows)",
            )


@dataclass
class Wandb(Schema):
    """Weights & Biases, the run owned by ablate (logger=wandb; ablate.logger.wandb.WandbTracker)."""

    node = "logger"
    targets = ("ablate.logger.wandb.WandbTracker",)
    project: str = field("ablate", help="W&B project.")
    entity: str | None = field(None, help="W&B team or user (null: your default).")
    mode: str = field(
        "offline",
        choice("online", "offline", "disabled"),
        "offline (files in <run_dir>/wandb, `wandb sync` later) | online | disabled.",
    )
    group: str | None = field(
        None, help="Runs grouped in the UI (null: a multirun's <sweep_name>/<time>, else none)."
    )
    name: str | None = field(
        None, help="The run's display name (null: the job's overrides, or the run dir's name)."
    )
    job_type: str | None = field("${method.name}", help="W&B job_type: the method.")
    tags: list[str] = field(help="Free-form tags (a multirun's jobs also get its sweep_name).", factory=list)


@dataclass
class NaNGuard(Schema):
    """Stop with status failed when the loss turns NaN/inf, or the model collapses (ablate.callbacks)."""

    node = "callbacks.nan_guard"
    targets = ("ablate.callbacks.NaNGuard",)
    dead_after: int = field(
        2,
        integer(0, " (0 = never)"),
        "Log events in a row with grad_norm exactly 0 (lr > 0, loss not 0): collapsed.",
    )


@dataclass
class EarlyStop(Schema):
    """Stop when a logged metric stops improving (callbacks=early_stop)."""

    node = "callbacks.early_stop"
    targets = ("ablate.callbacks.EarlyStop",)
    metric: str = field(
        "eval_loss", help="Any logged number: eval_loss, loss, rewards/accuracies, eval_<metric>."
    )
    mode: str = field(
        "min", choice("min", "max", words="min (lower is better) or max"), "min | max: better is."
    )
    patience: int = field(
        3, integer(1), "Log events (evals, for an eval_ metric) without improvement before stopping."
    )
    min_delta: float = field(0.0, number(at_least=0), "Smaller changes do not count as an improvement.")


@dataclass
class Profile(Schema):
    """torch.profiler, driven by the Trainer's steps (debug=profile; ablate.callbacks.debug.Profile)."""

    node = "callbacks.profiler"
    targets = ("ablate.callbacks.debug.Profile",)
    wait: int = field(1, integer(0), "Steps skipped first.")
    warmup: int = field(1, integer(0), "Steps profiled, then discarded (allocations, caches).")
    active: int = field(3, integer(1), "Steps recorded.")
    rows: int = field(15, integer(1), "Ops in the table.")
    memory: bool = field(True, BOOL, "Record memory per op.")


@dataclass
class Cache(Schema):
    """The reuse cache of tokenized data and reference log-probs: exact, by content (ablate.data.cache)."""

    node = "cache"
    targets = ("ablate.data.cache.Cache",)
    enabled: bool = field(
        True, BOOL, "Look entries up and store new ones (false: compute everything, store nothing)."
    )
    dir: str | None = field(
        None, help="Where entries live (null: $ABLATE_CACHE/entries, ~/.cache/ablate/entries)."
    )


PLACES = ("local", "slurm", "ray")  # where a rollout server a run starts runs (method.rollouts.start_on)


@dataclass
class Engine(Schema):
    """A vLLM engine's settings, in the training process or a server's (not a node of its own)."""

    partial: ClassVar[bool] = True  # the trainer builds it with (args, tokenizer)
    kv_cache_gib: float | None = field(
        0.25,
        nullable(number(above=0)),
        "KV-cache GiB (vLLM's kv_cache_memory_bytes; a CPU's only bound); null: gpu_memory_utilization.",
    )
    max_model_len: int | None = field(
        None,
        nullable(integer(1)),
        "Longest prompt + completion held; null: the data's longest prompt + completion.",
    )
    dtype: str = field(
        "float32",
        choice("float32", "bfloat16", "auto"),
        "Engine weights: float32 (the trainer's CPU weights) | bfloat16 (GPU) | auto (the checkpoint's).",
    )
    enforce_eager: bool = field(True, BOOL, "No torch.compile / CUDA graphs: faster start, slower decoding.")
    verify_push: bool = field(
        False,
        BOOL,
        "After each push, the engine's SHA-256 of what it loaded == the trainer's (a hash a push).",
    )


@dataclass
class VLLM(Engine):
    """A vLLM engine in the training process (method/rollouts=vllm; ablate.rollouts.vllm.VLLMGenerator)."""

    node = "method.rollouts"
    targets = ("ablate.rollouts.vllm.VLLMGenerator",)
    gpu_memory_utilization: float = field(
        0.3,
        Rule(lambda v, n: is_num(v) and 0 < v <= 1, "a number in (0, 1]"),
        "Share of the device's memory vLLM may take (weights + KV cache) when kv_cache_gib is null (TRL's).",
    )
    seed: Any = field(
        "${seed}", help="The engine's own seed; each request is seeded from torch's RNG anyway."
    )


@dataclass
class VLLMServer(Engine):
    """A vLLM server in a process of its own (method/rollouts=vllm_server; ablate.rollouts.server); the
    engine's settings apply to a server the run starts (start=true) or `ablate serve-rollouts` starts."""

    node = "method.rollouts"
    targets = ("ablate.rollouts.server.VLLMServerGenerator",)
    url: str = field(
        "http://127.0.0.1:8000",
        Rule(lambda v, n: isinstance(v, str) and "://" in v, "a URL: http://HOST:PORT"),
        "The server's address.",
    )
    start: bool = field(False, BOOL, "True: the run starts the server and stops it at the end.")
    start_on: str = field("local", choice(*PLACES), "Where start=true starts it: local | slurm | ray.")
    sbatch_args: list[str] | None = field(
        None, help="With start_on=slurm: the server job's sbatch options ([--partition=gpu, --gres=gpu:1])."
    )
    ray_address: str = field(
        "auto", help="With start_on=ray: the cluster (auto: this run's; local: a new one)."
    )
    ray_resources: dict[str, Any] | None = field(
        None, help="With start_on=ray: the server actor's resources ({num_gpus: 1})."
    )
    backend: str | None = field(
        None, nullable(choice("gloo", "nccl"), "nccl with CUDA, else gloo"), "Weight transfer: gloo | nccl."
    )
    group_host: str | None = field(
        None, help="Where the server's workers reach the trainer; null: this machine's address on the route."
    )
    timeout_s: float = field(600.0, number(above=0, why=" (seconds)"), "Longest wait for a request or push.")
    start_timeout_s: float = field(
        600.0, number(above=0, why=" (seconds)"), "With start=true: longest wait for the server to answer."
    )
    gpu_memory_utilization: float = field(
        0.9,
        Rule(lambda v, n: is_num(v) and 0 < v <= 1, "a number in (0, 1]"),
        "With start=true: share of the server's GPU vLLM may take when kv_cache_gib is null.",
    )


@dataclass
class OverfitCheck(Schema):
    node = "callbacks.overfit_check"  # conf/debug/overfit.yaml
    targets = ("ablate.callbacks.debug.OverfitCheck",)
    mode: str = field(check=choice("min", "max", words="min (the metric must fall) or max (must rise)"))
    min_change: float = field(check=number(at_least=0, why=" (a fraction of the metric's start)"))


@dataclass
class RewardModel(Schema):
    node = "RewardModel"  # wherever it is: data.reward_funcs.NAME (the config names the key there)
    targets = ("ablate.rewards.RewardModel", "ablate.rewards.reward_model.RewardModel")
    batch_size: int = field(check=integer(1))
    dtype: str = field(check=choice("float32", "bfloat16", "float16"))
