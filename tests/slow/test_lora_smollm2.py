"""LoRA on the real SmolLM2-135M-Instruct (`model=smollm2_135m +peft=lora`): a short DPO run through the
CLI trains only the adapter, and the step-0 LoRA DPO loss on its BPE tokenizer equals TRL 1.16's
DPOTrainer given the same peft LoraConfig. Needs the converted model (`ablate fetch smollm2_135m`)."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import ablate, metrics, summary
from datasets import Dataset
from safetensors.torch import load_file

pytestmark = pytest.mark.slow
ENV = {"OMP_NUM_THREADS": "1"}


def test_lora_dpo_on_smollm2_through_the_cli(tmp_path, smollm2):
    r = ablate(
        "train",
        "model=smollm2_135m",
        "+peft=lora",
        "method.args.precompute_ref_log_probs=false",
        "method.args.max_steps=8",
        "method.args.per_device_train_batch_size=4",
        "method.args.logging_steps=2",
        "optimizer.optimizer.lr=5e-4",
        cwd=tmp_path,
        env=ENV,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    (run,) = list((tmp_path / "outputs" / "runs").glob("*/*"))
    assert summary(run)["status"] == "completed"
    losses = [e["loss"] for e in metrics(run) if "loss" in e]
    assert losses[-1] < losses[0], losses
    weights = load_file(run / "model" / "adapter_model.safetensors")
    assert all("lora_" in k for k in weights)
    n_adapter = sum(v.numel() for v in weights.values())
    n_base = sum(p.numel() for p in smollm2[1].parameters())
    assert n_adapter < 0.1 * n_base, (n_adapter, n_base)  # r=16 on every linear: ~3% of 135M
    assert (run / "model" / "tokenizer.json").is_file() and not (run / "model" / "model.safetensors").exists()


def test_lora_dpo_step0_matches_trl_on_smollm2(tmp_path, smollm2):
    trl = pytest.importorskip("trl")
    from ablate.methods.dpo import DPOConfig, DPOTrainer
    from ablate.models.adapters import lora, with_adapters

    tok, model = smollm2
    rows = [
        {"prompt": "Name a primary colour.", "chosen": " Red.", "rejected": " Banana bread, probably."},
        {"prompt": "What is 2+3?", "chosen": " 5", "rejected": " It is 23."},
    ]
    ds = Dataset.from_list(rows)
    adapters = lora(r=8, lora_alpha=16, lora_dropout=0.0)  # dropout 0: TRL disables dropout by default
    common = dict(per_device_train_batch_size=2, report_to="none", beta=0.1, use_cpu=True, bf16=False)
    theirs = trl.DPOTrainer(
        model=copy.deepcopy(model),
        peft_config=adapters.config,
        train_dataset=ds,
        args=trl.DPOConfig(output_dir=str(tmp_path / "trl"), **common),
        processing_class=tok,
    )
    with torch.no_grad():
        g = torch.Generator().manual_seed(0)
        for name, p in theirs.model.named_parameters():
            if "lora_B" in name:
                p.copy_(0.02 * torch.randn(p.shape, generator=g))
    ours = DPOTrainer(
        model=with_adapters(copy.deepcopy(model), adapters),
        train_dataset=ds,
        processing_class=tok,
        args=DPOConfig(output_dir=str(tmp_path / "ours"), precompute_ref_log_probs=False, **common),
    )
    ours.model.load_state_dict(theirs.model.state_dict())
    b_theirs, b_ours = next(iter(theirs.get_train_dataloader())), next(iter(ours.get_train_dataloader()))
    for key in ("input_ids", "completion_mask"):
        assert torch.equal(b_theirs[key], b_ours[key]), key
    theirs.model.train(), ours.model.train()
    loss_theirs = theirs.compute_loss(theirs.model, b_theirs)
    loss_ours = ours.compute_loss(ours.model, b_ours)
    assert abs(loss_theirs.item() - 0.6931) > 1e-3
    torch.testing.assert_close(loss_ours, loss_theirs, rtol=1e-4, atol=1e-5)
