"""A model's architecture without its weights: the config.json values of a local dir, of a cached hub
model, or of a hub model ablate ships a preset for (architectures.json, so it works offline). Used by
`ablate plan` (the model built on the meta device) and by `model.config_overrides` (a scaled-down,
randomly initialised copy of a preset's architecture, with ablate's byte tokenizer: a CPU smoke test of
a 7-8B experiment's wiring).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from ablate.errors import ConfigError

SHIPPED = Path(__file__).with_name("architectures.json")
# what a scaled-down copy never takes from the full model: ids of the real tokenizer, not the byte one's
TOKEN_KEYS = ("vocab_size", "bos_token_id", "eos_token_id", "pad_token_id", "torch_dtype", "architectures")


@functools.lru_cache(maxsize=1)
def shipped() -> dict[str, dict[str, Any]]:
    return {k: v for k, v in json.loads(SHIPPED.read_text()).items() if not k.startswith("_")}


def config_values(path: str, revision: str | None = None) -> dict[str, Any]:
    """config.json's values for `path` (a save_pretrained dir or a hub id), or a one-line ConfigError."""
    local = Path(path).expanduser()
    if (local / "config.json").is_file():
        return json.loads((local / "config.json").read_text())
    if path in shipped():
        return dict(shipped()[path])
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(path, "config.json", revision=revision)
    if isinstance(cached, str):
        return json.loads(Path(cached).read_text())
    known = ", ".join(shipped())
    raise ConfigError(
        f"model.path={path}: no config.json there, none cached, and not a model ablate knows "
        f"offline ({known}); give a save_pretrained dir (model=local model.path=DIR)"
    )


def build_config(values: dict[str, Any], overrides: dict[str, Any] | None = None) -> Any:
    """A transformers PretrainedConfig from config.json `values`, with `overrides` on top."""
    from transformers import AutoConfig

    values = {**values, **(overrides or {})}
    model_type = values.pop("model_type", None)
    if model_type is None:
        raise ConfigError("model: its config.json has no model_type; ablate cannot tell the architecture")
    values.pop("transformers_version", None)
    try:
        return AutoConfig.for_model(model_type, **values)
    except (ValueError, TypeError) as e:
        raise ConfigError(f"model.config_overrides: {str(e).splitlines()[0]}") from e


def scaled_down(path: str, revision: str | None, overrides: dict[str, Any]) -> tuple[Any, Any]:
    """(tokenizer, model): `path`'s architecture with `overrides` (e.g. num_hidden_layers=2,
    hidden_size=64), random weights (seed 0, so every run starts from the same model), ablate's byte
    tokenizer and its chat template; no download."""
    import torch
    from transformers import AutoModelForCausalLM

    from ablate.models.tokenizer import byte_tokenizer

    values = {k: v for k, v in config_values(path, revision).items() if k not in TOKEN_KEYS}
    tokenizer = byte_tokenizer()
    ids = {
        "vocab_size": len(tokenizer),
        "pad_token_id": tokenizer.pad_token_id,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
    }
    config = build_config(values, {**dict(overrides), **ids})
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return tokenizer, model
