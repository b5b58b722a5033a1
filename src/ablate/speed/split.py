"""A causal LM split into backbone (token ids -> final hidden states) and head (hidden -> logits).

The `completion_only_logits` path (ablate.speed.scoring) runs the backbone itself and projects only the
positions whose next token is scored, instead of asking the model for logits at every position. That
is exact only where the model's own forward is `lm_head(backbone(...).last_hidden_state)` with nothing
in between: no logit scaling or soft-capping, a plain `nn.Linear` head (a LoRA-wrapped head is not
one). Model families are listed by name rather than guessed from attributes, because a wrong guess
would be silently wrong numbers; for any other model the speed plan (ablate.speed.plan) turns the path
off and says why (and `lm_parts` gives `None`: the model's own forward). The forwards relied on are
pinned in tests/unit/test_model_internals.py.

The same families take a custom 4-D attention mask and explicit position ids through
`transformers.masking_utils` (a 4-D mask is used as given), which prompt sharing needs.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from ablate.losses.logps import logits_logps
from ablate.speed.head import completion_logps

# model_type -> the causal LMs whose forward is `lm_head(model(...).last_hidden_state)` in transformers 5,
# and whose attention takes a prepared 4-D mask (masking_utils returns a 4-D mask as given)
PLAIN_HEAD_MODELS = frozenset({"llama", "mistral", "qwen2", "qwen3"})
# ablate.speed.packing's padding-free attention: sdpa on the padded layout of a packed batch
PACKED_SDPA = "ablate_packed_sdpa"
# attention kernels that read a custom 4-D mask: sdpa and PACKED_SDPA (boolean, True = attend), eager
# (additive)
MASKED_ATTENTION = frozenset({"sdpa", PACKED_SDPA, "eager"})


def causal_lm(model: nn.Module) -> nn.Module:
    """The transformers model inside a peft wrapper (its LoRA layers stay in place), else `model`."""
    get_base = getattr(model, "get_base_model", None)  # peft.PeftModel
    return get_base() if callable(get_base) else model


def prompt_learning(model: nn.Module) -> bool:
    """peft prompt/prefix tuning: its wrapper's forward adds virtual tokens, so the inner model's parts
    (or a mask sized for the real tokens) would be wrong."""
    config = getattr(model, "active_peft_config", None)
    return bool(getattr(config, "is_prompt_learning", False))


def lm_parts(model: nn.Module) -> tuple[nn.Module, nn.Linear] | None:
    """(backbone, lm_head) of a supported causal LM, peft-wrapped or not; None when the split is not
    known to be exact (the caller then uses the model's own forward)."""
    lm = causal_lm(model)
    config = getattr(lm, "config", None)
    if (
        config is None
        or getattr(config, "model_type", None) not in PLAIN_HEAD_MODELS
        or prompt_learning(model)
    ):
        return None
    head = lm.get_output_embeddings()
    backbone = getattr(lm, getattr(lm, "base_model_prefix", ""), None)
    # a plain Linear, or one FSDP2 shards (its class made from nn.Linear); not peft's lora.Linear
    plain = type(head) is nn.Linear or (sharded(head) and isinstance(head, nn.Linear))
    if not plain or backbone is None:
        return None
    return backbone, head


def takes_custom_mask(model: nn.Module) -> bool:
    """True when a 4-D attention mask and position ids given to `model` are used as given."""
    config = getattr(causal_lm(model), "config", None)
    return (
        not prompt_learning(model)
        and getattr(config, "model_type", None) in PLAIN_HEAD_MODELS
        and getattr(config, "_attn_implementation", None) in MASKED_ATTENTION
    )


def takes_logits_to_keep(model: nn.Module) -> bool:
    """Whether the (unwrapped; PEFT: base) model's forward projects only its last N positions when asked
    (`logits_to_keep`, transformers' causal LMs); otherwise the full logits are computed."""
    import inspect

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "logits_to_keep" in inspect.signature(base.forward).parameters


def keep_from(model: nn.Module, scored: torch.Tensor) -> dict[str, int]:
    """`logits_to_keep` for a forward whose position t scores token t+1 where `scored[:, t]` (B, T-1): the
    positions from the first that scores any token to the end (T - first), when the (unwrapped) model
    takes it; {} to keep every position. The positions before are never scored: their logits would be
    computed, kept for backward and thrown away."""
    if not takes_logits_to_keep(model) or not bool(scored.any()):
        return {}
    first = int(scored.any(0).nonzero()[0])
    return {"logits_to_keep": scored.shape[1] + 1 - first}


def sharded(model: nn.Module) -> bool:
    """Whether FSDP2 manages `model` (fully_shard: its forward hooks gather the weights its parts use)."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


@contextlib.contextmanager
def head_passes_hidden(head: nn.Linear) -> Iterator[None]:
    """`head` returns its input for the block: a wrapped model's forward (DDP's, whose hooks all-reduce the
    gradients of everything its forward's graph reaches) gives the final hidden states as `logits`, which
    the chunked head then projects at the scored positions with the same weight (its gradient reaches
    DDP's hooks as any other parameter's)."""
    with _forward_as(head, _identity):
        yield


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x


@contextlib.contextmanager
def _forward_as(head: nn.Module, forward: Any) -> Iterator[None]:
    """`head`'s calls run `forward` for the block (its hooks still run around it: DDP's, FSDP's)."""
    head.forward = forward  # an instance attribute: shadows the class's forward for this module only
    try:
        yield
    finally:
        del head.forward


@contextlib.contextmanager
def head_scores(
    head: nn.Linear, src: torch.Tensor, tgt: torch.Tensor, temperature: float, seq: Any = None
) -> Iterator[dict]:
    """`head` returns the log-probs of `tgt` at flat positions `src` of its input for the block, in chunks
    (`completion_logps`); their stats go to the dict yielded. For FSDP2: the head's weight is whole only
    inside its own call (its hooks gather it before and reduce-scatter its gradient after), so the chunked
    projection runs there, in the root's forward, instead of on the sharded weight after it."""
    stats: dict[str, torch.Tensor] = {}

    def forward(hidden: torch.Tensor) -> torch.Tensor:
        logps, got = _project(hidden, head, src, tgt, temperature, seq)
        stats.update(got)
        return logps

    with _forward_as(head, forward):
        yield stats


# a causal LM whose decoder is split over a sequence group -> its split (ablate.speed.ulysses.Ulysses)
SEQUENCE_SPLITS: weakref.WeakKeyDictionary[nn.Module, Any] = weakref.WeakKeyDictionary()


def _project(
    hidden: torch.Tensor, head: nn.Linear, src: torch.Tensor, tgt: torch.Tensor, temperature: float, seq: Any
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """`completion_logps` at `src` of the final hidden states, or, where the forward was split over a
    sequence group and they stayed this rank's (`seq`: a Ulysses scoring locally), of its positions summed
    over the group (ablate.speed.ulysses.Shard.scores)."""
    if seq is not None and seq.scored is not None:
        return seq.scored.scores(hidden, head, src, tgt, temperature)
    return completion_logps(hidden.flatten(0, 1)[src], head, tgt, temperature=temperature)


def scored_logps(
    model: nn.Module,
    inputs: dict,
    src: torch.Tensor,
    tgt: torch.Tensor,
    split: bool = True,
    temperature: float = 1.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Log-probs of tokens `tgt` predicted at flat positions `src` of `model(**inputs)` (logits divided
    by `temperature` first), and their `entropy`/`mean_logit`/`correct` stats (no gradient).

    With `split` and a model `lm_parts` knows, the backbone runs alone and the head only at `src`, in
    chunks (`ablate.speed.head`); a wrapper's (DDP's) forward runs whole, its head passing the hidden
    states through (`head_passes_hidden`); FSDP2's root runs whole, its head scoring in its own call
    (`head_scores`); otherwise the model's own forward, the logits at `src` picked (no
    float32 copy of them: ablate.losses.logps.logits_logps). The
    caller supplies autocast: the backbone's own call does not get the one accelerate puts on forward."""
    inner = getattr(model, "module", model)  # DDP's wrapped model
    seq = SEQUENCE_SPLITS.get(causal_lm(inner)) if split and isinstance(inner, nn.Module) else None
    with seq.scoring_locally() if seq is not None else contextlib.nullcontext():
        parts = lm_parts(model) if split and not sharded(model) else None
        if parts is not None:
            backbone, head = parts
            hidden = backbone(**inputs, use_cache=False).last_hidden_state
            return _project(hidden, head, src, tgt, temperature, seq)
        # DDP, FSDP2: the wrapper's (root's) own forward must run (its hooks gather weights, reduce gradients)
        parts = lm_parts(inner) if split and isinstance(inner, nn.Module) else None
        if parts is not None and sharded(model):  # the head scores inside its own call (no [tokens, vocab])
            with head_scores(parts[1], src, tgt, temperature, seq) as stats:
                logps = model(**inputs, use_cache=False).logits
            return logps, dict(stats)
        if parts is not None:
            with head_passes_hidden(parts[1]):  # the forward returns the final hidden states
                hidden = model(**inputs, use_cache=False).logits
            return _project(hidden, parts[1], src, tgt, temperature, seq)
    # the scored positions' logits (a position may score several tokens: a shared prompt's last one)
    picked = model(**inputs, use_cache=False).logits.flatten(0, 1)[src]
    return logits_logps(picked, tgt, temperature)
