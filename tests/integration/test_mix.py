"""data=mix through the CLI, from a scratch dir: two shipped DPO datasets of different formats (the letter-sorting
pairs as text, the ALL-CAPS pairs as chat messages) train as one, run.json records each source's data, weight
and rows, the tokenized-rows cache hits for the same mix and misses for another weight; bad weights and
sources of different kinds are one line before any run dir exists. The mixing itself: tests/unit/test_mixture.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import ablate, summary

ENV = {"OMP_NUM_THREADS": "1"}


def _runs(cwd: Path) -> list[Path]:
    return sorted(p.parent for p in (cwd / "outputs" / "runs").glob("*/*/run.json"))


def _tokenized_hits(run_dir: Path) -> list[bool]:
    info = json.loads((run_dir / "run.json").read_text())
    return [e["hit"] for e in info["cache"]["launches"][-1] if e["what"].startswith("tokenized")]


def test_two_dataset_mix_trains_and_is_recorded(tmp_path):
    env = {**ENV, "ABLATE_CACHE": str(tmp_path / "cache")}
    r = ablate("train", "data=mix", "method.args.max_steps=2", cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    (run,) = _runs(tmp_path)
    assert summary(run)["status"] == "completed" and summary(run)["global_step"] == 2
    info = json.loads((run / "run.json").read_text())
    sources = info["data_mix"]["sources"]
    assert {
        n: (s["name"], s["weight"], s["share"], s["rows"], s["available"]) for n, s in sources.items()
    } == {"sort": ("sort_prefs", 1.0, 0.5, 152, 512), "caps": ("caps_prefs", 1.0, 0.5, 152, 152)}
    assert info["data_mix"]["seed"] == 0 and info["data"]["train"]["rows"] == 304 == info["data_mix"]["size"]
    assert _tokenized_hits(run) == [False]

    again = ablate(
        "train", "data=mix", "method.args.max_steps=2", cwd=tmp_path, env=env
    )  # a new run, the same mix
    assert again.returncode == 0, again.stderr[-3000:]
    assert _tokenized_hits(_runs(tmp_path)[-1]) == [True]

    more = ablate(
        "train", "data=mix", "data.sources.caps.weight=3", "method.args.max_steps=2", cwd=tmp_path, env=env
    )
    assert more.returncode == 0, more.stderr[-3000:]
    (weighted,) = [p for p in _runs(tmp_path) if "weight-3" in p.name]
    mixed = json.loads((weighted / "run.json").read_text())["data_mix"]["sources"]
    # 202 rows: the most that repeat none of caps' 152 at 75% (151.5 each way, the tie to sort)
    assert (mixed["sort"]["rows"], mixed["caps"]["rows"], mixed["caps"]["share"]) == (51, 151, 0.75)
    assert _tokenized_hits(weighted) == [
        False
    ]  # the cache key covers the weights (the mixed rows themselves)


def test_a_source_of_another_format_for_sft(tmp_path):
    """Swap and add sources from the command line: text prompt/completion, chat messages and chat prompt/completion."""
    r = ablate(
        "train",
        "method=sft",
        "data=mix",
        "data@data.sources.sort=tiny_sft",
        "data@data.sources.caps=caps_messages",
        "+data@data.sources.chat=caps_sft",
        "+data.sources.chat.weight=2",
        "method.args.max_steps=2",
        cwd=tmp_path,
        env=ENV,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    (run,) = _runs(tmp_path)
    sources = json.loads((run / "run.json").read_text())["data_mix"]["sources"]
    assert {n: (s["name"], s["rows"], s["kind"]) for n, s in sources.items()} == {
        "sort": ("sort_sft", 76, "SFT"),
        "caps": ("caps_messages", 76, "SFT"),
        "chat": ("caps_sft", 152, "SFT"),
    }
    assert summary(run)["status"] == "completed"


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["data.sources.caps.weight=-1"], "data.sources.caps.weight=-1: must be a number >= 0"),
        (["data.sources.caps.weight=lots"], "data.sources.caps.weight=lots: must be a number >= 0"),
        (
            ["data.sources.caps.weight=0", "data.sources.sort.weight=0"],
            "data.sources.sort.weight=0: must be a number > 0 for at least one source",
        ),
        (["+data.sources.extra.weight=2"], "data.sources.extra={'weight': 2}: must be a data config"),
        (["data.size=0"], "data.size=0: must be null"),
        (
            ["method=grpo", "+data@data.sources.words=one_word_prompts"],
            "data.sources: 'sort' holds preference rows, 'words' prompt-only rows; a mix is of one kind",
        ),
        (
            ["+data@data.sources.words=one_word_prompts"],  # DPO: the prompt-only source is named
            "data.sources.words.name=one_word_prompts: DPO found columns ['answer', 'prompt']",
        ),
    ],
)
def test_bad_mix_is_one_line_and_creates_nothing(tmp_path, overrides, message):
    r = ablate("train", "data=mix", *overrides, cwd=tmp_path, env=ENV)
    assert r.returncode != 0, r.stdout[-2000:]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"ablate: error: {message}"), r.stderr[-2000:]
    assert not (tmp_path / "outputs").exists()
