"""Lean RMSNorm and SiLU-MLP (`ablate.speed.lean`) give the plain modules' numbers and save less.

Each model is built twice from the same config and weights, one made lean; inputs are a padded
batch (rows of different lengths). Forwards must be bitwise equal, every gradient (input and
weights) equal to 1e-5 of its largest element in float32: the lean backward sums in another order, and
how far that moves a sum depends on the CPU's kernels (measured worst, over the four architectures: 0.6e-6
with AVX512 kernels, 0.7e-6 AVX2, 1.4e-6 with ATEN_CPU_CAPABILITY=default; RMSNorm's eps 1e-5 for 1e-6
moves it 4e-3).
"""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from ablate.models import tiny
from ablate.models.adapters import lora, with_adapters
from ablate.speed.lean import RMSNormFunction, SiluMulFunction, SiluMulLinearFunction, make_lean
from ablate.speed.plan import SpeedSwitches, Setting, apply, resolve
from tiny_setups import moved

H, I, LAYERS, VOCAB = 64, 256, 2, 300
FP32_RTOL = 1e-5  # float32 rounding of a reordered sum, on any CPU's kernels (module docstring)


def _model(arch: str, **extra: object) -> torch.nn.Module:
    torch.manual_seed(0)
    common = dict(
        vocab_size=VOCAB,
        hidden_size=H,
        intermediate_size=I,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        **extra,
    )
    if arch == "llama":
        return moved(LlamaForCausalLM(LlamaConfig(**common)))
    if arch == "mistral":
        return moved(MistralForCausalLM(MistralConfig(**common)))
    if arch == "qwen3":
        return moved(Qwen3ForCausalLM(Qwen3Config(**common, head_dim=16, tie_word_embeddings=False)))
    return moved(Qwen2ForCausalLM(Qwen2Config(**common, tie_word_embeddings=False)))


def _pair(model: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Module]:
    lean = copy.deepcopy(model)
    qk_norms = (
        2 * LAYERS if model.config.model_type == "qwen3" else 0
    )  # Qwen3 normalizes q and k per head too
    assert make_lean(lean) == 3 * LAYERS + 1 + qk_norms  # two norms and an MLP per layer, the final norm
    return model, lean


def _batch() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(3, VOCAB, (3, 11), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0  # right padding
    mask[2, :4] = 0  # left padding
    return {"input_ids": ids, "attention_mask": mask}


def _run(
    model: torch.nn.Module, batch: dict[str, torch.Tensor], autocast: bool = False
) -> tuple[torch.Tensor, dict]:
    """Logits, and the gradients of every parameter and of the input embeddings, for a loss that
    weighs every logit differently."""
    embeds = model.get_input_embeddings()(batch["input_ids"]).detach().requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        logits = model(inputs_embeds=embeds, attention_mask=batch["attention_mask"]).logits
    w = torch.linspace(-1.0, 1.0, logits.numel()).view_as(logits)
    (logits.float() * w).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    grads["inputs_embeds"] = embeds.grad.clone()
    model.zero_grad()
    return logits.detach(), grads


def _assert_grads(lean: dict, plain: dict, rtol: float) -> None:
    assert lean.keys() == plain.keys() and len(plain) > 10
    for name, g in plain.items():
        assert g.abs().max() > 0, name
        torch.testing.assert_close(lean[name], g, rtol=rtol, atol=rtol * g.abs().max().item(), msg=name)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "mistral", "qwen3"])
def test_forward_bitwise_and_gradients_equal_fp32(arch):
    plain, lean = _pair(_model(arch))
    batch = _batch()
    out_p, g_p = _run(plain, batch)
    out_l, g_l = _run(lean, batch)
    assert torch.equal(out_l, out_p)
    _assert_grads(g_l, g_p, rtol=FP32_RTOL)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_forward_bitwise_and_gradients_close_under_bf16_autocast(arch):
    """Under CPU autocast the projections run in bf16, so gate/up (and the SiLU-mul) are bf16."""
    plain, lean = _pair(_model(arch))
    batch = _batch()
    out_p, g_p = _run(plain, batch, autocast=True)
    out_l, g_l = _run(lean, batch, autocast=True)
    assert out_p.dtype == torch.bfloat16 and torch.equal(out_l, out_p)
    _assert_grads(g_l, g_p, rtol=1e-2)  # bf16 has an 8-bit mantissa (~4e-3 relative per rounding)


