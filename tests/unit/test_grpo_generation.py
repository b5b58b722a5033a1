"""The fast generation path against the plain one: `SharedPromptGenerator` (one prefill per distinct
prompt, ended rows leave the batch) draws what `HFGenerator` (`model.generate`) draws, greedy and
sampled with the same seed, and leaves the RNG where generate leaves it; scoring only completion
positions (`logits_to_keep`) gives the full-logits path's log-probs and gradients."""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch
from datasets import Dataset

from ablate.methods.grpo import GRPOConfig, GRPOTrainer
from ablate.models import tiny
from ablate.rollouts.generation import (
    HFGenerator,
    SharedPromptGenerator,
    build_generator,
    left_pad,
    right_pad,
)
from ablate.speed import scoring
from ablate.speed.plan import SpeedSwitches


def _args(tmp_path: Any, **kw: Any) -> GRPOConfig:
    base = dict(
        output_dir=str(tmp_path),
        per_device_train_batch_size=12,
        num_generations=4,
        max_completion_length=12,
        temperature=0.8,
        report_to="none",
        use_cpu=True,
    )
    return GRPOConfig(**(base | kw))


def _setup() -> tuple[Any, Any, list[list[int]]]:
    """The tiny model with 40 stop ids (rows end at different steps, some at the first), and 3 prompts of
    different lengths (left padding), each 4 times, interleaved with a repeat out of group order."""
    tok, model = tiny()
    model.generation_config.eos_token_id = list(range(60, 100))
    prompts = [tok(t, add_special_tokens=False)["input_ids"] for t in ("abc:", "hello there:", "x")]
    rows = [p for p in prompts for _ in range(4)]
    rows[5], rows[8] = rows[8], rows[5]
    return tok, model, rows


def _draw(gen: Any, model: Any, rows: list[list[int]]) -> tuple[list[list[int]], list[float]]:
    torch.manual_seed(0)
    out = gen(model, rows)
    return out, torch.rand(4).tolist()  # where the RNG was left


def test_greedy_completions_identical_to_generate(tmp_path):
    tok, model, rows = _setup()
    hf = HFGenerator(_args(tmp_path), tok)
    hf.config.do_sample, hf.config.temperature, hf.config.top_k = False, None, None
    ours = SharedPromptGenerator(_args(tmp_path), tok, do_sample=False)
    a, b = hf(model, rows), ours(model, rows)
    assert a == b
    assert (
        min(map(len, a)) < 12 == max(map(len, a))
    )  # some rows ended early (and left the batch), some ran to the cap


@pytest.mark.parametrize("top_k,top_p", [(50, 1.0), (0, 1.0), (0, 0.9), (20, 0.8)])
def test_sampled_completions_and_rng_identical_to_generate(tmp_path, top_k, top_p):
    tok, model, rows = _setup()
    args = _args(tmp_path, top_k=top_k, top_p=top_p)
    a, rng_a = _draw(HFGenerator(args, tok), model, rows)
    b, rng_b = _draw(SharedPromptGenerator(args, tok), model, rows)
    assert a == b
    assert rng_a == rng_b
    assert len({tuple(c) for c in a}) > 6  # sampled: a group's completions differ
    assert len({len(c) for c in a}) > 2  # rows ended at different steps (ended rows left the batch)


@pytest.mark.parametrize("generator", [HFGenerator, SharedPromptGenerator])
def test_top_k_zero_is_no_top_k_and_the_default(tmp_path, monkeypatch, generator):
    """top_k=0 (TRL 1.16's default, and ours) filters nothing: the draws are those of top_k=vocab size
    (a no-op filter) and differ from a real filter's, and no TopKLogitsWarper is built for it (generate's
    own implicit default, 50, does not sneak back in)."""
    import transformers.generation.utils as gen_utils
    from trl import GRPOConfig as TRLGRPOConfig

    import ablate.rollouts.generation as ours

    assert (
        GRPOConfig(output_dir=str(tmp_path)).top_k
        == TRLGRPOConfig(output_dir=str(tmp_path), use_cpu=True).top_k
        == 0
    )
    built: list[int] = []

    class Recording(gen_utils.TopKLogitsWarper):
        def __init__(self, top_k: int, **kw: Any) -> None:
            built.append(top_k)
            super().__init__(top_k, **kw)

    monkeypatch.setattr(gen_utils, "TopKLogitsWarper", Recording)
    monkeypatch.setattr(ours, "TopKLogitsWarper", Recording)
    tok, model, rows = _setup()
    vocab = model.get_output_embeddings().weight.size(0)
    draws = []
    for k in (0, vocab, 3):
        built.clear()
        draws.append(_draw(generator(_args(tmp_path, top_k=k), tok), model, rows)[0])
        assert built == ([k] if k else [])
    assert draws[0] == draws[1] != draws[2]


def test_restores_train_mode_and_generates_from_one_token_prompts(tmp_path):
    tok, model, _ = _setup()
    model.train()
    rows = [[65]] * 4 + [[66]] * 4
    args = _args(tmp_path, per_device_train_batch_size=8)
    (a, _), (b, _) = (
        _draw(HFGenerator(args, tok), model, rows),
        _draw(SharedPromptGenerator(args, tok), model, rows),
    )
    assert a == b and model.training


