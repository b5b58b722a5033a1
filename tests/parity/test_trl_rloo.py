"""Parity with TRL 1.16's RLOOTrainer, through the whole training loop: GRPO's trainer given RLOO's three seams
(ablate.losses.rloo, as conf/method/rloo.yaml picks them) and TRL's RLOOTrainer, both generating the same
fixed completions (a generator seam on each side), scoring them with the same reward function, over four
optimizer steps of two generation rounds (num_iterations=2: each round's second pass trains with moved
weights, so the ratio leaves 1 and the clip acts). Plain SGD: Adam's first step is the sign of each
gradient, which would turn float noise in near-zero gradients into full-size, diverging updates. Per step: the loss and TRL's metrics (|delta| <= 1e-5,
fp32); per round: the advantages (TRL shuffles a round's rows before slicing it: compared as sets).
The cases cover the KL penalty in the reward (beta > 0, the reference the initial policy),
normalize_advantages and reward_clip_range."""

from __future__ import annotations

import copy
import functools

import pytest
import torch
from datasets import Dataset

trl = pytest.importorskip("trl")

from trl.trainer.utils import add_fused_lm_head  # noqa: E402

from ablate.losses import rloo  # noqa: E402
from ablate.methods.grpo import GRPOTrainer  # noqa: E402
from ablate.methods.rloo_config import RLOOConfig  # noqa: E402
from ablate.models import tiny  # noqa: E402
from parity_steps import SGD_STEPS, train_both  # noqa: E402

G = 4
METRICS = (
    "reward",
    "reward_std",
    "frac_reward_zero_std",
    "entropy",
    "clip_ratio/low_mean",
    "clip_ratio/high_mean",
    "clip_ratio/region_mean",
    "clip_ratio/low_min",
    "clip_ratio/high_max",
    "rewards/letter_a/mean",
    "rewards/letter_a/std",
    "completions/mean_length",
    "completions/max_length",
    "num_tokens",
    "completions/mean_terminated_length",
    "completions/min_terminated_length",
    "completions/max_terminated_length",
)


def letter_a(completions: list, **kwargs: object) -> list[float]:
    """The share of 'a' in the completion: rewards that differ within a group."""
    return [c.count("a") / max(len(c), 1) for c in completions]


def _completions(tok) -> list[list[int]]:
    """The G completions every round gets (of different lengths; two end with EOS)."""
    texts = ["aab", "bcaaa", "ccc", "abab a"]
    ids = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    return [ids[0] + [tok.eos_token_id], ids[1], ids[2] + [tok.eos_token_id], ids[3]]


def _pair(tmp_path, beta, normalize, clip_range):
    tok, policy = tiny()
    ds = Dataset.from_list(
        [{"prompt": "sort: cba ="}] * 8
    )  # one prompt: any sampler order draws the same rows
    fixed = _completions(tok)
    common = dict(
        per_device_train_batch_size=G,
        num_generations=G,
        max_completion_length=8,
        num_iterations=2,
        max_steps=4,
        epsilon=0.1,
        **SGD_STEPS,
        normalize_advantages=normalize,
        reward_clip_range=clip_range,
    )
    # TRL loads its reference from a hub path when beta > 0: build with beta 0, then give it the initial
    # policy as the reference (with TRL's fused head, as its __init__ would)
    theirs = trl.RLOOTrainer(
        model=copy.deepcopy(policy),
        reward_funcs=[letter_a],
        train_dataset=ds,
        processing_class=tok,
        args=trl.RLOOConfig(output_dir=str(tmp_path / "trl"), beta=0.0, **common),
    )
    if beta:
        theirs.beta, theirs.ref_model = beta, copy.deepcopy(policy).eval()
        add_fused_lm_head(theirs.ref_model, temperature=1.0)
    theirs._generate_single_turn = lambda prompt_ids, images, mm: [list(c) for c in fixed]
    ours = GRPOTrainer(
        model=copy.deepcopy(policy),
        reward_funcs={"letter_a": letter_a},
        train_dataset=ds,
        processing_class=tok,
        generator=lambda model, prompt_ids: [list(c) for c in fixed],
        reward_aggregation=functools.partial(
            rloo.leave_one_out, beta=beta, normalize_advantages=normalize, reward_clip_range=clip_range
        ),
        objective=rloo.sequence_clip,
        aggregation=rloo.sequences,
        scale_rewards=None,
        args=RLOOConfig(output_dir=str(tmp_path / "ours"), beta=beta, **common),
    )
    return theirs, ours


# the default suite runs the case with every option on; each alone runs in the slow suite (-m slow)
@pytest.mark.parametrize(
    "beta,normalize,clip_range",
    [
        pytest.param(0.05, False, None, id="kl-penalty", marks=pytest.mark.slow),
        pytest.param(0.0, True, None, id="normalized", marks=pytest.mark.slow),
        pytest.param(0.05, True, [0.2, 0.6], id="kl-normalized-clipped"),
    ],
)
def test_per_step_loss_and_metrics_match_trl(tmp_path, beta, normalize, clip_range):
    theirs, ours = _pair(tmp_path, beta, normalize, clip_range)
    rounds_theirs, rounds_ours = [], []
    score_theirs, score_ours = theirs._generate_and_score_completions, ours._generate_and_score

    def keep_theirs(*a, **k):
        out = score_theirs(*a, **k)
        rounds_theirs.append(out["advantages"].clone())
        return out

    def keep_ours(*a, **k):
        out = score_ours(*a, **k)
        rounds_ours.append(out.advantages.clone())
        return out

    theirs._generate_and_score_completions, ours._generate_and_score = keep_theirs, keep_ours
    steps_ours = train_both(theirs, ours, 4, (*METRICS, *(("kl",) if beta else ())), optional=True)
    assert len(rounds_theirs) == len(rounds_ours) == 2
    for a, b in zip(rounds_ours, rounds_theirs):
        torch.testing.assert_close(a.sort().values, b.sort().values, rtol=0, atol=1e-5)
    assert any(abs(e["loss"]) > 1e-4 for e in steps_ours)  # the second passes train off-policy: ratio != 1
    if beta:
        assert [e["kl"] for e in steps_ours if "kl" in e][
            -1
        ] > 1e-4  # the policy left its reference: a penalty
