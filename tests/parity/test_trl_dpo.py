"""Parity with TRL (the reference implementation): same batch layout, and for every DPO loss TRL 1.16
has, the same per-step loss and metrics over two optimizer steps (|delta| <= 1e-5, relative for
values above 1).

TRL is a dev-only dependency (never imported by ablate at runtime); skipped when it is absent.
"""

from __future__ import annotations

import copy
import functools

import pytest
import torch
from datasets import Dataset

trl = pytest.importorskip("trl")

from ablate.losses import dpo as dpo_losses  # noqa: E402
from ablate.methods.dpo import DPOConfig, DPOTrainer  # noqa: E402
from ablate.models import tiny  # noqa: E402
from ablate.speed.plan import SpeedSwitches  # noqa: E402
from parity_steps import STEPS, train_both  # noqa: E402
from tiny_setups import moved  # noqa: E402

ROWS = [
    {"prompt": "sort: cba =", "chosen": " abc", "rejected": " bac"},
    {"prompt": "sort: hgfe =", "chosen": " efgh", "rejected": " hgef"},
    {"prompt": "sort: dc =", "chosen": " cd", "rejected": " dc"},
]
METRICS = (
    "rewards/chosen",
    "rewards/rejected",
    "rewards/accuracies",
    "rewards/margins",
    "logps/chosen",
    "logps/rejected",
    "entropy",
    "logits/chosen",
    "logits/rejected",
    "mean_token_accuracy",
    "num_tokens",
)
# (TRL's loss_type, TRL's extra args, ablate's loss). Hyper-parameters away from 0 where TRL reads them,
# so that they are exercised; beta 0.3 throughout.
LOSSES = [
    ("sigmoid", {}, dpo_losses.sigmoid),
    ("hinge", {}, dpo_losses.hinge),
    ("ipo", {}, dpo_losses.ipo),
    ("robust", {"label_smoothing": 0.1}, functools.partial(dpo_losses.robust, label_smoothing=0.1)),
    ("exo_pair", {"label_smoothing": 1e-3}, functools.partial(dpo_losses.exo_pair, label_smoothing=1e-3)),
    ("nca_pair", {}, dpo_losses.nca_pair),
    ("bco_pair", {}, dpo_losses.bco_pair),
    ("sppo_hard", {}, dpo_losses.sppo_hard),
    ("aot", {"label_smoothing": 0.1}, functools.partial(dpo_losses.aot, label_smoothing=0.1)),
    (
        "aot_unpaired",
        {"label_smoothing": 0.1},
        functools.partial(dpo_losses.aot_unpaired, label_smoothing=0.1),
    ),
    ("apo_zero", {}, dpo_losses.apo_zero),
    ("apo_down", {}, dpo_losses.apo_down),
    ("discopop", {"discopop_tau": 0.5}, functools.partial(dpo_losses.discopop, tau=0.5)),
    ("sigmoid_norm", {}, dpo_losses.sigmoid_norm),
    ("sft", {}, dpo_losses.sft),
    # MPO: TRL's weighted list
    (
        ["sigmoid", "bco_pair", "sft"],
        {"loss_weights": [0.8, 0.2, 1.0]},
        functools.partial(
            dpo_losses.weighted,
            losses=[dpo_losses.sigmoid, dpo_losses.bco_pair, dpo_losses.sft],
            weights=[0.8, 0.2, 1.0],
        ),
    ),
]


def _models():
    tok, ref = tiny()
    # the policy away from the reference: the loss is not log 2
    return tok, moved(copy.deepcopy(ref), seed=1), ref