@pytest.mark.parametrize("top_k,top_p", [(0, 1.0), (20, 0.8)])
def test_sampling_log_probs_are_the_trainers_log_probs(tmp_path, top_k, top_p):
    """`sample(policy_logps=True)` (asynchronous GRPO's pi_old, from the logits each token was drawn from)
    draws what `__call__` draws, leaves the RNG where it does, and gives each kept token the log-prob
    the trainer's forward pass gives it at the sampling temperature, top-k/top-p not applied (TRL's pi):
    fp32, 1e-5, rows ended early included. Not the temperature-1 log-probs (the test can fail)."""
    tok, model, rows = _setup()
    args = _args(tmp_path, top_k=top_k, top_p=top_p)
    gen = SharedPromptGenerator(args, tok)
    plain, rng_plain = _draw(gen, model, rows)
    out, rng = _draw(lambda m, r: gen.sample(m, r, policy_logps=True), model, rows)
    assert out.ids == plain and rng == rng_plain and out.logps is None
    assert [len(lp) for lp in out.policy_logps] == [len(c) for c in out.ids] and len(
        {len(c) for c in out.ids}
    ) > 2
    trainer = GRPOTrainer(
        model=model,
        args=args,
        train_dataset=Dataset.from_dict({"prompt": ["ab"] * 4}),
        processing_class=tok,
        reward_funcs={"zero": lambda completions, **_: [0.0] * len(completions)},
    )
    batch = trainer._completion_batch(rows, out.ids)
    with torch.no_grad():
        forward = trainer._token_logps(model, batch)[0] * batch["completion_mask"]
    decoded = right_pad(out.policy_logps, 0.0, torch.float32)[0]
    torch.testing.assert_close(decoded, forward, rtol=0, atol=1e-5)
    trainer.args.temperature = 1.0
    with torch.no_grad():
        at_one = trainer._token_logps(model, batch)[0] * batch["completion_mask"]
    assert (decoded - at_one).abs().max() > 1e-2


def test_generator_from_config_partial_and_default(tmp_path):
    tok, _, _ = _setup()
    args = _args(tmp_path)
    assert isinstance(build_generator(None, args, tok), SharedPromptGenerator)
    assert isinstance(build_generator(functools.partial(HFGenerator), args, tok), HFGenerator)
    fn = lambda model, prompts: [[1]] * len(prompts)  # noqa: E731 - a plain GenerateFn is used as given
    assert build_generator(fn, args, tok) is fn


def test_length_groups_by_hand():
    assert scoring.length_groups([5, 5, 5, 5], [30, 1, 30, 1], overhead=0) == [[1, 3], [0, 2]]
    assert scoring.length_groups([5, 5, 5, 5], [30, 1, 30, 1], overhead=1000) == [[1, 3, 0, 2]]
    assert scoring.length_groups([2, 9], [4, 4], overhead=0) == [[0], [1]]


@pytest.mark.parametrize("path", ["logits_to_keep", "length_groups"])
def test_fast_scoring_equals_full_logits_whole_batch(tmp_path, monkeypatch, path):
    """`_token_logps` with logits_to_keep (or scored in length groups) = the whole batch's full-logits
    pass: log-probs and entropies at every completion token (fp32, 1e-5) and gradients."""
    tok, model, rows = _setup()
    args = _args(tmp_path)
    monkeypatch.setattr(scoring, "GROUP_OVERHEAD_TOKENS", 0)  # the tiny batch splits into several groups
    trainer = GRPOTrainer(
        model=model,
        args=args,
        train_dataset=Dataset.from_dict({"prompt": ["ab"] * 4}),
        processing_class=tok,
        reward_funcs={"zero": lambda completions, **_: [0.0] * len(completions)},
        perf=SpeedSwitches(length_groups=path == "length_groups", grpo_group_rows=False),
    )  # one row per completion
    completions = [[70, 71, 72], [73], [80, 81, 82, 83, 84], [90, 91]] * 3
    p_ids, p_mask = left_pad(rows, tok.pad_token_id)
    c_ids, c_mask = right_pad(completions, tok.pad_token_id)
    batch = {"prompt_ids": p_ids, "prompt_mask": p_mask, "completion_ids": c_ids, "completion_mask": c_mask}

    def run() -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        model.zero_grad()
        logps, entropy = trainer._token_logps(model, batch, with_entropy=True)
        (logps * c_mask).sum().backward()
        return logps.detach() * c_mask, entropy * c_mask, [p.grad.clone() for p in model.parameters()]

    import ablate.methods.grpo as grpo

    calls, groups = [], []
    seen, grouping = grpo.takes_logits_to_keep, scoring.length_groups
    monkeypatch.setattr(grpo, "takes_logits_to_keep", lambda m: calls.append(seen(m)) or seen(m))
    monkeypatch.setattr(scoring, "length_groups", lambda *a: groups.append(grouping(*a)) or groups[-1])
    fast = run()
    monkeypatch.setattr(grpo, "takes_logits_to_keep", lambda m: False)
    trainer.speed_plan = trainer.speed_plan.turned_off("length_groups")
    full = run()
    assert calls and all(calls)  # the fast path was taken
    if path == "length_groups":
        assert len(groups) == 1 and len(groups[0]) > 2  # several groups were scored
    torch.testing.assert_close(fast[0], full[0], rtol=0, atol=1e-5)
    torch.testing.assert_close(fast[1], full[1], rtol=0, atol=1e-5)
    for g_fast, g_full in zip(fast[2], full[2]):
        torch.testing.assert_close(g_fast, g_full, rtol=1e-4, atol=1e-5)
