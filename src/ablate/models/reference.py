"""Reference models for DPO, selected by `conf/ref_model/*.yaml` (`method.trainer.ref_model`).

By default DPO needs no reference model: its log-probs are precomputed once with the initial policy.
A *live* reference is scored every step instead; it is built here from the same `model` config as
the policy, so it starts from the same weights, optionally quantized with a `BitsAndBytesConfig`
(the TRL docs' "8-bit reference model"). Quantization applies to the reference only: a quantized
policy without adapters is refused by `ablate.train` with a one-line error.

bitsandbytes >= 0.45 runs 8-bit and 4-bit layers on CPU; `Linear8bitLt` casts its inputs to fp16
inside (it warns "inputs will be cast ... to float16"), so an 8-bit reference's log-probs differ
from the full-precision ones by roughly fp16 rounding.
"""

from __future__ import annotations

import tempfile
from typing import Any

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig
from transformers import AutoModelForCausalLM, PreTrainedModel

from ablate.schema.models import Reference


def reference(model: DictConfig, quantization_config: Any = Reference.quantization_config) -> PreTrainedModel:
    """Build the reference from the policy's model config (`${model}`), quantized if asked.

    `model` arrives unbuilt (`_recursive_: false` in the YAML) so that a hub or local model is loaded
    once, straight into its quantized form. A model built from code (the tiny one) has no files to
    load from: it is built, saved to a temporary dir, and reloaded with `from_pretrained`, which is
    where transformers applies `quantization_config`.
    """
    qconf = (
        instantiate(quantization_config)
        if isinstance(quantization_config, DictConfig)
        else quantization_config
    )
    if qconf is None:
        return instantiate(model)[1]
    # bitsandbytes models cannot be moved with .to() after loading: place them on the GPU while loading
    # (the trainer leaves a model with an hf_device_map where it is). Not yet run on a GPU here.
    kwargs: dict[str, Any] = {"quantization_config": qconf}
    if torch.cuda.is_available():
        kwargs["device_map"] = {"": torch.cuda.current_device()}
    if "path" in model:  # a save_pretrained dir or hub id: load once, quantized
        kwargs.update({k: model[k] for k in ("revision", "trust_remote_code") if k in model})
        return AutoModelForCausalLM.from_pretrained(model.path, **kwargs)
    _, built = instantiate(model)
    with tempfile.TemporaryDirectory(prefix="ablate-ref-") as tmp:
        built.save_pretrained(tmp)
        return AutoModelForCausalLM.from_pretrained(tmp, **kwargs)