@pytest.mark.parametrize(
    "x_dtype,w_dtype",
    [(torch.bfloat16, torch.float32), (torch.bfloat16, torch.bfloat16), (torch.float32, torch.float32)],
)
def test_functions_match_eager_ops_in_mixed_dtypes(x_dtype, w_dtype):
    """The Functions alone, against the eager expressions, where casts happen (bf16 input, fp32 or bf16
    weight): forward bitwise, gradients to the rounding of the input dtype."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 5, H, generator=g).to(x_dtype).requires_grad_(True)
    w = (1 + 0.1 * torch.randn(H, generator=g)).to(w_dtype).requires_grad_(True)
    grad = torch.randn(2, 5, H, generator=g)

    def eager(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:  # LlamaRMSNorm.forward
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        return w * h.to(x.dtype)

    outs, grads = [], []
    for fn in (eager, lambda x, w: RMSNormFunction.apply(x, w, 1e-6)):
        out = fn(x, w)
        out.backward(grad.to(out.dtype))
        outs.append(out.detach())
        grads.append((x.grad.clone(), w.grad.clone()))
        x.grad = w.grad = None
    assert outs[0].dtype == outs[1].dtype and torch.equal(outs[1], outs[0])
    tol = 1e-6 if x_dtype == torch.float32 else 1e-2
    for a, b in zip(grads[1], grads[0]):
        assert a.dtype == b.dtype
        torch.testing.assert_close(a, b, rtol=tol, atol=tol * b.abs().max().item())

    gate = torch.randn(4, I, generator=g).to(x_dtype).requires_grad_(True)
    up = torch.randn(4, I, generator=g).to(x_dtype).requires_grad_(True)
    gy = torch.randn(4, I, generator=g).to(x_dtype)
    eager_out = torch.nn.functional.silu(gate) * up
    eager_grads = torch.autograd.grad(eager_out, (gate, up), gy)
    lean_out = SiluMulFunction.apply(gate, up)
    lean_grads = torch.autograd.grad(lean_out, (gate, up), gy)
    assert torch.equal(lean_out, eager_out)
    for a, b in zip(lean_grads, eager_grads):
        assert torch.equal(a, b)  # the very ops autograd runs


def test_lora_on_the_mlp_projections_trains_the_same():
    """LoRA on gate/up/down of a lean model: the projections are still module calls, so the adapters
    get gradients, equal to the plain model's."""
    models = []
    for lean in (False, True):
        base = _model("llama")
        if lean:
            assert make_lean(base) == 3 * LAYERS + 1
        models.append(
            moved(
                with_adapters(
                    base,
                    lora(
                        r=4,
                        lora_alpha=8,
                        lora_dropout=0.0,
                        target_modules=["gate_proj", "up_proj", "down_proj"],
                    ),
                )
            )
        )
    batch = _batch()
    (out_p, g_p), (out_l, g_l) = (_run(m, batch) for m in models)
    assert torch.equal(out_l, out_p)
    assert sum("lora_" in n for n in g_p) == 2 * 3 * LAYERS  # A and B on three projections per layer
    _assert_grads(g_l, g_p, rtol=FP32_RTOL)
    again = copy.deepcopy(models[0])  # make_lean sees through the peft wrapper too
    assert make_lean(again) == 3 * LAYERS + 1
    assert torch.equal(_run(again, batch)[0], out_p)


