"""Memory-lean RMSNorm and gated-SiLU MLP: the same numbers, fewer tensors saved for backward.

Most of a training step's memory is activations that autograd saves for backward. transformers'
RMSNorm (Llama, Mistral, Qwen2, Qwen3: the same code) is a chain of small ops, each of which saves
its inputs: in float32 that is the input, `input * rstd` and the per-row rstd, and the output
`weight * normed` is a further tensor. The gated MLP `down_proj(silu(gate_proj(x)) * up_proj(x))`
saves gate (for silu), silu(gate) and up (for the product), and the product (for down_proj).

Following Liger Kernel (Hsu et al. 2024, "Liger Kernel: Efficient Triton Kernels for LLM Training",
`LigerRMSNormFunction` / `LigerSiLUMulFunction`), the two `torch.autograd.Function`s here save only
what backward needs and recompute the cheap elementwise parts there: RMSNorm saves its input and the
per-row rstd (1/rms), not the normalized tensor; SiLU-mul saves gate and up, not silu(gate). Per
token and layer that is one hidden-size tensor per norm (two per layer) and one intermediate-size
tensor less. Unlike Liger this is plain PyTorch (CPU and GPU, no Triton), and the forward runs the
very ops of the eager modules, so outputs are bitwise equal; gradients are computed by the same
formulas autograd uses (equal to float rounding, usually bitwise).

`make_lean` swaps the forward of those modules per instance, only for the model families listed in
`ablate.speed.split.PLAIN_HEAD_MODELS` (whose RMSNorm and MLP code is known, and pinned in
tests/unit/test_model_internals.py): a wrong guess about another family's modules would be silently
wrong numbers. The trainers' speed plan applies it (`speed.lean_layers`, ablate.speed.plan.apply).
Parameters, state_dict and saving are untouched, and the projections are still called as modules, so
LoRA layers on them keep working.
"""

from __future__ import annotations

import logging
import types
from typing import Any

import torch
from torch import nn

from ablate.speed.split import PLAIN_HEAD_MODELS, causal_lm

log = logging.getLogger("ablate")

# the RMSNorm and gated-MLP classes of the families in PLAIN_HEAD_MODELS (transformers 5.24: same code)
RMS_NORMS = frozenset({"LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm"})
GATED_MLPS = frozenset({"LlamaMLP", "MistralMLP", "Qwen2MLP", "Qwen3MLP"})


class RMSNormFunction(torch.autograd.Function):
    """`weight * (x * rsqrt(mean(x^2) + eps))` saving only x (in its own dtype) and the per-row rstd.

    Forward is LlamaRMSNorm.forward op for op (float32 statistics, cast back to the input dtype before
    the weight), so its output is bitwise equal. Backward, in float32, with h = x.float(), N the
    hidden size, r = rsqrt(mean(h^2) + eps) per row, n = (h * r).to(x.dtype) and y = w * n:

        dL/dw = sum over rows of g * n                            (g = dL/dy)
        dL/dh = gn * r + h * (2 / N) * dL/dv,  gn = (g * w).to(x.dtype).float()
        dL/dv = -0.5 * r^3 * sum_j(gn_j * h_j),  v = mean(h^2)

    because dr/dv = -0.5 * (v + eps)^(-3/2) = -0.5 * r^3 and dv/dh_j = 2 * h_j / N; written out,
    dL/dh = r * (gn - h * r^2 * mean(gn * h)), the usual RMSNorm gradient. The ops (and their order)
    are the ones autograd runs for the eager module, so the gradients match it to float rounding.
    """

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        input_dtype = x.dtype
        h = x.to(torch.float32)
        variance = h.pow(2).mean(-1, keepdim=True)
        rstd = torch.rsqrt(variance + eps)
        out = weight * (h * rstd).to(input_dtype)
        ctx.save_for_backward(x, rstd, weight)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None, None]:
        x, rstd, weight = ctx.saved_tensors
        h = x.to(torch.float32)
        normed = (h * rstd).to(x.dtype)  # recomputed: this is the tensor eager saves and we do not
        grad_w = None
        if ctx.needs_input_grad[1]:
            grad_w = (grad * normed).sum(tuple(range(grad.dim() - 1))).to(weight.dtype)
        if not ctx.needs_input_grad[0]:
            return None, grad_w, None
        gn = (grad * weight).to(x.dtype).to(torch.float32)  # d/d(normed), through its cast back to float32
        grad_r = (gn * h).sum(-1, keepdim=True)
        grad_v = -0.5 * grad_r * rstd.pow(3)  # rsqrt's derivative; `+ eps` passes it through
        grad_h = gn * rstd + (grad_v.expand_as(h) / h.shape[-1]) * (2.0 * h)  # mean, then pow(2)
        return grad_h.to(x.dtype), grad_w, None


