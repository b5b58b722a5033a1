"""data=mix (ablate.data.mixture): weights -> rows exactly, the same seed -> the same rows in the same order,
sources of any format in one dataset, and the refusals (bad weights, sources of different kinds). The CLI's
path (a mix trained from a scratch dir, run.json, the cache, the refusals before a run dir): tests/integration/
test_mix.py."""

from __future__ import annotations

import json
import random
from collections import Counter
from fractions import Fraction

import pytest

from ablate.data.mixture import draw, mix, shares
from ablate.errors import ConfigError, DataError
from ablate.schema.nodes import Mix


def _f(*ws):
    return [Fraction(w) for w in ws]


@pytest.mark.parametrize(
    "weights,available,size,want",
    [
        ((3, 1), (1000, 1000), 100, [75, 25]),  # the shares, exactly
        (
            (1, 1),
            (512, 152),
            None,
            [152, 152],
        ),  # null size: the largest mix that repeats no row (caps runs out first)
        ((1, 2), (100, 100), None, [50, 100]),
        (
            (1, 1, 1),
            (9, 9, 9),
            10,
            [4, 3, 3],
        ),  # largest remainder, ties to the earlier source: counts sum to size
        ((2, 0), (10, 10), None, [10, 0]),  # weight 0: no rows (its eval split stays)
        ((1, 1), (10, 10), 50, [25, 25]),  # a share past the source repeats it
        ((0.3, 0.7), (1000, 1000), 10, [3, 7]),
    ],
)
def test_weights_to_rows(weights, available, size, want):
    assert shares(_f(*weights), list(available), size) == want


def test_null_size_never_repeats_a_row():
    rng = random.Random(0)
    for _ in range(500):
        k = rng.randint(1, 4)
        weights = [Fraction(rng.choice([0, 1, 2, 3, 0.5, 0.25, 7])) for _ in range(k)]
        weights[rng.randrange(k)] = Fraction(rng.randint(1, 5))
        available = [rng.randint(1, 300) for _ in range(k)]
        counts = shares(weights, available, None)
        assert all(c <= n for c, n in zip(counts, available)), (weights, available, counts)
        # and it is the largest such mix: the source that bounds it has less than one draw of its own left
        assert any(n - c < 1 + w / sum(weights) for c, n, w in zip(counts, available, weights) if w > 0)


def test_draw_is_seeded_and_a_larger_share_only_adds_rows():
    assert draw(100, 30, 0, "a").tolist() == draw(100, 30, 0, "a").tolist()
    assert draw(100, 30, 0, "a").tolist() != draw(100, 30, 1, "a").tolist()
    assert draw(100, 30, 0, "a").tolist() != draw(100, 30, 0, "b").tolist()  # each source its own permutation
    assert draw(100, 60, 0, "a").tolist()[:30] == draw(100, 30, 0, "a").tolist()
    assert sorted(draw(100, 100, 0, "a").tolist()) == list(range(100))  # one whole pass: every row once
    repeated = Counter(draw(10, 25, 0, "a").tolist())
    assert sorted(repeated.values()) == [2] * 5 + [3] * 5  # two whole passes, then half of a third


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.fixture
def sources(tmp_path):
    """Two preference sources in different formats: text rows (a prompt that parses as JSON: "42") and chat rows."""
    text = _write(
        tmp_path / "text.jsonl", [{"prompt": "42", "chosen": f" t{i}", "rejected": " x"} for i in range(40)]
    )
    chat = _write(
        tmp_path / "chat.jsonl",
        [
            {
                "prompt": [{"role": "user", "content": f"q{i}"}],
                "chosen": [{"role": "assistant", "content": f"c{i}"}],
                "rejected": [{"role": "assistant", "content": "no"}],
            }
            for i in range(20)
        ],
    )
    ev = _write(tmp_path / "ev.jsonl", [{"prompt": "e", "chosen": " a", "rejected": " b"}] * 3)
    return {
        "text": {"_target_": "ablate.data.local", "train_path": text, "eval_path": ev, "weight": 3},
        "chat": {"_target_": "ablate.data.local", "train_path": chat, "weight": 1},
    }


def _source(row):
    return "chat" if isinstance(row["prompt"], list) else "text"


def test_mix_rows_recorded_and_deterministic(sources):
    data = mix(sources, seed=5, size=40)
    assert Counter(_source(r) for r in data.train) == {"text": 30, "chat": 10}
    order = [_source(r) for r in data.train]
    assert order != sorted(order) and order != sorted(
        order, reverse=True
    )  # shuffled together, not source after source
    texts = [r for r in data.train if _source(r) == "text"]
    assert all(r["prompt"] == "42" and isinstance(r["prompt"], str) for r in texts)  # not the number 42
    chats = [r for r in data.train if _source(r) == "chat"]
    assert all(r["chosen"][0]["role"] == "assistant" for r in chats)
    assert data.mix["sources"]["text"] | {"train_path": None} == {
        "target": "ablate.data.local",
        "train_path": None,
        "eval_path": sources["text"]["eval_path"],
        "weight": 3.0,
        "share": 0.75,
        "rows": 30,
        "available": 40,
        "eval_rows": 3,
        "kind": "preference",
    }
    assert data.mix["sources"]["chat"]["rows"] == 10 and data.mix["sources"]["chat"]["eval_rows"] == 0
    assert data.mix["size"] == 40 and data.mix["seed"] == 5
    assert len(data.eval) == 3  # every source's eval split, whole
    again = mix(sources, seed=5, size=40)
    assert list(again.train) == list(data.train)  # same seed: same rows, same order
    other = mix(sources, seed=6, size=40)
    assert list(other.train) != list(data.train)
    assert Counter(_source(r) for r in other.train) == {"text": 30, "chat": 10}  # the counts are the weights'


