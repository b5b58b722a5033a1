"""LoRA adapters (`+peft=lora`): the reference is the same model with its adapters off, and training
moves only the adapters.

The adapters are set to nonzero values before the trainers score anything, so "adapters off" and
"adapters on" give different log-probs: a reference that forgot to disable them would fail here.
"""

from __future__ import annotations

import copy

import pytest
import torch
from datasets import Dataset

from ablate.losses.logps import sequence_logps, token_logps
from ablate.methods.dpo import DPOConfig, DPOTrainer
from ablate.methods.grpo import GRPOConfig, GRPOTrainer
from ablate.models import tiny
from ablate.models.adapters import is_adapted, lora, with_adapters

ROWS = [
    {"prompt": "sort: cba =", "chosen": " abc", "rejected": " bac"},
    {"prompt": "sort: hgfe =", "chosen": " efgh", "rejected": " hgef"},
    {"prompt": "sort: dc =", "chosen": " cd", "rejected": " dc"},
]


def _adapted(seed: int = 1):
    """(tokenizer, base model, LoRA-wrapped copy with nonzero adapters)."""
    tok, base = tiny()
    torch.manual_seed(seed)
    model = with_adapters(copy.deepcopy(base), lora(r=4, lora_alpha=8, lora_dropout=0.0))
    with torch.no_grad():
        g = torch.Generator().manual_seed(seed)
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
    return tok, base.eval(), model


def _base_logps(base, batch) -> torch.Tensor:
    with torch.no_grad():
        logits = base(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    return sequence_logps(token_logps(logits, batch["input_ids"]), batch["completion_mask"][:, 1:])


def test_with_adapters_freezes_the_base():
    _, _, model = _adapted()
    assert is_adapted(model)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    assert with_adapters(model.base_model.model, None) is model.base_model.model  # no peft config: unchanged


def test_lora_fields_from_the_command_line():
    """Hydra passes lists as ListConfig; other LoraConfig fields pass through; a typo is a ConfigError."""
    from omegaconf import OmegaConf

    from ablate.errors import ConfigError

    a = lora(target_modules=OmegaConf.create(["q_proj", "v_proj"]), layers_to_transform=OmegaConf.create([1]))
    assert a.config.target_modules == {"q_proj", "v_proj"} and a.config.layers_to_transform == [1]
    model = with_adapters(tiny()[1], a)
    trainable = {
        n.split(".lora_")[0].removeprefix("base_model.model.model.")
        for n, p in model.named_parameters()
        if p.requires_grad
    }
    assert trainable == {"layers.1.self_attn.q_proj", "layers.1.self_attn.v_proj"}
    with pytest.raises(ConfigError, match="rr"):
        lora(rr=4)


@pytest.mark.parametrize("precompute", [False, True])
def test_dpo_reference_is_the_model_with_adapters_off(tmp_path, precompute):
    tok, base, model = _adapted()
    args = DPOConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=3,
        per_device_eval_batch_size=3,
        report_to="none",
        use_cpu=True,
        precompute_ref_log_probs=precompute,
    )
    trainer = DPOTrainer(model=model, args=args, train_dataset=Dataset.from_list(ROWS), processing_class=tok)
    assert trainer.ref_model is None  # no second copy of the model
    batch = next(iter(trainer.get_train_dataloader()))
    assert ("ref_chosen_logps" in batch) == precompute
    expected = _base_logps(base, batch)
    if precompute:
        got = torch.cat([batch["ref_chosen_logps"], batch["ref_rejected_logps"]])
    else:
        got = trainer._reference_logps(trainer.model, batch)
    torch.testing.assert_close(got, expected)
    trainer.model.train()
    policy = trainer._sequence_logps(trainer.model, batch)[0]
    assert not torch.allclose(policy, expected)  # the adapters are on for the policy
    assert trainer.model.training  # scoring the reference left train mode as it was


def test_dpo_with_lora_changes_only_the_adapters(tmp_path):
    tok, base, model = _adapted()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    args = DPOConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=3,
        report_to="none",
        use_cpu=True,
        max_steps=3,
        learning_rate=1e-2,
        save_strategy="no",
        logging_steps=1,
    )
    trainer = DPOTrainer(model=model, args=args, train_dataset=Dataset.from_list(ROWS), processing_class=tok)
    trainer.train()
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert changed and all("lora_" in n for n in changed), changed
    assert any("lora_A" in n for n in changed) and any("lora_B" in n for n in changed)


def test_grpo_kl_reference_is_the_model_with_adapters_off(tmp_path):
    tok, base, model = _adapted()
    args = GRPOConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=4,
        beta=0.1,
        report_to="none",
        use_cpu=True,
    )
    rows = Dataset.from_list([{"prompt": "repeat a:"}, {"prompt": "repeat b:"}])
    trainer = GRPOTrainer(
        model=model,
        args=args,
        train_dataset=rows,
        processing_class=tok,
        reward_funcs={"len": lambda completions, **_: [float(len(c)) for c in completions]},
    )
    assert trainer.ref_model is None
    trainer.model.train()
    batch = trainer._generate_and_score([trainer.train_dataset[i] for i in (0, 0, 1, 1)], "train")
    assert trainer.model.training
    # the base model's log-probs by the plain path (TRL's layout): `base` is a copy the speed plan never
    # touched, and the reference (adapters off) is scored by the plan's layouts, exact to float rounding
    expected, _ = GRPOTrainer._rows_logps(trainer, base, batch.tokens())
    torch.testing.assert_close(batch.ref_logps, expected)
    with torch.no_grad():
        policy, _ = trainer._token_logps(trainer.model, batch.tokens())
    assert not torch.allclose(policy, expected)
