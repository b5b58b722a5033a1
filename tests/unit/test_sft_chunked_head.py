"""SFT's `completion_only_logits` speed path (ablate.methods.sft `_scored`, ablate.speed.split.scored_logps):
the LM head projects only the positions that score a label, in chunks, so no [tokens, vocab] logits are
kept for the backward whatever the length; the loss, its token accuracy and every gradient equal the plain
path's (the model's own logits), with and without gradient accumulation's token count, fp32 and bf16."""

from __future__ import annotations

import pytest
import torch
from datasets import Dataset

from ablate.methods.sft import SFTConfig, SFTTrainer
from ablate.models import tiny
from ablate.speed.plan import SpeedSwitches

ROWS = [
    {"prompt": "sort: cba =", "completion": " abc"},
    {"prompt": "sort: hgfedcba =", "completion": " abcdefgh"},
    {"prompt": "sort: ba =", "completion": " ab"},
]


def _trainer(tmp_path, chunked: bool, bf16: bool) -> SFTTrainer:
    tok, model = tiny()
    args = SFTConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=3,
        report_to="none",
        save_strategy="no",
        use_cpu=True,
        bf16=bf16,
        disable_tqdm=True,
    )
    perf = SpeedSwitches(unverified_devices=True) if chunked else SpeedSwitches.off()
    return SFTTrainer(
        model=model, args=args, train_dataset=Dataset.from_list(ROWS), processing_class=tok, perf=perf
    )


def _step(trainer: SFTTrainer, items: int | None) -> tuple[float, float, dict, list]:
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(len(ROWS))])
    model = trainer.model.train()
    model.zero_grad()
    vocab = model.config.vocab_size
    saved: list[tuple[int, ...]] = []

    def pack(x: torch.Tensor) -> torch.Tensor:
        saved.append(tuple(x.shape))
        return x

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x), trainer.accelerator.autocast():
        loss = trainer.compute_loss(model, batch, num_items_in_batch=items)
    loss.backward()
    accuracy = trainer.metrics.pop("train")["mean_token_accuracy"]
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    return loss.item(), accuracy, grads, [s for s in saved if s and s[-1] == vocab and len(s) > 1]


@pytest.mark.parametrize("bf16", [False, True])
@pytest.mark.parametrize("items", [None, 40])
def test_the_chunked_head_equals_the_models_logits(tmp_path, bf16, items):
    chunked = _trainer(tmp_path / "chunked", True, bf16)
    assert chunked.speed_plan.on("completion_only_logits")
    plain = _trainer(tmp_path / "plain", False, bf16)
    assert not plain.speed_plan.on("completion_only_logits")
    loss, accuracy, grads, vocab_wide = _step(chunked, items)
    loss0, accuracy0, grads0, vocab_wide0 = _step(plain, items)
    tol = 1e-2 if bf16 else 1e-5
    assert loss == pytest.approx(loss0, rel=tol)
    assert accuracy == pytest.approx(accuracy0)
    for n, g in grads0.items():
        assert ((grads[n] - g).abs().max() / g.abs().max().clamp_min(1e-12)).item() < tol * 5, n
    assert vocab_wide0  # the plain path keeps the logits (and their log-softmax) for the backward
    assert vocab_wide == []  # the chunked head keeps no vocabulary-wide tensor
