"""The `exact` section of benchmarks/gpu.py: each speed path against the plain path on the device, float32.

TF32 off (torch's new API: ablate.models.precision), one model shape (hidden 256 x 4 layers, vocab 49152 on
a GPU: the head's chunks, the packed FlexAttention kernel, the lean and Liger kernels all run), built
from one seed for every variant:
- DPO: one batch of 4 pairs of different lengths through `DPOTrainer._sequence_logps`, per-sequence
  log-probs and the gradient of a weighted sum of them, each path alone (speed.unverified_devices=true),
  Liger (CUDA), torch.compile (`--compile` on a CPU: minutes there), against speed=off;
- GRPO: one batch of 3 groups of 3 completions through `GRPOTrainer._token_logps` (grpo_group_rows alone:
  its 4-D mask; with padding_free and completion_only_logits: packed, the head split off; length_groups),
  per-token log-probs and the gradient;
- shared_prefill: the completions SharedPromptGenerator samples against model.generate's, same seed.

A path is exact when its log-probs are within EXACT_ATOL (1e-4) of the plain path's (scaled by the
largest, at least 1) and every gradient within 1e-4 of the largest entry of its tensor
(ablate.speed.measured). Also measured: the device's bf16 and fp32 matmul peak (ablate's probe).
"""

from __future__ import annotations

import gc
from types import SimpleNamespace
from typing import Any

import torch

from gpu_sides import build, pairs, perf_of

DPO_EXACT = ("dpo_pair_rows", "padding_free", "completion_only_logits", "lean_layers")


def _grads(model: Any) -> dict[str, torch.Tensor]:
    out = {n: p.grad.detach().float().clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return out


def _compare(ref: tuple[torch.Tensor, dict], got: tuple[torch.Tensor, dict]) -> dict[str, Any]:
    from ablate.speed.measured import EXACT_ATOL

    (lp_ref, g_ref), (lp, g) = ref, got
    logps = float((lp.float() - lp_ref.float()).abs().max())
    scale = max(1.0, float(lp_ref.abs().max()))
    grad = max(
        (
            float((g[n] - g_ref[n]).abs().max()) / max(float(g_ref[n].abs().max()), 1e-12)
            for n in g_ref
            if n in g
        ),
        default=float("inf"),
    )
    same = set(g) == set(g_ref)
    return {
        "exact": bool(same and logps <= EXACT_ATOL * scale and grad <= EXACT_ATOL),
        "max_abs_diff": logps,
        "grad_rel_diff": grad if same else None,
    }


def _dpo(cfg: dict[str, Any], spec: Any) -> tuple[torch.Tensor, dict]:
    from datasets import Dataset

    from ablate.methods.dpo import DPOConfig, DPOTrainer

    tok, model = build(cfg["exact_shape"], cfg["device"])
    rows = pairs(4, cfg["exact_side"], seed=1)
    args = DPOConfig(
        output_dir="/tmp/ablate-gpu-exact",
        per_device_train_batch_size=4,
        report_to="none",
        use_cpu=cfg["device"] == "cpu",
        max_length=4 * cfg["exact_side"],
        disable_tqdm=True,
    )
    trainer = DPOTrainer(
        model=model,
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=tok,
        perf=perf_of(spec),
    )
    batch = trainer._prepare_inputs(trainer.data_collator([trainer.train_dataset[i] for i in range(4)]))
    model.train()
    logps, _ = trainer._sequence_logps(model, batch)
    (logps * torch.arange(1.0, len(logps) + 1, device=logps.device)).sum().backward()
    return logps.detach(), _grads(model)


def _grpo_batch(tok: Any, device: str) -> dict[str, torch.Tensor]:
    from ablate.rollouts.generation import left_pad, right_pad

    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(3, 200, (n,), generator=g).tolist() for n in (12, 40, 3)]
    completions = [
        torch.randint(3, 200, (int(n),), generator=g).tolist()
        for n in torch.randint(1, 30, (9,), generator=g)
    ]
    p_ids, p_mask = left_pad([p for p in prompts for _ in range(3)], tok.pad_token_id)
    c_ids, c_mask = right_pad(completions, tok.pad_token_id)
    return {
        k: v.to(device)
        for k, v in {
            "prompt_ids": p_ids,
            "prompt_mask": p_mask,
            "completion_ids": c_ids,
            "completion_mask": c_mask,
        }.items()
    }


