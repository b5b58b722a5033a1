"""The schemas of the nodes that are not a method's arguments: the root, the optimizer and its schedule,
the model, adapters, precision, data, the logger, early stopping, DPO's loss. Their values go to code
ablate does not always own (any torch.optim class, a user's loader), so a field defaults to ABSENT:
a key the node does not hold is not checked."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

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
class Scheduler(Schema):
    node = "optimizer.scheduler"
    warmup_ratio: float = field(check=fraction("a fraction of the steps"))
    warmup_steps: int = field(check=integer(0))
    min_ratio: float = field(check=fraction("a fraction of the peak lr"))
    step_size: int = field(check=integer(1))
    gamma: float = field(check=number(above=0))


def _divides(v: Any, n: Any) -> bool:
    heads = n.num_heads
    return is_int(v) and v >= 1 and (not is_int(heads) or heads < 1 or v % heads == 0)


@dataclass
class Model(Schema):
    node = "model"
    hidden_size: int = field(
        check=Rule(_divides, lambda n, at: f"an integer >= 1 divisible by {at}.num_heads={n.num_heads}")
    )
    num_layers: int = field(check=integer(1))
    num_heads: int = field(check=integer(1))
    intermediate_size: int = field(check=integer(1))
    max_position_embeddings: int = field(check=integer(1))
    dtype: str = field(check=choice("float32", "bfloat16", "float16"))
    config_overrides: Any = field(
        check=nullable(
            Rule(
                lambda v, n: (
                    type(v).__name__ in ("dict", "DictConfig") and all(isinstance(k, str) for k in v)
                ),
                "a mapping of config.json keys: "
                "'+model.config_overrides={num_hidden_layers:2,hidden_size:64}'",
            )
        )
    )

    def relations(self, cfg: Mapping[str, Any]) -> Iterator[Problem]:
        """config_overrides scales a preset's architecture down; tiny() is sized by its own fields."""
        model = cfg.get("model") or {}
        if model.get("config_overrides") is not None and model.get("_target_") != "ablate.models.pretrained":
            yield (
                "model.config_overrides",
                "+shrink or a mapping",
                f"unset with {model.get('_target_')}, which is sized by "
                "model.hidden_size, model.num_layers, ... (it scales a preset: 'model=qwen2_5_7b "
                "+shrink=tiny')",
            )


def _modules(v: Any, n: Any) -> bool:
    return isinstance(v, list) and len(v) > 0 and all(isinstance(m, str) for m in v)


@dataclass
class Adapters(Schema):
    node = "peft"
    r: int = field(check=integer(1, " (the adapter rank)"))
    lora_alpha: float = field(check=number(above=0))
    lora_dropout: float = field(check=fraction(closed=False))
    target_modules: Any = field(
        check=choice("all-linear", words="all-linear")
        | Rule(_modules, "a list of module names: 'peft.target_modules=[q_proj,v_proj]'")
    )
    bias: str = field(check=choice("none", "all", "lora_only"))
    use_rslora: bool = field(check=BOOL)
    use_dora: bool = field(check=BOOL)
    save_merged: bool = field(check=BOOL)


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
    node = "logger"
    targets = ("ablate.logger.wandb.WandbTracker",)
    mode: str = field(check=choice("online", "offline", "disabled"))


@dataclass
class EarlyStop(Schema):
    node = "callbacks.early_stop"
    targets = ("ablate.callbacks.EarlyStop",)
    mode: str = field(check=choice("min", "max", words="min (lower is better) or max"))
    patience: int = field(check=integer(1))
    min_delta: float = field(check=number(at_least=0))


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


@dataclass
class DPOLoss(Schema):
    node = "method.dpo_loss"
    # a probability that a preference label is flipped (robust, cDPO): 0.5 makes the labels noise
    label_smoothing: float = field(check=fraction(high=0.5, closed=False))
    cpo_alpha: float = field(check=number(at_least=0, why=" (the NLL term's weight; 0 = off)"))  # cpo, simpo
    gamma: float = field(check=number(at_least=0, why=" (SimPO's target margin)"))  # simpo
    # AlphaPO's reward shape (cpo, cpo_hinge, cpo_ipo, simpo): any finite number, 0 = the log reward
    alpha: float = field(check=Rule(lambda v, n: is_num(v), "a finite number (0: the log-probs themselves)"))