def test_other_families_and_activations_are_left_alone():
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_embd=H, n_layer=LAYERS, n_head=4, n_positions=64))
    assert make_lean(gpt2) == 0
    assert not any("forward" in vars(m) for m in gpt2.modules())
    gelu = _model("llama", hidden_act="gelu")
    assert make_lean(gelu) == 2 * LAYERS + 1  # norms only: the lean MLP computes silu
    assert not any("forward" in vars(m) for m in gelu.model.layers[0].mlp.modules())
    # the model builders leave the modules as they are; the trainers' speed plan makes them lean
    assert "forward" not in vars(tiny()[1].model.norm)
    plain, lean = tiny()[1], tiny()[1]
    plan = resolve(
        "policy",
        Setting(model_type="llama", attention="sdpa"),
        SpeedSwitches(lean_layers=True),
        {"lean_layers": None},
    )
    apply(plain, plan.turned_off("lean_layers"))
    apply(lean, plan)
    assert "forward" not in vars(plain.model.norm) and "forward" in vars(lean.model.norm)


def _saved_bytes(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> int:
    """Bytes of the distinct activation storages autograd saves for backward during one forward
    (parameters, also saved, are held anyway)."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        if s.data_ptr() not in params:
            storages[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(**batch).logits.sum().backward()
    return sum(storages.values())


def test_lean_layers_save_less_for_backward():
    """By hand, per token and layer, in float32 (4 bytes), H = hidden (64), I = intermediate size (256):

    plain RMSNorm saves x (H, also the residual), rstd (1) and normed = x * rstd (H) (the output
    `weight * normed` is saved by the next projection either way); lean saves x and rstd: H fewer.
    plain MLP saves gate (I, for silu), silu(gate) (I) and up (I) (for the product), the product
    (I, for down_proj); lean (down_proj fused in) saves gate and up: 2I fewer. Two norms per layer
    and the final norm once: lean saves exactly 4 * (LAYERS * (2I + 2H) + H) bytes per token less.
    Attention saves about 6H more per layer (q/k/v input, q, k and v (GQA: H/2 each), output,
    o_proj input), so plain saves about 4H + 4I + 6H = 1664 floats per token per layer and lean
    2I + 2H = 640 fewer: 38% less. Asserted: at least 35% less.
    """
    plain, lean = _pair(_model("llama"))
    batch = _batch()
    tokens = batch["input_ids"].numel()  # padding positions are computed, and saved, like any other
    saved_plain, saved_lean = _saved_bytes(plain, batch), _saved_bytes(lean, batch)
    assert saved_plain - saved_lean == tokens * 4 * (LAYERS * (2 * I + 2 * H) + H)
    assert saved_lean <= 0.65 * saved_plain, (saved_lean, saved_plain)


@pytest.mark.parametrize(
    "autocast,x_dtype", [(False, torch.float32), (True, torch.float32), (False, torch.bfloat16)]
)
def test_silu_mul_linear_matches_eager_down_proj(autocast, x_dtype):
    """`SiluMulLinearFunction` against the eager `F.linear(silu(gate) * up, w)` with an fp32 weight:
    fp32, under bf16 autocast (the matmul in bf16, gradients cast back), and bf16 inputs. Forward and
    every gradient bitwise: the same ops, the same dtypes."""
    g = torch.Generator().manual_seed(4)
    gate = torch.randn(2, 3, I, generator=g).to(x_dtype).requires_grad_(True)
    up = torch.randn(2, 3, I, generator=g).to(x_dtype).requires_grad_(True)
    w = (0.1 * torch.randn(H, I, generator=g)).requires_grad_(True)
    results = []
    for fn in (
        lambda: torch.nn.functional.linear(
            torch.nn.functional.silu(gate) * up, w.to(gate.dtype) if not autocast else w
        ),
        lambda: SiluMulLinearFunction.apply(
            gate, up, w if autocast or x_dtype == torch.float32 else w.to(x_dtype)
        ),
    ):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            out = fn()
        grads = torch.autograd.grad(
            out,
            (gate, up, w),
            torch.randn(out.shape, generator=torch.Generator().manual_seed(5)).to(out.dtype),
        )
        results.append((out, grads))
    (out_e, grads_e), (out_l, grads_l) = results
    assert out_l.dtype == out_e.dtype == (torch.bfloat16 if autocast else x_dtype) and torch.equal(
        out_l, out_e
    )
    for a, b in zip(grads_l, grads_e):
        assert a.dtype == b.dtype and torch.equal(a, b)