def _grpo(cfg: dict[str, Any], spec: Any) -> tuple[torch.Tensor, dict]:
    from datasets import Dataset

    from ablate.methods.grpo import GRPOConfig, GRPOTrainer

    tok, model = build(cfg["exact_shape"], cfg["device"])
    args = GRPOConfig(
        output_dir="/tmp/ablate-gpu-exact",
        per_device_train_batch_size=9,
        num_generations=3,
        max_completion_length=32,
        temperature=0.7,
        report_to="none",
        use_cpu=cfg["device"] == "cpu",
    )
    trainer = GRPOTrainer(
        model=model,
        args=args,
        train_dataset=Dataset.from_dict({"prompt": ["ab"] * 3}),
        processing_class=tok,
        reward_funcs={"zero": lambda completions, **_: [0.0] * len(completions)},
        perf=perf_of(spec),
    )
    batch = _grpo_batch(tok, cfg["device"])
    mask = batch["completion_mask"]
    model.train()
    logps, _ = trainer._token_logps(model, batch)
    (
        logps * mask * torch.linspace(0.5, 1.5, mask.numel(), device=mask.device).view(mask.shape)
    ).sum().backward()
    return (logps * mask).detach(), _grads(model)


def _generation(cfg: dict[str, Any]) -> dict[str, Any]:
    """shared_prefill: the same completions as model.generate at one seed (sampled, temperature 1)."""
    from ablate.rollouts.generation import HFGenerator, SharedPromptGenerator

    tok, model = build(cfg["exact_shape"], cfg["device"])
    args = SimpleNamespace(temperature=1.0, top_p=1.0, top_k=0, max_completion_length=cfg["exact_new_tokens"])
    g = torch.Generator().manual_seed(3)
    prompts = [
        p for p in (torch.randint(3, 200, (n,), generator=g).tolist() for n in (10, 25)) for _ in range(4)
    ]
    out = []
    for gen in (HFGenerator(args, tok), SharedPromptGenerator(args, tok)):
        torch.manual_seed(0)
        out.append(gen(model, prompts))
    same = sum(a == b for a, b in zip(*out))
    return {
        "exact": same == len(prompts),
        "max_abs_diff": None,
        "identical_completions": f"{same}/{len(prompts)}",
    }


def exact(cfg: dict[str, Any]) -> dict[str, Any]:
    from ablate.speed import throughput

    device = cfg["device"]
    if hasattr(torch.backends.cuda.matmul, "fp32_precision"):
        torch.backends.cuda.matmul.fp32_precision = "ieee"  # float32 means float32 here (TF32 off)
        torch.backends.cudnn.conv.fp32_precision = "ieee"
    out: dict[str, Any] = {
        "peak_bf16": throughput.peak_flops(device, torch.bfloat16),
        "peak_fp32": throughput.peak_flops(device, torch.float32),
        "paths": {},
    }
    checks: dict[str, tuple[Any, Any]] = {p: (_dpo, p) for p in DPO_EXACT}
    checks |= {
        "grpo_group_rows": (_grpo, "grpo_group_rows"),
        "length_groups": (_grpo, "length_groups"),
        "grpo_packed": (
            _grpo,
            {
                "grpo_group_rows": True,
                "padding_free": True,
                "completion_only_logits": True,
                "length_groups": False,
                "shared_prefill": False,
                "lean_layers": False,
                "unverified_devices": True,
            },
        ),
    }
    if device == "cuda":
        checks["liger"] = (
            _dpo,
            {
                "liger": True,
                "lean_layers": False,
                "dpo_pair_rows": False,
                "padding_free": False,
                "completion_only_logits": False,
                "unverified_devices": True,
            },
        )
    if device == "cuda" or cfg.get("compile"):
        checks["compile"] = (
            _dpo,
            {
                "compile": True,
                "lean_layers": False,
                "dpo_pair_rows": False,
                "padding_free": False,
                "completion_only_logits": False,
                "unverified_devices": True,
            },
        )
    plain = {_dpo: _dpo(cfg, "off"), _grpo: _grpo(cfg, "off")}
    for name, (fn, spec) in checks.items():
        try:
            out["paths"][name] = _compare(plain[fn], fn(cfg, spec))
        except Exception as e:  # noqa: BLE001 - a path that cannot run here is reported, not fatal
            out["paths"][name] = {
                "exact": False,
                "max_abs_diff": None,
                "error": f"{type(e).__name__}: {e}"[:300],
            }
        gc.collect()
    try:
        out["paths"]["shared_prefill"] = _generation(cfg)
    except Exception as e:  # noqa: BLE001
        out["paths"]["shared_prefill"] = {
            "exact": False,
            "max_abs_diff": None,
            "error": f"{type(e).__name__}: {e}"[:300],
        }
    return out
