"""The model's own forward without accelerate's float32 copy of its outputs.

With bf16/fp16 mixed precision, `Accelerator.prepare` wraps the model's forward in autocast and then in
`convert_outputs_to_fp32`: every floating output comes back in float32. For a causal LM that is the whole
[rows, T, vocab] logits, copied to float32: twice their bf16 bytes, kept for backward by whatever reads
them, and a float32 gradient of the same size in backward; at 50k-150k vocabularies the largest tensors of
a step. TRL's trainers return per-token log-probs from their forward (a fused LM head), so for them the
conversion copies nothing large. The trainers' plain paths read the logits themselves (in float32, a block
of rows at a time: ablate.losses.logps.logits_logps), so they call the forward accelerate wrapped
(`_original_forward`, which `Accelerator.unwrap_model(keep_fp32_wrapper=False)` restores) under the same
autocast: the same logits, in the autocast dtype.

A model inside a wrapper (DDP) is called as it is: the wrapper's forward must run (its gradient hooks),
and it calls the converting forward.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def unconverted(accelerator: Any, model: Any) -> Callable[..., Any]:
    """`model`'s forward under accelerate's autocast, without its conversion of the outputs to float32;
    `model` itself when there is none (no mixed precision, not prepared yet, or a wrapper around it)."""
    original = getattr(model, "__dict__", {}).get("_original_forward")
    if original is None or accelerator.unwrap_model(model) is not model:
        return model

    def forward(*args: Any, **kwargs: Any) -> Any:
        with accelerator.autocast():
            return original(*args, **kwargs)

    return forward
