"""The rollout trainers' prompts (ablate.rollouts.prompts): whole by default, as TRL 1.16; with a limit, each
longer prompt keeps its last N tokens and one warning line per split counts them. TRL's `completions/*` of a
round (ablate.rollouts.stats.completion_metrics), hand-computed. The longest row sizes vLLM's context."""

from __future__ import annotations

import functools
import logging
from types import SimpleNamespace

import pytest
from datasets import Dataset

from ablate.models import byte_tokenizer
from ablate.rollouts.generation import build_generator
from ablate.rollouts.prompts import Cut, cuts_record, longest_row, prompt_rows
from ablate.rollouts.stats import completion_metrics
from ablate.rollouts.vllm import VLLMGenerator

ROWS = [
    {"prompt": "abcdefgh", "letter": "a"},
    {"prompt": "xyz", "letter": "x"},
    {"prompt": "0123456", "letter": "0"},
]


def test_prompts_are_whole_by_default_and_nothing_is_said(caplog):
    tok = byte_tokenizer()
    with caplog.at_level(logging.WARNING, logger="ablate"):
        out, cut = prompt_rows(Dataset.from_list(ROWS), tok, None, "train")
    assert [tok.decode(ids) for ids in out["prompt_ids"]] == ["abcdefgh", "xyz", "0123456"]
    assert out["letter"] == ["a", "x", "0"]  # the rewards' columns stay
    assert cut == Cut(rows=3, cut=0, longest=8) and caplog.records == []


def test_a_limit_keeps_each_long_prompts_end_and_one_line_counts_them(caplog):
    """Limit 5: "abcdefgh" (8) -> "defgh", "0123456" (7) -> "23456", "xyz" (3) stays: 2 of 3 cut."""
    tok = byte_tokenizer()
    with caplog.at_level(logging.WARNING, logger="ablate"):
        out, cut = prompt_rows(Dataset.from_list(ROWS), tok, 5, "eval")
    assert [tok.decode(ids) for ids in out["prompt_ids"]] == ["defgh", "xyz", "23456"]
    assert cut == Cut(rows=3, cut=2, longest=8)
    assert [r.getMessage() for r in caplog.records] == [
        "2 of 3 eval prompts are longer than method.args.max_prompt_length=5: cut to their last 5 tokens "
        "(null keeps whole prompts, as TRL 1.16)"
    ]
    assert cuts_record(5, {"eval": cut}) == {
        "max_prompt_length": 5,
        "eval": {"rows": 3, "cut": 2, "longest": 8},
    }


def test_a_limit_no_prompt_reaches_says_nothing(caplog):
    with caplog.at_level(logging.WARNING, logger="ablate"):
        _, cut = prompt_rows(
            Dataset.from_list(ROWS), byte_tokenizer(), 8, "train"
        )  # the longest is exactly 8
    assert cut.cut == 0 and caplog.records == []


def test_completion_metrics_are_trls():
    """Lengths 3, 5, 8, 2; the 8 was cut at the cap (no EOS). Terminated: 3, 5, 2 -> mean 10/3, min 2, max 5."""
    m = completion_metrics([3.0, 5.0, 8.0, 2.0], [False, False, True, False])
    assert m == pytest.approx(
        {
            "completions/mean_length": 4.5,
            "completions/min_length": 2.0,
            "completions/max_length": 8.0,
            "completions/clipped_ratio": 0.25,
            "completions/mean_terminated_length": 10 / 3,
            "completions/min_terminated_length": 2.0,
            "completions/max_terminated_length": 5.0,
        }
    )


def test_terminated_lengths_are_zero_when_no_completion_ended():
    """TRL's edge case: no completion ended with EOS -> the terminated lengths are those of [0]."""
    m = completion_metrics([8.0, 8.0], [True, True])
    assert m["completions/clipped_ratio"] == 1.0
    assert (
        m["completions/mean_terminated_length"],
        m["completions/min_terminated_length"],
        m["completions/max_terminated_length"],
    ) == (0.0, 0.0, 0.0)


def test_longest_row_is_the_datas_longest_prompt_capped_by_the_limit_plus_the_completion():
    cuts = {"train": Cut(rows=4, cut=0, longest=600), "eval": Cut(rows=2, cut=0, longest=700)}
    assert longest_row(cuts, None, 8) == 708
    assert longest_row(cuts, 512, 8) == 520
    assert longest_row({"train": Cut(rows=4, cut=0, longest=40)}, 512, 8) == 48
    assert longest_row({}, None, 8) is None  # no prompts yet


def test_vllm_engine_context_is_the_longest_row_unless_set():
    """vLLM's default context is the model's (8192 for SmolLM2), more than the KV-cache bound may hold: the
    trainer tells the engine the longest row its data gives; method.rollouts.max_model_len wins when set."""
    args = SimpleNamespace(temperature=1.0, top_p=1.0, top_k=0, max_completion_length=8)
    tok = byte_tokenizer()
    fitted = build_generator(functools.partial(VLLMGenerator), args, tok, longest_row=614)
    assert fitted.engine_args["max_model_len"] == 614
    mine = build_generator(functools.partial(VLLMGenerator, max_model_len=1024), args, tok, longest_row=614)
    assert mine.engine_args["max_model_len"] == 1024
    capped = VLLMGenerator(
        SimpleNamespace(**vars(args), max_prompt_length=64), tok
    )  # as before: the limit + completion
    assert capped.engine_args["max_model_len"] == 72
