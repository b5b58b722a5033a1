"""The GPU form of `padding_free` (ablate.speed.packing, issue 33): the packed row attends through
FlexAttention with a document block mask (`Documents`: each token's row and segment), so there is no
padding and no dense [T, T] mask. FlexAttention has no backward on a CPU, so here: its forward is
checked (no grad) against the padded batch, and training (gradients, optimizer steps) runs the same
mask evaluated densely ("dense": sdpa on the packed row), which shows the mask's meaning exact; the
flex kernel's backward is checked on CUDA by benchmarks/gpu.py. float32, tolerances as the other
speed-path tests (1e-5)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from datasets import Dataset

from ablate.methods.dpo import DPOTrainer
from ablate.models import tiny
from ablate.speed import packing
from ablate.speed.groups import shared_prompt_groups
from ablate.speed.packing import Documents, packed_inputs, use_packed_attention
from ablate.speed.pairs import mask_from_segments, plain_pairs, plain_targets, shared_prompt_pairs
from ablate.speed.plan import SpeedSwitches
from ablate.speed.split import lm_parts
from tiny_setups import dpo_config, moved, three_groups, three_groups_trainer

ROWS = [
    {"prompt": "sort: cba =", "chosen": " abc", "rejected": " bac"},
    {"prompt": "sort: hgfedcba =", "chosen": " abcdefgh", "rejected": " hg"},
    {"prompt": "s:", "chosen": " cd", "rejected": " dcxyzwvu"},
]


def _pairs(tok: Any) -> list[dict[str, list[int]]]:
    ids = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    return [
        {
            "prompt_ids": ids(r["prompt"]),
            "chosen_ids": ids(r["chosen"]) + [tok.eos_token_id],
            "rejected_ids": ids(r["rejected"]) + [tok.eos_token_id],
        }
        for r in ROWS
    ]


def test_the_document_mask_is_the_layouts_mask():
    """Packed, the shared pair layout's tokens attend exactly where its 4-D mask lets them (row by row,
    real tokens), and the mask rebuilt from segments and lengths is the collator's, padding included."""
    tok, _ = tiny()
    b = shared_prompt_pairs(_pairs(tok), tok.pad_token_id)
    assert torch.equal(mask_from_segments(b["segments"], b["lengths"]), b["attention_mask"])
    assert "attention_mask" not in shared_prompt_pairs(_pairs(tok), tok.pad_token_id, with_mask=False)
    width = b["input_ids"].shape[1]
    real = torch.arange(width)[None, :] < b["lengths"][:, None]
    index = real.flatten().nonzero().squeeze(1)
    dense = Documents(index // width, b["segments"].flatten()[index]).dense_mask()[0, 0]
    padded = b["attention_mask"][:, 0]
    row, col = index // width, index % width
    want = (row[:, None] == row[None, :]) & padded[row[:, None], col[:, None], col[None, :]]
    assert torch.equal(dense, want)


def _packed_backbone(kernel: str, layout: str, grad: bool) -> tuple[torch.Tensor, torch.Tensor, list, list]:
    """(padded hidden states at the scored positions, the packed kernel's, and both runs' gradients)."""
    tok, model = tiny()
    model = moved(model)
    rows = _pairs(tok)
    if layout == "plain":
        b = plain_pairs(rows, tok.pad_token_id)
        inputs, lengths, segments = (
            {"input_ids": b["input_ids"], "attention_mask": b["attention_mask"]},
            b["attention_mask"].sum(-1),
            None,
        )
        src = plain_targets(b["input_ids"], b["completion_mask"])["src"]
    else:
        b = shared_prompt_pairs(rows, tok.pad_token_id)
        inputs = {k: b[k] for k in ("input_ids", "position_ids", "attention_mask")}
        lengths, src, segments = b["lengths"], b["src"], b["segments"]
    backbone, _ = lm_parts(model)
    weight = torch.randn(len(src), 64, generator=torch.Generator().manual_seed(2))

    def run(src: torch.Tensor, **kw: Any) -> tuple[torch.Tensor, list]:
        model.zero_grad()
        with torch.set_grad_enabled(grad):
            hidden = backbone(**kw).last_hidden_state.flatten(0, 1)[src]
            if grad:
                (hidden * weight).sum().backward()
        return hidden.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]

    padded, padded_grads = run(src, **inputs)
    assert use_packed_attention(model)
    packed, packed_src = packed_inputs(inputs, src, lengths, segments, kernel=kernel)
    assert "unpad" not in packed and packed["input_ids"].shape == (1, int(lengths.sum()))
    hidden, grads = run(packed_src, **packed)
    return padded, hidden, padded_grads, grads


