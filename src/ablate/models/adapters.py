"""LoRA / QLoRA adapters (the `peft` package), selected by `conf/peft/*.yaml` (`ablate train +peft=lora`).

The policy is wrapped with `get_peft_model` right after it is built: the base weights are frozen and
only the adapters train. As in TRL, the reference a method needs (DPO's, GRPO's KL) is then the same
model with its adapters disabled (`reference_forward`), so no second copy is kept. A fresh LoRA
adapter starts at zero (B = 0), so with adapters off the model is exactly the initial policy.

QLoRA is LoRA on a base loaded in 4 bits: `+peft=qlora` also sets `model.quantization_config` (a
bitsandbytes `BitsAndBytesConfig`), the model builder loads the base quantized, and `with_adapters`
runs `prepare_model_for_kbit_training` (norms and embeddings in fp32, frozen base) before adding LoRA.

`<run_dir>/model/` then holds the adapter (adapter_config.json, adapter_model.safetensors) and the
tokenizer; with `peft.save_merged=true` also `model/merged/`, a plain model with the adapter folded in
(loadable with `AutoModelForCausalLM.from_pretrained`, i.e. `model=local model.path=.../model/merged`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from peft import LoraConfig, PeftConfig, PeftModel, get_peft_model, prepare_model_for_kbit_training
from transformers import PreTrainedModel

from ablate.errors import ConfigError
from ablate.models.heads import is_classifier, with_head
from ablate.schema.models import Adapters as LoRA

log = logging.getLogger("ablate")
MERGED = "merged"  # model/merged/: the merged model, when peft.save_merged=true


@dataclass
class Adapters:
    """What a `peft` config builds: the adapter config, and whether to also save a merged model."""

    config: PeftConfig
    save_merged: bool = False


def lora(
    r: int = LoRA.r,
    lora_alpha: int = LoRA.lora_alpha,
    lora_dropout: float = LoRA.lora_dropout,
    target_modules: str | list[str] | None = LoRA.target_modules,
    bias: str = LoRA.bias,
    use_rslora: bool = LoRA.use_rslora,
    use_dora: bool = LoRA.use_dora,
    save_merged: bool = LoRA.save_merged,
    **extra: Any,
) -> Adapters:
    """A `peft.LoraConfig` for a causal LM (any other LoraConfig field passes through `extra`:
    `+peft.modules_to_save=[lm_head]`); each setting's default is its config node's (ablate.schema.models)."""
    plain = {
        k: OmegaConf.to_container(v) if OmegaConf.is_config(v) else v  # Hydra passes lists as ListConfig
        for k, v in dict(extra, target_modules=target_modules).items()
    }
    try:
        config = LoraConfig(
            r=r,
            lora_alpha=lora_alpha,
            lora_dropout=lora_dropout,
            bias=bias,
            use_rslora=use_rslora,
            use_dora=use_dora,
            task_type="CAUSAL_LM",
            **plain,
        )
    except (TypeError, ValueError) as e:  # an unknown field (+peft.rr=4) or a bad value
        raise ConfigError(f"peft: {str(e).splitlines()[0]}") from None
    return Adapters(config=config, save_merged=save_merged)


def _build(peft: DictConfig | Adapters | None) -> Adapters | None:
    return instantiate(peft) if isinstance(peft, DictConfig) else peft


def with_adapters(model: PreTrainedModel, peft: DictConfig | Adapters | None) -> PreTrainedModel:
    """`model` wrapped with trainable adapters (frozen base), or unchanged when `peft` is None."""
    adapters = _build(peft)
    if adapters is None:
        return model
    _check_rank(model, adapters.config)
    if is_classifier(model):  # method=reward: peft's SEQ_CLS task trains the new score head in full
        adapters = dataclasses.replace(
            adapters, config=dataclasses.replace(adapters.config, task_type="SEQ_CLS")
        )
    if getattr(model, "is_quantized", False):  # QLoRA: fp32 norms/embeddings, frozen quantized base
        # no gradient checkpointing here: method.args.gradient_checkpointing=true turns it on for any model
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    # as configured: peft expands all-linear into the layers it found
    targets = adapters.config.target_modules
    targets = targets if isinstance(targets, str) or targets is None else ",".join(sorted(targets))
    try:
        with quiet_peft():
            model = get_peft_model(model, adapters.config)
    except ValueError as e:  # peft: "Target modules {...} not found in the base model" (a page of text)
        if "target_modules" not in str(e) and "Target modules" not in str(e):
            raise
        names = sorted(
            {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
        )
        raise ConfigError(
            f"peft.target_modules={adapters.config.target_modules}: no such layer in this model; "
            f"its linear layers: {', '.join(names)} (or peft.target_modules=all-linear)"
        ) from None
    log.info("%s", trainable_line(model, adapters.config, targets))
    return model


def trainable_line(model: PeftModel, config: PeftConfig, targets: str | None) -> str:
    """`LoRA (r=16, all-linear): 1.2M of 135M parameters train (0.9%)`: what the adapters leave to train
    (peft's count, which counts a 4-bit base's packed weights at their real size)."""
    trainable, total = model.get_nb_trainable_parameters()
    kind = "DoRA" if getattr(config, "use_dora", False) else "LoRA"
    return (
        f"{kind} (r={config.r}, {targets}): {_count(trainable)} of {_count(total)} parameters train "
        f"({100 * trainable / max(total, 1):.2g}%); the base is frozen"
    )


def _count(n: int) -> str:
    return (
        f"{n / 1e9:.3g}B"
        if n >= 1e9
        else f"{n / 1e6:.3g}M"
        if n >= 1e6
        else f"{n / 1e3:.3g}k"
        if n >= 1e3
        else str(n)
    )


def _check_rank(model: PreTrainedModel, config: Any) -> None:
    """A rank above a layer's own width adds no capacity, only memory (peft.r=1e9 asked for 256 GB and
    died in torch's allocator): refused naming the widest rank that means something."""
    widths = [min(m.in_features, m.out_features) for m in model.modules() if isinstance(m, torch.nn.Linear)]
    r = getattr(config, "r", None)
    if widths and isinstance(r, int) and r > max(widths):
        raise ConfigError(
            f"peft.r={r}: larger than any layer it adapts (the widest is {max(widths)} wide): "
            f"must be at most {max(widths)}; LoRA's point is a small r (8-64)"
        )


