"""Parity with TRL 1.16's DistillationTrainer, through the whole training loop: both students "sample" the
same fixed completions (a generator seam on each side) and learn the same teacher's distribution on them,
over three optimizer steps, for forward KL (beta 0), the JSD (0.5) and reverse KL (1) at a temperature
other than 1: the per-step loss, the student's entropy and TRL's `completions/*` (the lengths of those ending
with EOS included) (|delta| <= 1e-5, fp32); with gradient accumulation (two micro-batches a step), the loss.

The prompts are one prompt repeated (any sampler order draws the same rows) of one length: TRL scores
without position ids, ablate with the left-padding-aware ones generation used, equal without padding.
Plain SGD: Adam's first step is the sign of each gradient, which turns float noise in near-zero gradients
into full-size updates."""

from __future__ import annotations

import copy

import pytest
from datasets import Dataset

trl = pytest.importorskip("trl")

from ablate.methods.distill import DistillConfig, DistillTrainer  # noqa: E402
from ablate.models import tiny  # noqa: E402
from parity_steps import SGD_STEPS, train_both  # noqa: E402

TEXTS = ["aab", "bcaaa", "ccc", "abab a"]
# the completion lengths both trainers log (with a whole round's completions, not a micro-batch's)
LENGTHS = (
    "completions/mean_length",
    "completions/clipped_ratio",
    "completions/mean_terminated_length",
    "completions/max_terminated_length",
)


def _pair(tmp_path, beta, accumulation=1):
    tok, student = tiny()
    _, teacher = tiny(hidden_size=32, intermediate_size=64, init_seed=1)  # another model, the same vocabulary
    fixed = [tok(t, add_special_tokens=False)["input_ids"] for t in TEXTS]
    fixed[0] = fixed[0] + [tok.eos_token_id]  # one ends with EOS, as sampling stops
    ds = Dataset.from_list([{"prompt": "sort: cba ="}] * 8)
    common = dict(
        per_device_train_batch_size=4,
        gradient_accumulation_steps=accumulation,
        max_completion_length=8,
        temperature=0.7,
        beta=beta,
        max_steps=3,
        **SGD_STEPS,
    )
    theirs = trl.DistillationTrainer(
        model=copy.deepcopy(student),
        teacher_model=copy.deepcopy(teacher),
        train_dataset=ds,
        processing_class=tok,
        args=trl.DistillationConfig(output_dir=str(tmp_path / "trl"), **common),
    )
    theirs._generate_single_turn = lambda prompt_ids, images, mm, **kw: _fixed(fixed, prompt_ids)
    ours = DistillTrainer(
        model=copy.deepcopy(student),
        teacher=copy.deepcopy(teacher),
        train_dataset=ds,
        processing_class=tok,
        generator=lambda model, prompt_ids: _fixed(fixed, prompt_ids),
        args=DistillConfig(output_dir=str(tmp_path / "ours"), **common),
    )
    return theirs, ours


def _fixed(fixed, prompt_ids):
    """The fixed completions, in turn, one per prompt of the round."""
    return [list(fixed[i % len(fixed)]) for i in range(len(prompt_ids))]


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0], ids=["forward-kl", "jsd", "reverse-kl"])
def test_per_step_loss_matches_trl(tmp_path, beta):
    theirs, ours = _pair(tmp_path, beta)
    steps_ours = train_both(theirs, ours, 3, ("entropy", *LENGTHS, "completions/min_terminated_length"))
    assert steps_ours[0]["loss"] > steps_ours[-1]["loss"]  # the student moved towards the teacher


def test_accumulated_loss_matches_trl(tmp_path):
    """Two micro-batches per optimizer step, the round's completions of different lengths: TRL divides each
    micro-batch's summed divergence by the window's tokens (`loss_is_scaled_for_ga = True`), ablate by the
    window's tokens / 2 and Trainer by 2: the same loss per step, and the same updates (steps 2 and 3 start
    from them). TRL shuffles the round before slicing it, so a per-micro-batch mean (entropy) is not compared."""
    theirs, ours = _pair(tmp_path, 0.5, accumulation=2)
    steps_ours = train_both(theirs, ours, 3, LENGTHS)
    assert steps_ours[0]["loss"] > steps_ours[-1]["loss"]