@pytest.mark.parametrize("layout", ["plain", "shared"])
def test_flex_forward_equals_padded(layout):
    """FlexAttention (eager here: the CPU has no fused kernel for it) on the packed row, block mask."""
    padded, flex, _, _ = _packed_backbone("flex", layout, grad=False)
    torch.testing.assert_close(flex, padded, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("layout", ["plain", "shared"])
def test_dense_document_mask_forward_and_gradients_equal_padded(layout):
    padded, dense, padded_grads, grads = _packed_backbone("dense", layout, grad=True)
    torch.testing.assert_close(dense, padded, rtol=1e-5, atol=1e-5)
    assert len(grads) == len(padded_grads) > 0
    for got, want in zip(grads, padded_grads):  # atol scales with the largest gradient (sums of many terms)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6 * max(10.0, want.abs().max().item()))


def _dpo(tmp_path: Any, name: str, perf: SpeedSwitches) -> tuple[DPOTrainer, list[dict]]:
    tok, model = tiny()
    args = dpo_config(tmp_path / name)
    trainer = DPOTrainer(
        model=moved(model),
        args=args,
        train_dataset=Dataset.from_list(ROWS * 2),
        processing_class=tok,
        perf=perf,
    )
    trainer.train()
    return trainer, [e for e in trainer.state.log_history if "loss" in e]


def test_dpo_steps_through_the_document_mask_equal_the_plain_path(tmp_path, monkeypatch):
    """Every default DPO path on, the packed row attending through the document mask (dense on a CPU):
    three optimizer steps with the plain path's losses and metrics; the collator built no 4-D mask."""
    _, plain = _dpo(tmp_path, "plain", SpeedSwitches.off())
    monkeypatch.setitem(packing.PACKED_KERNEL, "cpu", "dense")
    trainer, fast = _dpo(tmp_path, "fast", SpeedSwitches())
    assert trainer.speed_plan.on("padding_free") and not trainer.data_collator.with_mask
    assert len(fast) == len(plain) == 3
    for a, b in zip(fast, plain):
        for name in (
            "loss",
            "rewards/margins",
            "logps/chosen",
            "logps/rejected",
            "entropy",
            "logits/chosen",
            "mean_token_accuracy",
            "num_tokens",
        ):
            assert abs(a[name] - b[name]) <= 1e-5 * max(1.0, abs(b[name])), (
                a["step"],
                name,
                a[name],
                b[name],
            )


def test_grpo_group_segments():
    """Group rows [prompt | c_1 | c_2 | ...]: segment 0 on the prompt, k on the group's k-th completion."""
    tok, _ = tiny()
    b = three_groups(tok)
    g = shared_prompt_groups(
        b["prompt_ids"], b["prompt_mask"], b["completion_ids"], b["completion_mask"], tok.pad_token_id
    )
    first = g["segment"][0, : int(g["lengths"][0])].tolist()
    assert first == [0] * 4 + [1] * 3 + [2] * 1 + [3] * 5


@pytest.mark.parametrize("kernel", ["dense", "flex"])
def test_grpo_group_rows_through_the_document_mask_equal_row_per_completion(tmp_path, monkeypatch, kernel):
    """Log-probs and entropies of the packed group rows (each prompt once, its completions never seeing
    each other through `Documents`) equal TRL's layout; with "dense" the gradients too (flex: no grad)."""
    tok, model = tiny()
    model = moved(model)
    trainer = three_groups_trainer(tmp_path, tok, model)
    batch = three_groups(tok)
    mask = batch["completion_mask"]
    weight = torch.randn(mask.shape, generator=torch.Generator().manual_seed(3))

    def run() -> tuple[torch.Tensor, torch.Tensor, list]:
        model.zero_grad()
        with torch.set_grad_enabled(kernel == "dense"):
            logps, entropy = trainer._token_logps(model, batch, with_entropy=True)
            if kernel == "dense":
                (logps * mask * weight).sum().backward()
        return logps.detach(), entropy, [p.grad.clone() for p in model.parameters() if p.grad is not None]

    monkeypatch.setitem(packing.PACKED_KERNEL, "cpu", kernel)
    seen: list[Any] = []
    flex = packing.flex_packed
    monkeypatch.setattr(packing, "flex_packed", lambda *a, **k: seen.append(1) or flex(*a, **k))
    fast = run()
    assert bool(seen) == (kernel == "flex")
    trainer.speed_plan = trainer.speed_plan.turned_off("grpo_group_rows", "length_groups")
    plain = run()
    torch.testing.assert_close(fast[0] * mask, plain[0] * mask, rtol=0, atol=1e-5)
    torch.testing.assert_close(fast[1] * mask, plain[1] * mask, rtol=0, atol=1e-5)
    assert len(fast[2]) == len(plain[2])
    for got, want in zip(fast[2], plain[2]):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6 * max(10.0, want.abs().max().item()))
