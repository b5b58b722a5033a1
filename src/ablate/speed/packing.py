"""Padding-free forward: a batch's rows concatenated into one row of real tokens only.

A padded batch of R rows of width W sends R*W positions through every linear layer, norm and MLP;
the padding positions are computed and thrown away. Packed, only the N real tokens go through them
(one row `[1, N]`, with each token's own position id), which is most of a step's work. Attention is
the one operation that must keep rows apart: `packed_sdpa` scatters the packed queries, keys and
values back into the padded `[R, H, W, d]` layout, runs transformers' own SDPA attention there with
the batch's usual 4-D mask, and gathers the real positions back. So every number equals the padded
forward's (tested to 1e-5 in float32); the padding positions cost attention only, a small part of a
step (4·W·h FLOPs per token against ~12·h² per layer for the projections and MLP).

On CPU in bf16/fp16 with short rows (`takes_eager`), that padded attention is transformers' eager
attention rather than sdpa: sdpa's CPU flash kernel is slowest exactly there (measured 2-3x slower,
forward + backward, at a few hundred tokens per row), and both work in the same precision (bf16 inputs,
float32 softmax). Float32 always takes sdpa.

On a GPU (`PACKED_KERNEL`: every device but the CPU) the packed row goes through PyTorch's
FlexAttention instead (`torch.nn.attention.flex_attention`, compiled once per process): a varlen
kernel over the packed tokens with a document block mask (`Documents`: each token's row and segment;
a token attends to earlier tokens of its own row, of the row's shared prompt or of its own segment),
built blockwise, so there is neither padding nor a dense [T, T] mask anywhere, and DPO's and GRPO's
shared-prompt layouts need no copies of the prompt. FlexAttention has no backward on a CPU: there the
same mask evaluated densely (kernel "dense": sdpa on the packed row) is what tests train through, and
the flex kernel is tested forward-only (tests/unit/test_flex_packing.py); benchmarks/gpu.py checks it,
forward and backward, on CUDA.

It is a transformers attention function registered under its own name (`AttentionInterface`, the
documented way to add an attention kernel), with sdpa's mask function, so a model switched to it
behaves exactly like sdpa wherever no `unpad` or block mask is passed (generation, eval logits, a 2-D
mask). TRL packs only with flash-attention's varlen kernel (CUDA); this needs none.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, create_mask, flex_attention
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
from transformers.models.llama.modeling_llama import eager_attention_forward

from ablate.speed.split import PACKED_SDPA, PLAIN_HEAD_MODELS, causal_lm


@dataclass(frozen=True)
class Unpad:
    """Where the packed tokens sit in the padded batch: `index` (N,) flat positions into rows*width.

    A token may also sit in several rows (GRPO's shared prompt, computed once, is attended to in each of
    its completions' rows): then `index` (M,) lists the padded positions, `source` (M,) the packed token
    at each, and `out` (N,) the one position whose attention output each packed token takes."""

    index: torch.Tensor
    rows: int
    width: int
    source: torch.Tensor | None = None
    out: torch.Tensor | None = None
    causal: bool = False  # every row's real tokens first: causal attention, no mask (`rows_mask`)


def _padded(x: torch.Tensor, unpad: Unpad) -> torch.Tensor:
    """[1, H, N, d] packed -> [R, H, W, d] padded (zeros at padding: masked keys, queries discarded)."""
    tokens = x[0].transpose(0, 1)  # [N, H, d]
    if unpad.source is not None:  # copies of a token: their gradients add up in the one packed token
        tokens = tokens[unpad.source]
    full = tokens.new_zeros(unpad.rows * unpad.width, *tokens.shape[1:]).index_copy(0, unpad.index, tokens)
    return full.view(unpad.rows, unpad.width, *tokens.shape[1:]).transpose(1, 2)


def packed_sdpa(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    unpad: Unpad | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' sdpa attention; with `unpad`, on the padded layout of packed q/k/v (the 4-D
    `attention_mask` is the padded batch's), returning the packed output [1, N, H, d]; with a
    FlexAttention `BlockMask` (a `Documents` mask), FlexAttention on the packed row itself."""
    if isinstance(attention_mask, BlockMask):
        return flex_packed(module, query, key, value, attention_mask, **kwargs)
    if unpad is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    query, key, value = _padded(query, unpad), _padded(key, unpad), _padded(value, unpad)
    if unpad.causal:  # the mask is a placeholder (a 4-D one the model's mask code passes on as it is)
        attention_mask = None
    if takes_eager(query, attention_mask):
        bias = torch.zeros(attention_mask.shape, dtype=query.dtype, device=query.device)
        bias.masked_fill_(~attention_mask, torch.finfo(query.dtype).min)  # eager's additive mask
        out, weights = eager_attention_forward(module, query, key, value, bias, **kwargs)
    else:
        out, weights = sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    at = unpad.index if unpad.out is None else unpad.out
    return out.flatten(0, 1)[at].unsqueeze(0), weights  # out: [R, W, H, d]


# the kernel packed rows attend with, per device type (any other: "flex"): "padded" (sdpa or eager per row
# on the padded layout, measured fastest on CPU), "flex" (FlexAttention on the packed row, block mask),
# "dense" (sdpa on the packed row with the same mask made dense: the reference flex is tested against
# where FlexAttention has no backward, the CPU)
PACKED_KERNEL: dict[str, str] = {"cpu": "padded"}
# compile FlexAttention (its fused kernel; eager FlexAttention builds every score); tests turn it off
FLEX_COMPILE = True
_compiled: dict[str, Any] = {}


def packed_kernel(device: torch.device | str) -> str:
    return PACKED_KERNEL.get(torch.device(device).type, "flex")


@dataclass(frozen=True)
class Documents:
    """The packed row's structure for FlexAttention: each token's row `doc` (N,) and `seg` (N,): 0 for
    a row's shared part (its prompt), k > 0 for its k-th continuation (DPO's chosen 1, rejected 2; GRPO's
    completions). Token q attends to key k when both are in one row, k comes no later than q, and k is
    the row's prompt or in q's own segment: a row's completions never see each other."""

    doc: torch.Tensor
    seg: torch.Tensor

    def mask_mod(self) -> Any:
        doc, seg = self.doc, self.seg

        def mask(b: Any, h: Any, q: Any, kv: Any) -> Any:
            return (doc[q] == doc[kv]) & (kv <= q) & ((seg[kv] == 0) | (seg[kv] == seg[q]))

        return mask

    def block_mask(self) -> BlockMask:
        """The block mask, evaluated block by block (compiled) on a GPU: never an [N, N] tensor there."""
        n = self.doc.numel()
        return create_block_mask(
            self.mask_mod(),
            1,
            None,
            n,
            n,
            device=self.doc.device,
            _compile=FLEX_COMPILE and self.doc.device.type != "cpu",
        )

    def dense_mask(self) -> torch.Tensor:
        """The same mask as a boolean [1, 1, N, N] tensor (the "dense" kernel: a CPU reference)."""
        n = self.doc.numel()
        return create_mask(self.mask_mod(), 1, 1, n, n, device=self.doc.device)


def flex_packed(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    block_mask: BlockMask,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """FlexAttention over the packed row [1, H, N, d] (GQA kept grouped), returning [1, N, H, d] as
    transformers' attention functions do. Under autocast q, k, v run in its dtype, as sdpa's do."""
    if dropout:
        raise ValueError(
            "packed FlexAttention: attention dropout is not supported (set the model's attention_dropout=0)"
        )
    kind = query.device.type
    dtype = torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else query.dtype
    q, k, v = (x.to(dtype) for x in (query, key, value))
    fn = flex_attention
    # (speed.compile traces flex itself)
    if FLEX_COMPILE and kind != "cpu" and not torch.compiler.is_compiling():
        # once per process; shapes marked dynamic as they vary
        fn = _compiled.setdefault(kind, torch.compile(flex_attention))
    out = fn(q, k, v, block_mask=block_mask, scale=scaling, enable_gqa=k.shape[1] != q.shape[1])
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(PACKED_SDPA, packed_sdpa)
AttentionMaskInterface.register(PACKED_SDPA, sdpa_mask)


# The largest rows x heads x width^2 score matrix `takes_eager` sends to eager attention: measured on
# CPU (one thread, bf16, fwd + bwd), eager is 2.6x faster than sdpa's flash kernel at 2^19 scores, 1.4x
# at 2^22, even at 2^23 and slower above (the L^2 float32 softmax it keeps for backward, ~6 bytes a score).
EAGER_MAX_SCORES = 2**22


def takes_eager(query: torch.Tensor, attention_mask: torch.Tensor | None) -> bool:
    """Whether the padded attention of a packed batch runs transformers' eager attention instead of
    sdpa: on CPU in bfloat16/float16 (autocast) with a boolean mask and a small score matrix.

    Same precision class: both take bf16 q, k, v and softmax in float32 (eager rounds the scores to
    bf16 first, as transformers' eager attention does); float32 always runs sdpa (eager is no faster
    there), so every float32 number is unchanged."""
    rows, heads, width, _ = query.shape
    # under autocast q arrives in float32 (rotary embeddings upcast it) and the matmuls run in its dtype
    dtype = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else query.dtype
    return (
        query.device.type == "cpu"
        and dtype in (torch.bfloat16, torch.float16)
        and attention_mask is not None
        and attention_mask.dtype == torch.bool
        and rows * heads * width * width <= EAGER_MAX_SCORES
    )


def use_packed_attention(model: nn.Module) -> bool:
    """Switch a supported sdpa model (ablate.speed.split's families) to `packed_sdpa`; True when it
    runs it (already or now). Nothing else changes: weights, saved config and every unpacked forward."""
    lm = causal_lm(model)
    config = getattr(lm, "config", None)
    if config is None or getattr(config, "model_type", None) not in PLAIN_HEAD_MODELS:
        return False
    if config._attn_implementation == "sdpa":
        lm.set_attn_implementation(PACKED_SDPA)
    return config._attn_implementation == PACKED_SDPA


def takes_packed(model: nn.Module) -> bool:
    """True when `model` (not wrapped, e.g. by DDP) runs `packed_sdpa`."""
    config = getattr(causal_lm(model), "config", None)
    return getattr(config, "_attn_implementation", None) == PACKED_SDPA


def causal_mask_4d(attention_mask: torch.Tensor) -> torch.Tensor:
    """The boolean (R, 1, W, W) mask of right-padded rows from their 2-D mask: causal over each row's
    real tokens; every query sees itself, so a padding query never has an all-masked softmax."""
    width = attention_mask.shape[1]
    causal = torch.ones(width, width, dtype=torch.bool, device=attention_mask.device).tril()
    mask = causal & attention_mask.bool()[:, None, None, :]
    return mask | torch.eye(width, dtype=torch.bool, device=attention_mask.device)


def rows_mask(attention_mask: torch.Tensor) -> torch.Tensor | None:
    """The padded layout's attention mask from its 2-D one: None (sdpa's causal kernel, no mask) when every
    row holds its real tokens first (right padding: causal attention alone is exact for each of them; a
    padding query's output is discarded) and the 4-D mask would be large, rows x width^2 above
    EAGER_MAX_SCORES (at long rows the mask is rows x width^2 bytes, and a masked kernel cannot skip the
    blocks above the diagonal: measured 2.4x slower, forward and backward, at 4k tokens); else
    `causal_mask_4d` (short rows: the eager kernel `takes_eager` picks reads it)."""
    rows, width = attention_mask.shape
    real_first = bool((attention_mask.cumprod(-1) == attention_mask).all())
    if real_first and rows * width * width > EAGER_MAX_SCORES:
        return None
    return causal_mask_4d(attention_mask)


def packed_inputs(
    inputs: dict[str, torch.Tensor],
    src: torch.Tensor,
    lengths: torch.Tensor,
    segments: torch.Tensor | None = None,
    kernel: str | None = None,
) -> tuple[dict[str, Any], torch.Tensor]:
    """Model inputs of a right-padded batch (`input_ids` (R, W), optional `position_ids`, a 2-D or
    4-D boolean `attention_mask`), packed: row b's first `lengths[b]` tokens, rows one after another.
    Also returns `src` (flat positions into R*W that score a token) as positions in the packed row.

    The attention `kernel` (default: `packed_kernel` of the device) decides the mask: "padded", the
    batch's own 4-D mask on its padded layout (`Unpad`); "flex" and "dense", a `Documents` mask of the
    packed row (each token's row, and its `segments` (R, W) value: 0 everywhere when None), as a
    FlexAttention block mask or a dense [1, 1, N, N] one; the batch's `attention_mask` is then unused."""
    ids = inputs["input_ids"]
    rows, width = ids.shape
    real = torch.arange(width, device=ids.device)[None, :] < lengths.to(ids.device)[:, None]
    index = real.flatten().nonzero().squeeze(1)
    where = torch.full((rows * width,), -1, dtype=torch.long, device=ids.device)
    where[index] = torch.arange(index.numel(), device=ids.device)
    positions = inputs.get("position_ids")
    if positions is None:
        positions = torch.arange(width, device=ids.device).expand(rows, width)
    packed = {"input_ids": ids.flatten()[index][None], "position_ids": positions.flatten()[index][None]}
    kernel = kernel or packed_kernel(ids.device)
    if kernel == "padded":
        mask = inputs["attention_mask"]
        four = rows_mask(mask) if mask.dim() == 2 else mask
        causal = four is None  # a placeholder mask: the model's mask code would build one for the packed row
        packed.update(
            attention_mask=torch.ones(1, 1, 1, 1, dtype=torch.bool, device=ids.device) if causal else four,
            unpad=Unpad(index, rows, width, causal=causal),
        )
    else:
        seg = segments.to(ids.device).flatten()[index] if segments is not None else torch.zeros_like(index)
        docs = Documents(torch.div(index, width, rounding_mode="floor"), seg)
        packed["attention_mask"] = docs.block_mask() if kernel == "flex" else docs.dense_mask()
    return packed, where[src.to(ids.device)]
