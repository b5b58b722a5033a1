"""Held-out data is held out: no shipped eval prompt occurs in a shipped training file, the generators
rebuild the shipped files byte for byte, and `ablate.data.overlap` compares prompts as documented."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ablate.data import make_calc, make_chat, make_prompts, make_tiny
from ablate.data.overlap import prompt_key, shared_prompts, warning

TINY = Path(make_tiny.__file__).parent / "tiny"
EVALS = sorted(TINY.glob("*_eval.jsonl"))
TRAINS = sorted(TINY.glob("*_train.jsonl"))


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_every_shipped_eval_file_has_its_training_file():
    assert len(EVALS) >= 9
    assert {p.name.replace("_eval", "_train") for p in EVALS} <= {p.name for p in TRAINS}


@pytest.mark.parametrize("held_out", EVALS, ids=lambda p: p.stem)
def test_no_eval_prompt_occurs_in_any_training_file(held_out):
    """Its own training file, and every other one too (sort_prefs and sort_sft share examples; a user may
    train on one task's file and evaluate on a sibling's)."""
    rows = _rows(held_out)
    assert all(prompt_key(r) is not None for r in rows)
    for train in TRAINS:
        assert shared_prompts(_rows(train), rows) == (0, len(rows)), (held_out.name, train.name)


@pytest.mark.parametrize("module", [make_tiny, make_prompts, make_chat, make_calc], ids=lambda m: m.__name__)
def test_generators_rebuild_the_shipped_files(module, tmp_path, monkeypatch):
    """Seeded: rerunning a generator gives the shipped files (the held-out splits above included)."""
    monkeypatch.setattr(module, "OUT", tmp_path)
    module.main()
    made = sorted(tmp_path.glob("*.jsonl"))
    assert made
    for path in made:
        assert path.read_bytes() == (TINY / path.name).read_bytes(), path.name


def test_repeat_letter_eval_holds_out_prompt_lengths_not_letters():
    """Only 8 train prompts exist: eval asks for the same letters at counts training never uses."""
    train, held_out = _rows(TINY / "repeat_letter_train.jsonl"), _rows(TINY / "repeat_letter_eval.jsonl")
    assert {r["letter"] for r in held_out} == {r["letter"] for r in train}
    assert {len(r["prompt"]) for r in train} == {make_prompts.TRAIN_REPEATS}
    assert make_prompts.TRAIN_REPEATS not in {len(r["prompt"]) for r in held_out}
    assert len({r["prompt"] for r in held_out}) == len(held_out) == 64


def _user(text: str) -> dict:
    return {"role": "user", "content": text}


def test_a_prompt_is_what_it_asks():
    system = {"role": "system", "content": "Be brief."}
    answer = {"role": "assistant", "content": "Paris."}
    # messages: the user turns; a system prompt or an answer does not make a question new
    assert prompt_key({"prompt": [system, _user("Capital of France?")]}) == ("Capital of France?",)
    assert prompt_key({"messages": [_user("Capital of France?"), answer]}) == ("Capital of France?",)
    assert prompt_key(
        {"conversations": [{"from": "user", "value": "Hi"}, {"from": "assistant", "value": "Yo"}]}
    ) == ("Hi",)
    assert prompt_key({"prompt": [_user("a"), answer, _user("b")]}) == ("a", "b")  # every user turn, in order
    assert prompt_key({"prompt": [{"role": "user", "content": [{"type": "text", "text": "Hi  there"}]}]}) == (
        "Hi there",
    )
    # strings: whitespace normalised, case kept (it can be the task)
    assert prompt_key({"prompt": "  sort:  dcba =\n"}) == "sort: dcba ="
    assert prompt_key({"prompt": "ABC"}) != prompt_key({"prompt": "abc"})
    # implicit prompt: the shared prefix TRL takes; text rows: the text; tokenised rows: the ids
    assert prompt_key(
        {
            "chosen": [_user("Q?"), answer],
            "rejected": [_user("Q?"), {"role": "assistant", "content": "Rome."}],
        }
    ) == ("Q?",)
    assert prompt_key({"chosen": "Q: x A: yes", "rejected": "Q: x A: no"}) == "Q: x A:"
    assert prompt_key({"text": "once upon a time"}) == "once upon a time"
    assert prompt_key({"prompt_ids": [1, 2, 3], "chosen_ids": [4]}) == (1, 2, 3)
    assert prompt_key({"prompt": [system]}) is None  # no user turn: nothing to compare


def test_shared_prompts_counts_eval_rows_and_the_warning_says_so():
    train = [{"prompt": "a"}, {"prompt": "b"}, {"prompt": "b"}]
    held_out = [{"prompt": "b"}, {"prompt": " b"}, {"prompt": "c"}, {"prompt": [_user("a")]}]
    assert shared_prompts(train, held_out) == (
        2,
        4,
    )  # a string "a" is not the message "a": a chat template differs
    assert warning(2, 4, "train.jsonl") == (
        "warning: 2 of 4 eval prompts also occur in the training data "
        "(train.jsonl): held-out metrics will overstate"
    )
    assert warning(0, 4, "train.jsonl") is None