def test_mix_of_sft_formats(tmp_path):
    """prompt-completion text rows with messages rows: each row keeps its own format (the others' columns null)."""
    pc = _write(tmp_path / "pc.jsonl", [{"prompt": "p", "completion": " c"}] * 4)
    msgs = _write(
        tmp_path / "m.jsonl",
        [{"messages": [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]}] * 4,
    )
    data = mix(
        {
            "pc": {"_target_": "ablate.data.local", "train_path": pc},
            "m": {"_target_": "ablate.data.local", "train_path": msgs},
        },
        seed=0,
    )
    rows = list(data.train)
    assert (
        len(rows) == 8
        and sum(r["messages"] is None for r in rows) == 4
        and sum(r["prompt"] is None for r in rows) == 4
    )
    from ablate.data.tokenize import prepare_sft
    from ablate.models.tokenizer import byte_tokenizer

    tok = byte_tokenizer()
    done = prepare_sft(data.train, tok, None)
    texts = sorted({tok.decode(r["prompt_ids"] + r["completion_ids"]) for r in done})
    assert texts == ["<|user|>u</s>\n<|assistant|>a</s>\n", "p c</s>"]


def test_sources_of_different_kinds_are_refused(tmp_path, sources):
    prompts = _write(tmp_path / "p.jsonl", [{"prompt": "p"}] * 3)
    with pytest.raises(DataError) as e:
        mix({**sources, "words": {"_target_": "ablate.data.local", "train_path": prompts}})
    assert str(e.value).startswith(
        "data.sources: 'text' holds preference rows, 'words' prompt-only rows; a mix is of one kind"
    ) and "\n" not in str(e.value)


def test_a_sources_error_names_it(sources):
    with pytest.raises(DataError, match=r"^data\.sources\.chat: train file not found: /nowhere$"):
        mix({**sources, "chat": {"_target_": "ablate.data.local", "train_path": "/nowhere"}})


@pytest.mark.parametrize(
    "change,key,what",
    [
        ({"weight": -1}, "data.sources.chat.weight=-1", "must be a number >= 0"),
        ({"weight": "many"}, "data.sources.chat.weight=many", "must be a number >= 0"),
        ({"weight": True}, "data.sources.chat.weight=true", "must be a number >= 0"),
        ({"weight": float("inf")}, "data.sources.chat.weight=inf", "must be a number >= 0"),
        (
            {"max_train_samples": 0},
            "data.sources.chat.max_train_samples=0",
            "must be null or an integer >= 1",
        ),
    ],
)
def test_bad_weights_and_limits(sources, change, key, what):
    with pytest.raises(ConfigError) as e:
        mix({**sources, "chat": {**sources["chat"], **change}})
    assert str(e.value).startswith(f"{key}: {what}"), e.value


def test_every_weight_zero_and_no_sources_are_refused(sources):
    zero = {n: {**s, "weight": 0} for n, s in sources.items()}
    with pytest.raises(
        ConfigError, match=r"^data\.sources\.text\.weight=0: must be a number > 0 for at least one"
    ):
        mix(zero)
    problems = list(Mix.of({"sources": {}, "seed": 0, "size": None}).problems())
    assert [p[0] for p in problems] == ["data.sources"]
    dangling = list(Mix.of({"sources": {**sources, "x": {"weight": 2}}, "seed": 0, "size": None}).problems())
    assert [p[0] for p in dangling] == ["data.sources.x"] and "~data.sources.x" in dangling[0][2]
    assert [p[0] for p in Mix.of({"sources": sources, "seed": -1, "size": 0}).problems()] == [
        "data.seed",
        "data.size",
    ]


def test_kto_unpairs_a_mix_of_text_and_chat_pairs(sources):
    """KTO's unpairing (a batched map) keeps each row's own value: the text prompt "42" stays a string."""
    from ablate.data.unpaired import unpair

    rows = list(unpair(mix(sources, seed=0, size=8).train))
    assert len(rows) == 16 and sum(r["label"] for r in rows) == 8
    text = [r for r in rows if isinstance(r["prompt"], str)]
    assert len(text) == 12 and all(r["prompt"] == "42" for r in text)
    assert all(isinstance(r["completion"], list) for r in rows if isinstance(r["prompt"], list))
