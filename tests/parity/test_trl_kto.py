"""Parity with TRL 1.16's KTOTrainer: the same unpaired, tokenised examples and KL pairs, and the same
per-step loss and metrics over two optimizer steps (|delta| <= 1e-5, fp32) for both loss types, with
unequal desirable/undesirable weights, the reference precomputed (ablate's default) or live (TRL's).

ablate shuffles the unpaired examples once with the data seed (TRL keeps its unpairing's order, every
desirable example first: ablate.data.unpaired); TRL is given the same shuffled rows, so both read them in
the same fixed order."""

from __future__ import annotations

import copy
import functools

import pytest
import torch
from datasets import Dataset

trl = pytest.importorskip("trl")

from ablate.data.unpaired import unpair  # noqa: E402
from ablate.losses import kto as kto_losses  # noqa: E402
from ablate.methods.kto import KTOConfig, KTOTrainer  # noqa: E402
from ablate.models import tiny  # noqa: E402
from parity_steps import STEPS, train_both  # noqa: E402
from tiny_setups import moved  # noqa: E402

PAIRS = [
    {"prompt": "sort: cba =", "chosen": " abc", "rejected": " bac"},
    {"prompt": "sort: hgfe =", "chosen": " efgh", "rejected": " hgef"},
    {"prompt": "sort: dc =", "chosen": " cd", "rejected": " dc"},
    {"prompt": "sort: fea =", "chosen": " aef", "rejected": " fae"},
]
METRICS = (
    "kl",
    "entropy",
    "logits/chosen",
    "logits/rejected",
    "rewards/chosen",
    "rewards/rejected",
    "rewards/margins",
    "logps/chosen",
    "logps/rejected",
    "num_tokens",
)
LOSSES = {"kto": kto_losses.kto, "apo_zero_unpaired": kto_losses.apo_zero_unpaired}


def _models():
    tok, ref = tiny()
    # the policy away from the reference: log-ratios not 0, a KL estimate above 0
    return tok, moved(copy.deepcopy(ref), seed=4), ref


def _pair(tmp_path, loss_type, precompute, **common):
    tok, policy, ref = _models()
    ds = Dataset.from_list(PAIRS)
    shuffled = unpair(ds).shuffle(seed=0).flatten_indices()  # what ablate reads, in its order
    common = dict(
        per_device_train_batch_size=4,
        report_to="none",
        use_cpu=True,
        bf16=False,
        beta=0.3,
        desirable_weight=1.3,
        undesirable_weight=0.7,
        seed=0,
        **common,
    )
    theirs = trl.KTOTrainer(
        model=copy.deepcopy(policy),
        ref_model=copy.deepcopy(ref),
        processing_class=tok,
        train_dataset=shuffled,
        args=trl.KTOConfig(output_dir=str(tmp_path / "trl"), loss_type=loss_type, **common),
    )
    ours = KTOTrainer(
        model=copy.deepcopy(policy),
        ref_model=None if precompute else copy.deepcopy(ref),
        processing_class=tok,
        train_dataset=ds,
        loss=functools.partial(LOSSES[loss_type]),
        args=KTOConfig(output_dir=str(tmp_path / "ours"), precompute_ref_log_probs=precompute, **common),
    )
    if precompute:  # the precomputed reference is the initial policy: score it with the reference's weights
        ours.model.load_state_dict(ref.state_dict())
        ours.train_dataset = ours._with_ref_logps(
            ours.train_dataset.remove_columns(
                ["ref_logps", "ref_KL_logps"] if loss_type == "kto" else ["ref_logps"]
            )
        )
        ours.model.load_state_dict(policy.state_dict())
    return theirs, ours


@pytest.mark.parametrize("loss_type,precompute", [("kto", True), ("kto", False), ("apo_zero_unpaired", True)])
def test_per_step_loss_and_metrics_match_trl(tmp_path, loss_type, precompute):
    """Two optimizer steps of 4 examples (AdamW, lr 1e-3: step 2 runs on moved weights), logged every step."""
    theirs, ours = _pair(tmp_path, loss_type, precompute, max_steps=2, **STEPS)
    steps_ours = train_both(theirs, ours, 2, METRICS, optional=True)
    assert steps_ours[0]["loss"] != steps_ours[1]["loss"]  # the policy moved between the two steps
    if loss_type == "kto":
        assert steps_ours[0]["kl"] > 0  # the reference point is exercised (else z0 = 0 proves little)


def test_examples_and_batches_match_trl(tmp_path):
    theirs, ours = _pair(tmp_path, "kto", False)
    for col in ("prompt_ids", "completion_ids", "KL_completion_ids", "label"):
        assert ours.train_dataset[col] == theirs.train_dataset[col], col
    b_theirs, b_ours = next(iter(theirs.get_train_dataloader())), next(iter(ours.get_train_dataloader()))
    for key in (
        "input_ids",
        "attention_mask",
        "completion_mask",
        "KL_input_ids",
        "KL_completion_mask",
        "label",
    ):
        assert torch.equal(b_theirs[key], b_ours[key]), key
    assert 0 < int(b_ours["label"].sum()) < 4  # the shuffled order mixes labels within a batch


def test_unpair_is_trls():
    """Pairs -> TRL's unpaired rows, in TRL's order (every chosen before every rejected)."""
    from trl.data_utils import unpair_preference_dataset

    ds = Dataset.from_list(PAIRS)
    assert unpair(ds).to_list() == unpair_preference_dataset(ds).to_list()
