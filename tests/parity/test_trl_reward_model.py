"""A learned reward model as a GRPO reward (ablate.rewards.RewardModel) scores as TRL 1.16's GRPOTrainer scores
a reward model given by path: the same texts (the reward model's own tokenizer and chat template), the same
logits, for string and conversational prompts; and in batches, under no grad, equal to scoring all at once."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForSequenceClassification

trl = pytest.importorskip("trl")

from datasets import Dataset  # noqa: E402

from ablate.errors import ConfigError  # noqa: E402
from ablate.models import tiny  # noqa: E402
from ablate.models.tokenizer import byte_tokenizer  # noqa: E402
from ablate.rewards import RewardModel  # noqa: E402


def save_reward_model(path: Path, seed: int = 0, num_labels: int = 1) -> Path:
    """A tiny sequence-classification model (one label) and the byte tokenizer, saved as a user's RM would be."""
    tok = byte_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=256,
        pad_token_id=tok.pad_token_id,
        num_labels=num_labels,
    )
    torch.manual_seed(seed)
    LlamaForSequenceClassification(config).save_pretrained(path)
    tok.save_pretrained(path)
    return path


STRINGS = (["ab:", "cd:", "xyz:", "q:"], [" abab", " c", " zzzzzz", ""])
CHATS = (
    [[{"role": "user", "content": p}] for p in STRINGS[0]],
    [[{"role": "assistant", "content": c}] for c in STRINGS[1]],
)


@pytest.mark.parametrize("prompts,completions", [STRINGS, CHATS], ids=["strings", "conversations"])
def test_reward_model_scores_as_trl(tmp_path, prompts, completions):
    rm_dir = save_reward_model(tmp_path / "rm")
    tok, policy = tiny()
    args = trl.GRPOConfig(
        output_dir=str(tmp_path / "trl"),
        per_device_train_batch_size=4,
        num_generations=4,
        report_to="none",
        use_cpu=True,
        bf16=False,
    )
    theirs = trl.GRPOTrainer(
        model=policy,
        reward_funcs=[str(rm_dir)],
        train_dataset=Dataset.from_list([{"prompt": p} for p in prompts]),
        processing_class=tok,
        args=args,
    )
    expected = theirs._calculate_rewards([{"prompt": p} for p in prompts], prompts, completions, [[1]] * 4)[
        :, 0
    ]
    ours = RewardModel(str(rm_dir), batch_size=3).to("cpu")  # batches of 3: 4 rows in two batches
    got = torch.tensor(ours(prompts=prompts, completions=completions, completion_ids=[[1]] * 4))
    torch.testing.assert_close(got, expected.float(), rtol=0, atol=1e-5)
    assert got.unique().numel() == 4  # the fixture tells the rows apart
    assert not any(p.requires_grad for p in ours.model.parameters())


def test_a_run_dir_and_its_mistakes(tmp_path):
    run = tmp_path / "run"
    save_reward_model(run / "model")  # an `ablate train method=reward` run dir keeps its model in model/
    (run / "run.json").write_text("{}")
    assert RewardModel(str(run)).path == run / "model"
    assert RewardModel(str(run)).model is None  # weights load on first use, on the trainer's device
    with pytest.raises(ConfigError, match="does not exist"):
        RewardModel(str(tmp_path / "nope"))
    with pytest.raises(ConfigError, match="holds no model"):
        RewardModel(str(tmp_path))
    with pytest.raises(ConfigError, match="has 2 output labels; a reward model has one"):
        RewardModel(str(save_reward_model(tmp_path / "two", num_labels=2)))
    tok, policy = tiny()
    policy.save_pretrained(tmp_path / "lm")
    with pytest.raises(ConfigError, match="LlamaForCausalLM, not a sequence-classification model"):
        RewardModel(str(tmp_path / "lm"))