class SiluMulFunction(torch.autograd.Function):
    """`silu(gate) * up` saving gate and up only; silu(gate) is recomputed in backward.

    Forward runs the eager ops (`F.silu`, then the product; under autocast they see the same dtypes),
    so it is bitwise equal. Backward is what autograd computes for `silu(gate) * up`:
    d/d(up) = g * silu(gate) and d/d(gate) = silu_backward(g * up, gate).
    """

    @staticmethod
    def forward(ctx: Any, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(gate, up)
        return nn.functional.silu(gate) * up

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        gate, up = ctx.saved_tensors
        grad_gate = torch.ops.aten.silu_backward(grad * up, gate) if ctx.needs_input_grad[0] else None
        grad_up = grad * nn.functional.silu(gate) if ctx.needs_input_grad[1] else None
        return grad_gate, grad_up


class SiluMulLinearFunction(torch.autograd.Function):
    """`linear(silu(gate) * up, weight)` (the MLP's down projection fused in) saving gate and up only:
    the product, which `down_proj` as a module saves as its input (one intermediate-size tensor per
    token and layer, the largest saved in the MLP), is recomputed in backward.

    Forward runs the eager ops (autocast, when on, casts the linear's operands as it does for the
    module), so it is bitwise equal. Backward computes what autograd does for `F.linear(h, w)` with
    h = silu(gate) * up: dL/dw = g^T h and dL/dh = g w, with the operands in the dtype the forward's
    matmul ran in (its output's: autocast's cast of h and w), each result cast back as autocast's
    casts do in backward, then SiluMulFunction's backward for h. A bias-free nn.Linear only
    (Llama/Mistral/Qwen2/3's down_proj)."""

    @staticmethod
    def forward(ctx: Any, gate: torch.Tensor, up: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(gate, up, weight)
        return nn.functional.linear(nn.functional.silu(gate) * up, weight)

    @staticmethod
    def backward(
        ctx: Any, grad: torch.Tensor
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
        gate, up, weight = ctx.saved_tensors
        h = nn.functional.silu(gate) * up  # recomputed: the tensor down_proj would have saved
        dtype = grad.dtype  # the forward matmul's dtype (its output's): autocast's, or the inputs'
        grad_w = None
        if ctx.needs_input_grad[2]:
            grad_w = (
                grad.reshape(-1, grad.shape[-1]).t().mm(h.reshape(-1, h.shape[-1]).to(dtype)).to(weight.dtype)
            )
        if not (ctx.needs_input_grad[0] or ctx.needs_input_grad[1]):
            return None, None, grad_w
        grad_h = grad.matmul(weight.to(dtype)).to(h.dtype)
        grad_gate = torch.ops.aten.silu_backward(grad_h * up, gate) if ctx.needs_input_grad[0] else None
        grad_up = grad_h * nn.functional.silu(gate) if ctx.needs_input_grad[1] else None
        return grad_gate, grad_up, grad_w


def _lean_rms_norm_forward(self: nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    return RMSNormFunction.apply(hidden_states, self.weight, self.variance_epsilon)


def _lean_mlp_forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    # the projections stay module calls, so LoRA (or quantized) layers on them keep working; a plain
    # bias-free down_proj is fused into the product (its input is then not saved for backward)
    gate, up = self.gate_proj(x), self.up_proj(x)
    down = self.down_proj
    if type(down) is nn.Linear and down.bias is None:
        return SiluMulLinearFunction.apply(gate, up, down.weight)
    return down(SiluMulFunction.apply(gate, up))


def make_lean(model: nn.Module) -> int:
    """Give every RMSNorm and gated-SiLU MLP of a supported causal LM (peft-wrapped or not) the lean
    forward, per instance; returns how many modules changed (0, and nothing changed, for any other
    model family, or an MLP whose activation is not silu)."""
    lm = causal_lm(model)
    config = getattr(lm, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in PLAIN_HEAD_MODELS:
        log.info(
            "lean layers: not applied (model_type %s is not one of %s)", model_type, sorted(PLAIN_HEAD_MODELS)
        )
        return 0
    silu = getattr(config, "hidden_act", None) == "silu"
    norms = mlps = 0
    for module in lm.modules():
        name = type(module).__name__
        if name in RMS_NORMS:
            module.forward = types.MethodType(_lean_rms_norm_forward, module)
            norms += 1
        elif name in GATED_MLPS and silu:
            module.forward = types.MethodType(_lean_mlp_forward, module)
            mlps += 1
    log.info(
        "lean layers (%s): %d RMSNorm and %d SiLU-MLP modules save less for backward", model_type, norms, mlps
    )
    return norms + mlps


def use_liger(model: nn.Module) -> int:
    """`speed.liger`: Liger Kernel's Triton RMSNorm and SwiGLU MLP forwards (Hsu et al. 2024) on every such
    module of this model instance, as make_lean patches its own (Liger's own `apply_liger_kernel_to_*`
    would also replace the classes module-wide, and RoPE for every model in the process). CUDA only;
    ablate.schema.speed.SpeedSwitches refuses it elsewhere. Returns how many modules changed."""
    from liger_kernel.transformers.monkey_patch import _patch_rms_norm_module, _patch_swiglu_module
    from liger_kernel.transformers.swiglu import LigerSwiGLUMLP

    lm = causal_lm(model)
    silu = getattr(getattr(lm, "config", None), "hidden_act", None) == "silu"
    changed = 0
    for module in lm.modules():
        name = type(module).__name__
        if name in RMS_NORMS:
            _patch_rms_norm_module(module, eps=module.variance_epsilon, in_place=False)
            changed += 1
        elif name in GATED_MLPS and silu:
            _patch_swiglu_module(module, LigerSwiGLUMLP)
            changed += 1
    log.info("liger: %d RMSNorm and SwiGLU modules run Liger's kernels", changed)
    return changed


def compile_layers(model: nn.Module) -> int:
    """`speed.compile`: each decoder layer compiled by torch.compile (regional compilation: the repeated
    block is compiled once and reused, so the first step waits seconds rather than minutes; the loss, the
    head and the layouts stay eager Python). Shapes that change from batch to batch (packed rows) are
    recompiled once as dynamic. Returns how many layers were compiled."""
    lm = causal_lm(model)
    backbone = getattr(lm, getattr(lm, "base_model_prefix", ""), None)
    layers = list(getattr(backbone, "layers", None) or [])
    for layer in layers:
        layer.compile()
    log.info("compile: %d decoder layers compiled by torch.compile", len(layers))
    return len(layers)