@contextlib.contextmanager
def quiet_peft() -> Iterator[None]:
    """peft 0.21 reads transformers 5's deprecated `is_gradient_checkpointing` whenever it wraps a model:
    a FutureWarning about peft's code, not the user's, in every run's output."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        yield


def is_adapted(model: torch.nn.Module) -> bool:
    """True for a model with peft adapters (the reference is then the model with adapters off)."""
    return isinstance(model, PeftModel)


@contextlib.contextmanager
def reference_forward(model: torch.nn.Module, unwrapped: torch.nn.Module) -> Iterator[None]:
    """Within: `model` (a peft model, maybe wrapped by DDP: `unwrapped` is the PeftModel) computes the
    reference, i.e. the base model: adapters disabled, eval mode (no dropout), no autograd."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), unwrapped.disable_adapter():
            yield
    finally:
        model.train(was_training)


def save_merged(trainer: Any, model_dir: Path, cfg: DictConfig) -> Path | None:
    """With `peft.save_merged=true`: save the adapter merged into its base to `model_dir/merged`.

    The adapter is read back from `model_dir` (what the run saved) onto a fresh full-precision base
    built from the same model config without its `quantization_config`: a 4-bit base is never the
    thing to merge into (QLoRA's usual practice). Returns the merged dir, or None when not asked.
    """
    adapters = _build(cfg.get("peft"))
    if adapters is None or not adapters.save_merged:
        return None
    model_cfg = (
        OmegaConf.merge(cfg.model, {"quantization_config": None})
        if "quantization_config" in cfg.model
        else cfg.model
    )
    _, base = instantiate(model_cfg)
    # method=reward: the adapter was trained on the score head's model
    base = with_head(base, cfg.get("method"))
    with quiet_peft():
        merged = PeftModel.from_pretrained(base, str(model_dir)).merge_and_unload()
    out = model_dir / MERGED
    merged.save_pretrained(str(out))
    trainer.processing_class.save_pretrained(str(out))
    return out
