"""Parity with TRL 1.16's reference-free trainers (`trl.experimental`): ORPOTrainer (ORPO), CPOTrainer
(CPO, loss_type=sigmoid, hinge, ipo, and the AlphaPO shape `alpha`; SimPO, loss_type=simpo; AlphaPO,
loss_type=alphapo), against ablate's DPOTrainer given the loss of
ablate.losses.reference_free: the same per-step loss and metrics over three optimizer steps (|delta| <=
1e-5, relative above 1), float32 on the CPU, the same model, data, batches and optimizer.

TRL is a dev-only dependency (never imported by ablate at runtime); skipped when it is absent.
"""

from __future__ import annotations

import copy
import functools

import pytest
from datasets import Dataset

trl = pytest.importorskip("trl")
orpo_trl = pytest.importorskip("trl.experimental.orpo")
cpo_trl = pytest.importorskip("trl.experimental.cpo")

from ablate.losses import reference_free as rf  # noqa: E402
from ablate.methods.dpo import DPOConfig, DPOTrainer  # noqa: E402
from ablate.models import tiny  # noqa: E402
from parity_steps import STEPS, train_both  # noqa: E402

ROWS = [
    {"prompt": "sort: cba =", "chosen": " abc", "rejected": " bac"},
    {"prompt": "sort: hgfe =", "chosen": " efgh", "rejected": " hgef"},
    {"prompt": "sort: dc =", "chosen": " cd", "rejected": " dc"},
]
REWARDS = (
    "rewards/chosen",
    "rewards/rejected",
    "rewards/accuracies",
    "rewards/margins",
    "logps/chosen",
    "logps/rejected",
)
# (id, TRL's trainer, its config, its extra args, ablate's loss, the metrics compared besides loss)
CASES = [
    (
        "orpo",
        orpo_trl.ORPOTrainer,
        orpo_trl.ORPOConfig,
        {},
        rf.orpo,
        (*REWARDS, "nll_loss", "log_odds_ratio", "log_odds_chosen"),
    ),
    (
        "cpo",
        cpo_trl.CPOTrainer,
        cpo_trl.CPOConfig,
        {"label_smoothing": 0.1, "cpo_alpha": 0.5},
        functools.partial(rf.cpo, label_smoothing=0.1, cpo_alpha=0.5),
        (*REWARDS, "nll_loss"),
    ),
    (
        "cpo_hinge",
        cpo_trl.CPOTrainer,
        cpo_trl.CPOConfig,
        {"loss_type": "hinge", "cpo_alpha": 0.5},
        functools.partial(rf.cpo_hinge, cpo_alpha=0.5),
        (*REWARDS, "nll_loss"),
    ),
    (
        "cpo_ipo",
        cpo_trl.CPOTrainer,
        cpo_trl.CPOConfig,
        {"loss_type": "ipo", "cpo_alpha": 0.5},
        functools.partial(rf.cpo_ipo, cpo_alpha=0.5),
        (*REWARDS, "nll_loss"),
    ),
    # AlphaPO's reward shape on CPO's summed log-probs (TRL's `alpha` works with every loss type)
    (
        "cpo_alpha_shape",
        cpo_trl.CPOTrainer,
        cpo_trl.CPOConfig,
        {"alpha": 0.05, "cpo_alpha": 0.5},
        functools.partial(rf.cpo, alpha=0.05, cpo_alpha=0.5),
        (*REWARDS, "nll_loss"),
    ),
    # TRL's loss_type=alphapo: simpo, cpo_alpha 0, the shape (Gupta et al. 2025)
    (
        "alphapo",
        cpo_trl.CPOTrainer,
        cpo_trl.CPOConfig,
        {"loss_type": "alphapo", "alpha": 0.25, "simpo_gamma": 0.3},
        functools.partial(rf.simpo, gamma=0.3, cpo_alpha=0.0, alpha=0.25),
        REWARDS,
    ),
    # TRL logs nll_loss 0 when cpo_alpha is 0; ablate logs the NLL itself: compared in simpo_with_nll
    (
        "simpo",
        cpo_trl.CPOTrainer,
        cpo_trl.CPOConfig,
        {"loss_type": "simpo", "simpo_gamma": 0.3, "cpo_alpha": 0.0},
        functools.partial(rf.simpo, gamma=0.3, cpo_alpha=0.0),
        REWARDS,
    ),
    (
        "simpo_with_nll",
        cpo_trl.CPOTrainer,
        cpo_trl.CPOConfig,
        {"loss_type": "simpo", "simpo_gamma": 0.3},
        functools.partial(rf.simpo, gamma=0.3, cpo_alpha=1.0),
        (*REWARDS, "nll_loss"),
    ),
]


def _policy():
    """The tiny model, its tokenizer without a BOS token: TRL's ORPO and CPO trainers put one before each
    prompt where the tokenizer has one; TRL's DPOTrainer and ablate do not (docs/methods.md)."""
    tok, model = tiny()
    tok.bos_token = None
    assert tok.bos_token_id is None
    return tok, model


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_per_step_loss_and_metrics_match_trl(tmp_path, case):
    """Three optimizer steps (AdamW, lr 1e-3: steps 2 and 3 run on moved weights), logged every step."""
    _, trainer_cls, config_cls, extra, loss, metrics = case
    tok, policy = _policy()
    ds = Dataset.from_list(ROWS)
    # bf16=False: TRL defaults to bf16 autocast; gradient_checkpointing: TRL's default is on (same numbers, slower)
    common = dict(
        per_device_train_batch_size=3,
        report_to="none",
        beta=0.3,
        use_cpu=True,
        bf16=False,
        max_steps=3,
        **STEPS,
        gradient_checkpointing=False,
        max_length=512,
    )
    theirs = trainer_cls(
        model=copy.deepcopy(policy),
        args=config_cls(output_dir=str(tmp_path / "trl"), **extra, **common),
        train_dataset=ds,
        processing_class=tok,
    )
    ours = DPOTrainer(
        model=copy.deepcopy(policy),
        loss=loss,
        args=DPOConfig(output_dir=str(tmp_path / "ours"), **common),
        train_dataset=ds,
        processing_class=tok,
    )
    assert (
        ours.ref_model is None and "ref_chosen_logps" not in ours.train_dataset.column_names
    )  # no reference
    steps_ours = train_both(theirs, ours, 3, metrics)
    assert steps_ours[0]["loss"] != steps_ours[2]["loss"]  # the policy moved