def _pair(tmp_path, loss_type, trl_extra, loss, **common):
    tok, policy, ref = _models()
    ds = Dataset.from_list(ROWS)
    # bf16=False: TRL defaults to bf16 autocast, which would make the comparison about precision
    common = dict(
        per_device_train_batch_size=3, report_to="none", beta=0.3, use_cpu=True, bf16=False, **common
    )
    theirs = trl.DPOTrainer(
        model=copy.deepcopy(policy),
        ref_model=copy.deepcopy(ref),
        args=trl.DPOConfig(output_dir=str(tmp_path / "trl"), loss_type=loss_type, **trl_extra, **common),
        train_dataset=ds,
        processing_class=tok,
    )
    ours = DPOTrainer(
        model=copy.deepcopy(policy),
        ref_model=copy.deepcopy(ref),
        loss=loss,
        args=DPOConfig(output_dir=str(tmp_path / "ours"), **common),
        train_dataset=ds,
        processing_class=tok,
    )
    return theirs, ours


# the default suite runs the losses that read token counts, sort the batch, average over it or combine
# terms; every other loss runs in the slow suite (-m slow): ~3 s each
DEFAULT = {"sigmoid", "hinge", "ipo", "sigmoid_norm", "aot", "sft", "mpo"}


def _params() -> list:
    out = []
    for loss_type, extra, loss in LOSSES:
        name = loss_type if isinstance(loss_type, str) else "mpo"
        marks = () if name in DEFAULT else (pytest.mark.slow,)
        out.append(pytest.param(loss_type, extra, loss, id=name, marks=marks))
    return out


@pytest.mark.parametrize("loss_type,trl_extra,loss", _params())
def test_per_step_loss_and_metrics_match_trl(tmp_path, loss_type, trl_extra, loss):
    """Two optimizer steps (AdamW, lr 1e-3: step 2 runs on moved weights), logged every step."""
    theirs, ours = _pair(tmp_path, loss_type, trl_extra, loss, max_steps=2, **STEPS)
    steps_ours = train_both(theirs, ours, 2, METRICS)  # relative above 1: sppo_hard's loss is ~15
    assert steps_ours[0]["loss"] != steps_ours[1]["loss"]  # the policy moved between the two steps


def test_batches_match_trl(tmp_path):
    theirs, ours = _pair(tmp_path, "sigmoid", {}, dpo_losses.sigmoid)
    b_theirs = next(iter(theirs.get_train_dataloader()))
    b_ours = next(iter(ours.get_train_dataloader()))
    for key in ("input_ids", "attention_mask", "completion_mask"):
        assert torch.equal(b_theirs[key], b_ours[key]), key


def test_precomputed_reference_equals_live_reference(tmp_path):
    """The default (reference log-probs precomputed once) gives the live reference's numbers."""
    tok, policy, ref = _models()
    ds = Dataset.from_list(ROWS)
    args = dict(per_device_train_batch_size=3, report_to="none", beta=0.3, use_cpu=True)
    pre = DPOTrainer(
        model=copy.deepcopy(ref),
        args=DPOConfig(output_dir=str(tmp_path / "a"), **args),
        train_dataset=ds,
        processing_class=tok,
    )
    live = DPOTrainer(
        model=copy.deepcopy(ref),
        args=DPOConfig(output_dir=str(tmp_path / "b"), precompute_ref_log_probs=False, **args),
        train_dataset=ds,
        processing_class=tok,
    )
    pre.model.load_state_dict(policy.state_dict())  # the policy moves after the reference was scored
    live.model.load_state_dict(policy.state_dict())
    b_pre, b_live = next(iter(pre.get_train_dataloader())), next(iter(live.get_train_dataloader()))
    assert "ref_chosen_logps" in b_pre and "ref_chosen_logps" not in b_live
    torch.testing.assert_close(pre.compute_loss(pre.model, b_pre), live.compute_loss(live.model, b_live))


