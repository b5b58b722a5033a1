"""The LM head and the log-probs as one autograd function: no [tokens, vocab] tensor is ever saved.

`completion_only_logits` projects only the positions that score a completion token. Even so, N such
positions make an [N, vocab] logits tensor (bf16 on a GPU, float32 on a CPU), its float32 log-softmax
and, in backward, float32 temporaries of the same size: the largest tensors of a step at 50k-150k
vocabularies. `HeadLogps` runs the head's matmul and the log-softmax one chunk of rows at a time,
keeps each position's logsumexp (N floats), and in backward recomputes each chunk's logits from the
saved hidden states (one matmul), turns them into the logits' gradient, and multiplies it out into
the hidden states' and the head weight's gradients, accumulated over chunks (in float32 on a GPU
with torch >= 2.8: no rounding of a chunk's weight gradient to bf16 before the sum). That is the idea
of Liger Kernel's fused linear cross-entropy (Hsu et al. 2024) and TRL's `ChunkedLogProbFunction`, in
plain PyTorch: four matmuls per chunk (one forward, three backward), where checkpointing each chunk
(ablate's earlier form) ran five and recomputed the metrics too.

Numbers: each chunk is what `lm_head(hidden)` gives under the same autocast (the forward calls
`F.linear`, which autocast casts as it casts the module's call; backward, where autocast is off,
casts to the dtype the forward's matmul ran in), then `ablate.losses.logps.block_logps`, the plain
formula; so log-probs equal the plain path's, and gradients equal them to float rounding (the weight
gradient is a sum over chunks). Tested against full logits in float32
(tests/unit/test_dpo_speed_paths.py, test_head_logps.py); on CUDA by benchmarks/gpu.py.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from ablate.losses.logps import STATS, block_grad, block_logps, chunk_rows

# torch.addmm(..., out_dtype=torch.float32) from bf16/fp16 operands: CUDA, torch >= 2.8
_FP32_OUT = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 8)


def _accumulate(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """acc (float32) += a @ b, without rounding a @ b to the operands' dtype first where torch can."""
    if acc.dtype != a.dtype and acc.device.type == "cuda" and _FP32_OUT:
        torch.addmm(acc, a, b, out_dtype=torch.float32, out=acc)
    else:
        acc.add_(a @ b)


class HeadLogps(torch.autograd.Function):
    """(log-prob of targets[i] under `F.linear(hidden[i], weight, bias) / temperature`, entropy, mean
    logit, argmax == target) for hidden [N, H], in chunks of `rows`; see the module docstring."""

    @staticmethod
    def forward(
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        targets: torch.Tensor,
        temperature: float,
        rows: int,
    ) -> tuple[torch.Tensor, ...]:
        n = hidden.shape[0]
        logps = hidden.new_empty(n, dtype=torch.float32)
        lse, entropy, mean = torch.empty_like(logps), torch.empty_like(logps), torch.empty_like(logps)
        correct = torch.empty(n, dtype=torch.bool, device=hidden.device)
        dtype = None
        for i in range(0, n, rows):
            # autocast casts as it does for lm_head(hidden)
            logits = F.linear(hidden[i : i + rows], weight, bias)
            dtype = logits.dtype
            lp, ls, (e, m, c) = block_logps(logits, targets[i : i + rows], temperature)
            (
                logps[i : i + rows],
                lse[i : i + rows],
                entropy[i : i + rows],
                mean[i : i + rows],
                correct[i : i + rows],
            ) = lp, ls, e, m, c
            del logits
        ctx.save_for_backward(hidden, weight, bias, targets, lse)
        ctx.temperature, ctx.rows = temperature, rows
        ctx.dtype = dtype or (
            torch.get_autocast_dtype(hidden.device.type)
            if torch.is_autocast_enabled(hidden.device.type)
            else hidden.dtype
        )
        ctx.mark_non_differentiable(entropy, mean, correct)
        return logps, entropy, mean, correct

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor | None, *_: Any) -> tuple[torch.Tensor | None, ...]:
        hidden, weight, bias, targets, lse = ctx.saved_tensors
        need_hidden, need_weight, need_bias = ctx.needs_input_grad[:3]
        dtype, rows, n = ctx.dtype, ctx.rows, hidden.shape[0]
        w = weight.to(dtype)
        b = bias.to(dtype) if bias is not None else None
        grad_hidden = torch.empty_like(hidden) if need_hidden else None
        grad_weight = (
            torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_weight else None
        )
        grad_bias = torch.zeros(bias.shape, dtype=torch.float32, device=bias.device) if need_bias else None
        if grad is None:
            grad = lse.new_zeros(n)
        for i in range(0, n, rows):
            h = hidden[i : i + rows].to(dtype)
            logits = F.linear(h, w, b)  # recomputed: the forward kept none
            g = block_grad(
                logits, targets[i : i + rows], lse[i : i + rows], grad[i : i + rows], ctx.temperature
            ).to(dtype)
            del logits
            if grad_hidden is not None:
                grad_hidden[i : i + rows] = (g @ w).to(hidden.dtype)
            if grad_weight is not None:
                _accumulate(grad_weight, g.t(), h)
            if grad_bias is not None:
                grad_bias.add_(g.sum(0, dtype=torch.float32))
        return (
            grad_hidden,
            grad_weight.to(weight.dtype) if grad_weight is not None else None,
            grad_bias.to(bias.dtype) if grad_bias is not None else None,
            None,
            None,
            None,
        )


def completion_logps(
    hidden: torch.Tensor,
    lm_head: nn.Module,
    targets: torch.Tensor,
    chunk_elements: int | None = None,
    temperature: float = 1.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Log-prob of `targets[i]` given `hidden[i]` (N, H): `lm_head` (a plain nn.Linear) applied only to
    the N positions that score a completion token (prompt logits are never used), through `HeadLogps`.
    With `temperature` (GRPO scores at its sampling temperature) the logits are divided by it first,
    and the stats are those of the scaled distribution (TRL's entropy).

    Returns (logps (N,), stats) where stats are TRL's per-token metric inputs, without gradient:
    `entropy`, `mean_logit` (the vocabulary-mean logit) and `correct` (argmax == target).
    `chunk_elements`: logits elements per chunk (default: ablate.losses.logps.LOGITS_CHUNK_ELEMENTS for
    the device)."""
    rows = chunk_rows(lm_head.weight.shape[0], hidden.device, chunk_elements)
    logps, *stats = HeadLogps.apply(hidden, lm_head.weight, lm_head.bias, targets, temperature, rows)
    return logps, dict(zip(STATS, stats))
