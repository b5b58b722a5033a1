"""Prompts longer than 512 tokens, at each method's defaults: TRL 1.16's GRPOTrainer, RLOOTrainer and
DistillationTrainer keep whole prompts (none of their configs has a prompt limit), and so does ablate
(`method.args.max_prompt_length` defaults to null). Cutting a 606-token prompt to its last 512 tokens, as
ablate did before, moved GRPO's kl by ~90% and its loss by ~20%.

Each side trains three optimizer steps (plain SGD: Adam's first step is the sign of each gradient, which turns
float noise into full-size updates) on one 606-token prompt repeated (no padding: TRL scores without position
ids, ablate with left-padding-aware ones, equal without padding), both sampling the same fixed completions
(a generator seam on each side), two of them ending with EOS. Per step, fp32, |delta| <= 1e-5: the loss, kl
(GRPO's k3 loss term, RLOO's k1 reward penalty), entropy and TRL's `completions/*`, the lengths of the
completions that ended with EOS included (`completions/{mean,min,max}_terminated_length`)."""

from __future__ import annotations

import copy
import functools

import pytest
from datasets import Dataset

trl = pytest.importorskip("trl")

from trl.trainer.utils import add_fused_lm_head  # noqa: E402

from ablate.losses import rloo  # noqa: E402
from ablate.methods.distill import DistillConfig, DistillTrainer  # noqa: E402
from ablate.methods.grpo import GRPOConfig, GRPOTrainer  # noqa: E402
from ablate.methods.rloo_config import RLOOConfig  # noqa: E402
from ablate.models import tiny  # noqa: E402
from parity_steps import SGD_STEPS, train_both  # noqa: E402

PROMPT = "sort: " + "abc" * 200  # 606 tokens of the byte tokenizer
G = 4
COMPLETIONS = (
    "completions/mean_length",
    "completions/min_length",
    "completions/max_length",
    "completions/clipped_ratio",
    "completions/mean_terminated_length",
    "completions/min_terminated_length",
    "completions/max_terminated_length",
)
COMMON = dict(max_completion_length=8, max_steps=3, **SGD_STEPS)


def letter_a(completions: list, **kwargs: object) -> list[float]:
    """The share of 'a' in the completion: rewards that differ within a group."""
    return [c.count("a") / max(len(c), 1) for c in completions]


def _setup():
    tok, policy = tiny(max_position_embeddings=1024)
    texts = ["aab", "bcaaa", "ccc", "abab a"]
    fixed = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    fixed[0], fixed[2] = fixed[0] + [tok.eos_token_id], fixed[2] + [tok.eos_token_id]
    return tok, policy, fixed, Dataset.from_list([{"prompt": PROMPT}] * 8)


def _with_reference(theirs, policy, beta):
    """TRL loads its reference from a hub path when beta > 0: built with beta 0, it is given the initial policy
    (with TRL's fused head, as its __init__ would)."""
    theirs.beta, theirs.ref_model = beta, copy.deepcopy(policy).eval()
    add_fused_lm_head(theirs.ref_model, temperature=1.0)
    return theirs


def _grpo(tmp_path):
    tok, policy, fixed, ds = _setup()
    args = dict(per_device_train_batch_size=G, num_generations=G, **COMMON)
    theirs = trl.GRPOTrainer(
        model=copy.deepcopy(policy),
        reward_funcs=[letter_a],
        train_dataset=ds,
        processing_class=tok,
        args=trl.GRPOConfig(output_dir=str(tmp_path / "trl"), beta=0.0, **args),
    )
    theirs._generate_single_turn = lambda prompt_ids, *a, **k: ([list(c) for c in fixed], None)
    ours = GRPOTrainer(
        model=copy.deepcopy(policy),
        reward_funcs={"letter_a": letter_a},
        train_dataset=ds,
        processing_class=tok,
        generator=lambda model, prompt_ids: [list(c) for c in fixed],
        args=GRPOConfig(output_dir=str(tmp_path / "ours"), beta=0.04, **args),
    )
    return _with_reference(theirs, policy, 0.04), ours


def _rloo(tmp_path):
    tok, policy, fixed, ds = _setup()
    args = dict(per_device_train_batch_size=G, num_generations=G, **COMMON)
    theirs = trl.RLOOTrainer(
        model=copy.deepcopy(policy),
        reward_funcs=[letter_a],
        train_dataset=ds,
        processing_class=tok,
        args=trl.RLOOConfig(output_dir=str(tmp_path / "trl"), beta=0.0, **args),
    )
    theirs._generate_single_turn = lambda prompt_ids, images, mm: [list(c) for c in fixed]
    beta = RLOOConfig.beta  # the default, TRL's
    ours = GRPOTrainer(
        model=copy.deepcopy(policy),
        reward_funcs={"letter_a": letter_a},
        train_dataset=ds,
        processing_class=tok,
        generator=lambda model, prompt_ids: [list(c) for c in fixed],
        reward_aggregation=functools.partial(  # RLOO's defaults, TRL's: no normalising, no clipping
            rloo.leave_one_out, beta=beta, normalize_advantages=False, reward_clip_range=None
        ),
        objective=rloo.sequence_clip,
        aggregation=rloo.sequences,
        scale_rewards=None,
        args=RLOOConfig(output_dir=str(tmp_path / "ours"), **args),
    )
    return _with_reference(theirs, policy, trl.RLOOConfig.beta), ours


def _distill(tmp_path):
    tok, student, fixed, ds = _setup()
    _, teacher = tiny(hidden_size=32, intermediate_size=64, max_position_embeddings=1024, init_seed=1)
    args = dict(per_device_train_batch_size=G, **COMMON)
    theirs = trl.DistillationTrainer(
        model=copy.deepcopy(student),
        teacher_model=copy.deepcopy(teacher),
        train_dataset=ds,
        processing_class=tok,
        args=trl.DistillationConfig(output_dir=str(tmp_path / "trl"), **args),
    )
    theirs._generate_single_turn = lambda prompt_ids, images, mm, **kw: [list(c) for c in fixed]
    ours = DistillTrainer(
        model=copy.deepcopy(student),
        teacher=copy.deepcopy(teacher),
        train_dataset=ds,
        processing_class=tok,
        generator=lambda model, prompt_ids: [list(c) for c in fixed],
        args=DistillConfig(output_dir=str(tmp_path / "ours"), **args),
    )
    return theirs, ours


PAIRS = {"grpo": (_grpo, ("kl",)), "rloo": (_rloo, ("kl",)), "distill": (_distill, ())}


def test_rloo_beta_default_is_trls():
    assert RLOOConfig.beta == trl.RLOOConfig.beta == 0.05


@pytest.mark.parametrize("method", PAIRS)
def test_long_prompts_train_as_in_trl(tmp_path, method):
    make, extra = PAIRS[method]
    theirs, ours = make(tmp_path)
    assert ours.args.max_prompt_length is None  # the default: whole prompts
    assert len(ours.train_dataset[0]["prompt_ids"]) == 606 > 512
    steps_ours = train_both(theirs, ours, 3, ("entropy", *COMPLETIONS, *extra))
    # the fixture exercises what it compares: some completions end with EOS (lengths 4 and 4), some do not
    assert (
        steps_ours[0]["completions/mean_terminated_length"] == 4.0
        and steps_ours[0]["completions/clipped_ratio"] == 0.5
    )
    for name in extra:  # the policy left its reference: a KL to compare
        assert steps_ours[-1][name] > 1e-4
    assert ours.run_facts()["prompts_cut"] == {
        "max_prompt_length": None,
        "train": {"rows": 8, "cut": 0, "longest": 606},
    }