@pytest.mark.parametrize("precompute", [False, True])
def test_lora_dpo_matches_trl(tmp_path, precompute):
    """+peft=lora: TRL's DPOTrainer given `peft_config=` (reference = adapters disabled) and ours given
    the model wrapped by ablate.models.adapters, same LoraConfig, same adapter weights: same step-0 loss
    and metrics. The adapters are made nonzero first (a fresh LoRA is B = 0, where any reference that
    equals the initial policy would agree); ours scores the reference live or precomputed."""
    from ablate.models.adapters import lora, with_adapters

    tok, policy, _ = _models()
    ds = Dataset.from_list(ROWS)
    # lora_dropout=0: TRL's DPOConfig.disable_dropout (default True) zeroes every dropout, LoRA's too
    adapters = lora(r=4, lora_alpha=8, lora_dropout=0.0, target_modules="all-linear")
    common = dict(per_device_train_batch_size=3, report_to="none", beta=0.3, use_cpu=True, bf16=False)
    theirs = trl.DPOTrainer(
        model=copy.deepcopy(policy),
        peft_config=adapters.config,
        args=trl.DPOConfig(output_dir=str(tmp_path / "trl"), **common),
        train_dataset=ds,
        processing_class=tok,
    )
    assert theirs.ref_model is None
    with torch.no_grad():  # the same nonzero adapters in both
        g = torch.Generator().manual_seed(2)
        for name, p in theirs.model.named_parameters():
            if "lora_B" in name:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
    ours = DPOTrainer(
        model=with_adapters(copy.deepcopy(policy), adapters),
        args=DPOConfig(output_dir=str(tmp_path / "ours"), precompute_ref_log_probs=precompute, **common),
        train_dataset=ds,
        processing_class=tok,
    )
    assert ours.ref_model is None  # no second copy
    ours.model.load_state_dict(theirs.model.state_dict())  # same LoRA init (A is random) and B
    assert sorted(n for n, p in ours.model.named_parameters() if p.requires_grad) == sorted(
        n for n, p in theirs.model.named_parameters() if p.requires_grad
    )

    b_theirs = next(iter(theirs.get_train_dataloader()))
    b_ours = next(iter(ours.get_train_dataloader()))
    theirs.model.train(), ours.model.train()
    loss_theirs = theirs.compute_loss(theirs.model, b_theirs)
    loss_ours = ours.compute_loss(ours.model, b_ours)
    assert abs(loss_theirs.item() - 0.6931) > 1e-3  # the adapters matter: not the B = 0 value log 2
    torch.testing.assert_close(loss_ours, loss_theirs, rtol=1e-5, atol=1e-6)
    m_theirs = {k: v[-1] for k, v in theirs._metrics["train"].items()}
    m_ours = ours.metrics.pop("train")
    for name in (
        "rewards/chosen",
        "rewards/rejected",
        "rewards/accuracies",
        "rewards/margins",
        "logps/chosen",
        "logps/rejected",
    ):
        assert m_ours[name] == pytest.approx(m_theirs[name], rel=1e-5, abs=1e-6), name


def test_precomputed_reference_in_bf16_matches_trl(tmp_path):
    """bf16=True: the reference log-probs are precomputed under the same autocast as TRL's (and as the
    training forwards), not in float32 (Trainer's own autocast context is a no-op in transformers 5).
    Ours on TRL's layout (speed paths off), so that bf16 rounding is the same and the numbers equal."""
    tok, policy, _ = _models()
    ds = Dataset.from_list(ROWS)
    common = dict(
        per_device_train_batch_size=3,
        report_to="none",
        use_cpu=True,
        bf16=True,
        precompute_ref_log_probs=True,
    )
    theirs = trl.DPOTrainer(
        model=copy.deepcopy(policy),
        ref_model=copy.deepcopy(policy),
        args=trl.DPOConfig(output_dir=str(tmp_path / "trl"), **common),
        train_dataset=ds,
        processing_class=tok,
    )
    ours = DPOTrainer(
        model=copy.deepcopy(policy),
        args=DPOConfig(output_dir=str(tmp_path / "ours"), **common),
        train_dataset=ds,
        processing_class=tok,
        perf=SpeedSwitches(dpo_pair_rows=False, completion_only_logits=False, padding_free=False),
    )
    for col in ("ref_chosen_logps", "ref_rejected_logps"):
        assert ours.train_dataset[col] == theirs.train_dataset[col], col
