"""Parity with TRL 1.16's RewardTrainer: the same tokenised sequences and batches, and the same per-step
loss and metrics over two optimizer steps (|delta| <= 1e-5, fp32), with and without TRL's `margin`
column and `center_rewards_coefficient`; and TRL's own loading of a causal checkpoint for sequence
classification gives the model ablate's score head builds (same backbone, same head shape)."""

from __future__ import annotations

import copy

import pytest
import torch
from datasets import Dataset

trl = pytest.importorskip("trl")

from ablate.methods.reward import RewardConfig, RewardTrainer  # noqa: E402
from ablate.models import tiny  # noqa: E402
from ablate.models.heads import score_head  # noqa: E402
from parity_steps import STEPS, train_both  # noqa: E402

ROWS = [
    {"prompt": "sort: cba =", "chosen": " abc", "rejected": " bac", "margin": 0.5},
    {"prompt": "sort: hgfe =", "chosen": " efgh", "rejected": " hgef", "margin": 0.0},
    {"prompt": "sort: dc =", "chosen": " cd", "rejected": " dc", "margin": 1.5},
]
METRICS = ("accuracy", "margin", "mean_reward", "min_reward", "max_reward", "num_tokens")


def _model():
    tok, causal = tiny()
    torch.manual_seed(0)
    return tok, score_head(causal)


def _pair(tmp_path, rows, coefficient, **common):
    tok, model = _model()
    ds = Dataset.from_list(rows)
    # bf16=False: TRL defaults to bf16 autocast, which would make the comparison about precision
    common = dict(
        per_device_train_batch_size=3,
        report_to="none",
        use_cpu=True,
        bf16=False,
        center_rewards_coefficient=coefficient,
        **common,
    )
    theirs = trl.RewardTrainer(
        model=copy.deepcopy(model),
        processing_class=tok,
        train_dataset=ds,
        args=trl.RewardConfig(output_dir=str(tmp_path / "trl"), **common),
    )
    ours = RewardTrainer(
        model=copy.deepcopy(model),
        processing_class=tok,
        train_dataset=ds,
        args=RewardConfig(output_dir=str(tmp_path / "ours"), **common),
    )
    return theirs, ours


@pytest.mark.parametrize(
    "margin,coefficient",
    [(False, None), (True, None), (True, 0.01)],
    ids=["plain", "margin", "margin-center"],
)
def test_per_step_loss_and_metrics_match_trl(tmp_path, margin, coefficient):
    """Two optimizer steps (AdamW, lr 1e-3: step 2 runs on moved weights), logged every step."""
    rows = ROWS if margin else [{k: v for k, v in r.items() if k != "margin"} for r in ROWS]
    theirs, ours = _pair(tmp_path, rows, coefficient, max_steps=2, **STEPS)
    steps_ours = train_both(theirs, ours, 2, METRICS)
    assert steps_ours[0]["loss"] != steps_ours[1]["loss"]  # the model moved between the two steps


def test_sequences_and_batches_match_trl(tmp_path):
    theirs, ours = _pair(tmp_path, ROWS, None)
    assert ours.train_dataset["chosen_ids"] == theirs.train_dataset["chosen_ids"]
    assert ours.train_dataset["rejected_ids"] == theirs.train_dataset["rejected_ids"]
    b_theirs, b_ours = next(iter(theirs.get_train_dataloader())), next(iter(ours.get_train_dataloader()))
    for key in ("input_ids", "attention_mask", "margin"):
        assert torch.equal(b_theirs[key], b_ours[key]), key


def test_conversational_sequences_match_trl(tmp_path):
    """Messages: prompt + completion rendered by the chat template as one conversation, as TRL does."""
    rows = [
        {
            "prompt": [{"role": "user", "content": "sort: cba"}],
            "chosen": [{"role": "assistant", "content": "abc"}],
            "rejected": [{"role": "assistant", "content": "bca"}],
        }
    ] * 2
    theirs, ours = _pair(tmp_path, rows, None)
    assert ours.train_dataset["chosen_ids"] == theirs.train_dataset["chosen_ids"]
    assert ours.train_dataset["rejected_ids"] == theirs.train_dataset["rejected_ids"]


def test_score_head_is_trls_sequence_classifier(tmp_path):
    """TRL loads a causal checkpoint with AutoModelForSequenceClassification(num_labels=1): the backbone's
    weights, a new score head. ablate's score_head builds the same model from the built one."""
    from transformers import AutoModelForSequenceClassification

    tok, causal = tiny()
    causal.save_pretrained(tmp_path / "causal")
    loaded = AutoModelForSequenceClassification.from_pretrained(tmp_path / "causal", num_labels=1)
    ours = score_head(copy.deepcopy(causal))
    assert type(ours) is type(loaded) and ours.config.num_labels == 1
    theirs_state, ours_state = loaded.state_dict(), ours.state_dict()
    assert theirs_state.keys() == ours_state.keys()
    for k, v in theirs_state.items():
        if not k.startswith("score."):
            assert torch.equal(v, ours_state[k]), k
