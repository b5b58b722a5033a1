"""The model nodes (`conf/model/`, `conf/teacher/`, `conf/peft/`, `conf/ref_model/`, a method's `model_head`
and `default_teacher`), each a structured config in Hydra's ConfigStore (`schema/<Class>`, its YAML selects):
its `_target_` and each setting's default declared here, once. The builders' keyword defaults are these
(`hidden_size: int = TinyModel.hidden_size`), so a model built from Python is the one the config builds."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from ablate.schema import BOOL, MISSING, Problem, Rule, Schema, choice, field, fraction, integer, number

DTYPE = choice("float32", "bfloat16", "float16")
QUANTIZATION = (
    "bitsandbytes' quantization config: {_target_: transformers.BitsAndBytesConfig, ...} (+peft=qlora)"
)


def _divides(v: Any, n: Any) -> bool:
    heads = n.num_heads
    return isinstance(v, int) and v >= 1 and (not isinstance(heads, int) or heads < 1 or v % heads == 0)


def _overrides(v: Any, n: Any) -> bool:
    return v is None or (type(v).__name__ in ("dict", "DictConfig") and all(isinstance(k, str) for k in v))


@dataclass
class TinyModel(Schema):
    """A tiny Llama-style causal LM from config, a byte tokenizer, no download (ablate.models.tiny)."""

    node = "model"
    targets = ("ablate.models.tiny",)
    hidden_size: int = field(
        64,
        Rule(_divides, lambda n, at: f"an integer >= 1 divisible by {at}.num_heads={n.num_heads}"),
        "Width.",
    )
    num_layers: int = field(2, integer(1), "Transformer blocks.")
    num_heads: int = field(4, integer(1), "Attention heads.")
    intermediate_size: int = field(256, integer(1), "MLP width.")
    max_position_embeddings: int = field(256, integer(1), "Longest sequence.")
    init_seed: int = field(
        0, integer(0), "Weight init: fixed, so every run of a sweep starts from the same model."
    )
    quantization_config: Any = field(None, help=QUANTIZATION)
    config_overrides: Any = field(
        None, help="Unset: the preset builders' (+shrink); this model is sized above."
    )

    def relations(self, cfg: Mapping[str, Any]) -> Iterator[Problem]:
        """config_overrides scales a preset's architecture down; tiny() is sized by its own fields."""
        if self.config_overrides is not None:
            yield (
                "model.config_overrides",
                "+shrink or a mapping",
                f"unset with {self.targets[0]}, which is sized by model.hidden_size, model.num_layers, ... "
                "(it scales a preset: 'model=qwen2_5_7b +shrink=tiny')",
            )


@dataclass
class TinyTeacher(TinyModel):
    """An untrained tiny teacher twice the student's width (+teacher=tiny): a stand-in for distillation."""

    node = "teacher"
    targets = ("ablate.models.tiny",)
    partial: ClassVar[bool] = True  # built by the distillation trainer, after the data
    hidden_size: int = field(128, TinyModel.__dataclass_fields__["hidden_size"].metadata["check"], "Width.")
    intermediate_size: int = field(512, integer(1), "MLP width.")
    init_seed: int = field(1, integer(0), "Weight init (not the student's).")


@dataclass
class Pretrained(Schema):
    """A save_pretrained dir or a hub id (ablate.models.pretrained)."""

    node = "model"
    targets = ("ablate.models.pretrained",)
    path: str = field(MISSING, help="A directory with config.json, weights and tokenizer files, or a hub id.")
    dtype: str = field("float32", DTYPE, "float32 | bfloat16 | float16 weights.")
    revision: str | None = field(None, help="A branch, tag or commit to pin the weights.")
    trust_remote_code: bool = field(False, BOOL, "Run the repo's own modelling code (transformers').")
    quantization_config: Any = field(None, help=QUANTIZATION)
    config_overrides: Any = field(
        None,
        Rule(_overrides, "a mapping of config.json keys: '+model.config_overrides={num_hidden_layers:2}'"),
        "config.json values to change: random init, byte tokenizer, no download (+shrink=tiny).",
    )


@dataclass
class PretrainedTeacher(Pretrained):
    node = "teacher"
    targets = ("ablate.models.pretrained",)
    partial: ClassVar[bool] = True  # built by the distillation trainer, after the data


@dataclass
class SmolLM2(Schema):
    """SmolLM2-135M-Instruct, fetched once (`ablate fetch smollm2_135m`; ablate.models.smollm2_135m)."""

    node = "model"
    targets = ("ablate.models.smollm2_135m",)
    dtype: str = field("float32", DTYPE, "float32 | bfloat16 | float16 weights.")
    quantization_config: Any = field(None, help=QUANTIZATION)


@dataclass
class SmolLM2Teacher(SmolLM2):
    node = "teacher"
    targets = ("ablate.models.smollm2_135m",)
    partial: ClassVar[bool] = True  # built by the distillation trainer, after the data


def _modules(v: Any, n: Any) -> bool:
    return isinstance(v, list) and len(v) > 0 and all(isinstance(m, str) for m in v)


@dataclass
class Adapters(Schema):
    """LoRA adapters (peft; `+peft=lora`, ablate.models.adapters.lora)."""

    node = "peft"
    targets = ("ablate.models.adapters.lora",)
    r: int = field(16, integer(1, " (the adapter rank)"), "Adapter rank.")
    lora_alpha: float = field(
        32, number(above=0), "Scaling numerator: the update is (lora_alpha / r) * B @ A."
    )
    lora_dropout: float = field(0.05, fraction(closed=False), "Dropout on the adapter's input.")
    target_modules: Any = field(
        "all-linear",
        choice("all-linear", words="all-linear")
        | Rule(_modules, "a list of module names: 'peft.target_modules=[q_proj,v_proj]'"),
        "Which layers get adapters: all-linear (every Linear but lm_head) or a list of names.",
    )
    bias: str = field("none", choice("none", "all", "lora_only"), "Which biases train too.")
    use_rslora: bool = field(False, BOOL, "Rank-stabilised scaling lora_alpha / sqrt(r).")
    use_dora: bool = field(False, BOOL, "DoRA: weight-decomposed LoRA (a magnitude vector per layer).")
    save_merged: bool = field(
        False, BOOL, "Also save the adapter merged into the base, to <run_dir>/model/merged/."
    )


@dataclass
class Reference(Schema):
    """A live reference (+ref_model=live), scored every step: the policy's model config, maybe quantized."""

    node = "method.trainer.ref_model"
    targets = ("ablate.models.reference.reference",)
    recursive: ClassVar[bool] = (
        False  # the builder gets the model config unbuilt (loads it once, maybe quantized)
    )
    model: Any = field(
        "${model}", help="The policy's model config: the reference starts from the same weights."
    )
    quantization_config: Any = field(None, help=f"null: full precision; {QUANTIZATION}")


@dataclass
class ScoreHead(Schema):
    """A reward model's score head on the policy's backbone (method=reward; ablate.models.heads)."""

    node = "method.model_head"
    targets = ("ablate.models.heads.score_head",)
    partial: ClassVar[bool] = True  # ablate.train calls it with the model
    num_labels: int = field(1, integer(1), "Outputs: one scalar reward per sequence.")


@dataclass
class LetterTeacher(Schema):
    """The "repeat a letter" task's scripted teacher (method=distill without +teacher)."""

    node = "method.default_teacher"
    targets = ("ablate.models.teachers.letter_teacher",)
    partial: ClassVar[bool] = True  # built by the trainer
    confidence: float = field(
        8.0, number(above=0), "Its logit for the prompt's letter (0 elsewhere): ~92% of its mass."
    )
