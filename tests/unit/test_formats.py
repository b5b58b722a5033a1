"""Format detection, implicit-prompt extraction, column mapping, prompt truncation and one-line errors."""

from __future__ import annotations

import pytest
from datasets import Dataset

from ablate.data import DataError, jsonl
from ablate.data.formats import detect, extract_prompt, map_columns
from ablate.data.tokenize import prepare_preference, prepare_prompts, prepare_sft, truncate
from ablate.models.tokenizer import byte_tokenizer


@pytest.fixture(scope="module")
def tok():
    return byte_tokenizer()


@pytest.mark.parametrize(
    "chosen,rejected",
    [
        ("Q: hi A: yes", "Q: hi A: no"),  # differ after a space: the space goes to the completions
        ("abc", "abd"),
        ("abc", "abcd"),  # a prefix of the other: TRL keeps the last shared char out of the prompt
        ("xbc", "ybc"),  # nothing shared
        (
            [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
            [{"role": "user", "content": "q"}, {"role": "assistant", "content": "b"}],
        ),
    ],
)
def test_extract_prompt_is_trls(chosen, rejected):
    trl = pytest.importorskip("trl")
    assert extract_prompt(chosen, rejected) == trl.extract_prompt({"chosen": chosen, "rejected": rejected})


@pytest.mark.parametrize(
    "kind,rows,name",
    [
        ("preference", [{"prompt": "p", "chosen": "a", "rejected": "b"}], "preference"),
        (
            "preference",
            [{"chosen": "pa", "rejected": "pb", "score_chosen": 1.0}],
            "implicit-prompt preference",
        ),
        ("sft", [{"prompt": "p", "completion": "c"}], "prompt-completion"),
        ("sft", [{"messages": [{"role": "user", "content": "x"}]}], "language modeling (conversational)"),
        ("sft", [{"text": "t"}], "language modeling (standard)"),
        ("sft", [{"conversations": [{"from": "user", "value": "x"}]}], "language modeling (conversational)"),
        ("prompt", [{"prompt": "p", "letter": "c"}], "prompt-only"),
    ],
)
def test_detect(kind, rows, name):
    assert detect(Dataset.from_list(rows), kind) == name


@pytest.mark.parametrize(
    "kind,rows,needle",
    [
        ("preference", [{"prompt": "p", "completion": "c"}], "DPO found columns ['completion', 'prompt']"),
        (
            "sft",
            [{"prompt": "p", "chosen": "a", "rejected": "b"}],
            "SFT found columns ['chosen', 'prompt', 'rejected']",
        ),
        (
            "prompt",
            [{"question": "p"}],
            "GRPO found columns ['question'], expected one of [prompt-only: prompt]",
        ),
    ],
)
def test_no_format_is_one_line(kind, rows, needle):
    with pytest.raises(DataError) as e:
        detect(Dataset.from_list(rows), kind)
    assert needle in str(e.value) and "data.columns" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    "rows,needle",
    [
        (
            [{"prompt": "p", "chosen": [{"role": "assistant", "content": "a"}], "rejected": "b"}],
            "row 0: chosen and rejected must both be strings or both lists of messages",
        ),
        ([{"chosen": "xa", "rejected": "yb"}], "row 0: no prompt column and chosen/rejected share no prefix"),
        (
            [
                {"prompt": "p", "chosen": "pa", "rejected": "pb"},
                {"prompt": None, "chosen": "xa", "rejected": "yb"},
            ],
            "row 1: no prompt column and chosen/rejected share no prefix",
        ),  # a null prompt is extracted, as TRL
        ([{"prompt": ["p"], "chosen": ["a"], "rejected": ["b"]}], "row 0: 'prompt' must be a string"),
        ([{"prompt": "p", "chosen": 1, "rejected": 2}], "row 0: 'chosen' must be a string"),
    ],
)
def test_bad_rows_are_one_line(tok, rows, needle):
    with pytest.raises(DataError, match=needle) as e:
        prepare_preference(Dataset.from_list(rows), tok, None)
    assert "\n" not in str(e.value)


def test_max_prompt_length_keeps_the_end_and_max_length_drops():
    ids = {"prompt_ids": list(range(10)), "chosen_ids": [100, 101, 102], "rejected_ids": [200]}
    assert truncate(ids, max_length=None, max_prompt_length=4) == {
        "prompt_ids": [6, 7, 8, 9],
        "chosen_ids": [100, 101, 102],
        "rejected_ids": [200],
    }
    assert truncate(ids, max_length=12) == {
        "prompt_ids": list(range(10)),
        "chosen_ids": [100, 101],
        "rejected_ids": [200],
    }
    assert truncate(ids, max_length=10) is None  # the prompt alone fills it: TRL drops the pair
    assert truncate(ids, max_length=6, max_prompt_length=4) == {
        "prompt_ids": [6, 7, 8, 9],
        "chosen_ids": [100, 101],
        "rejected_ids": [200],
    }
    assert truncate(ids, max_length=None, max_completion_length=1)["chosen_ids"] == [100]


def test_long_prompt_pairs_dropped_or_cut(tok, caplog):
    """Issue 12: a 5000-token prompt is no longer trained whole; it is dropped (TRL) or its end kept."""
    rows = [
        {"prompt": "x" * 5000 + " sort: cba =", "chosen": " abc", "rejected": " bca"},
        {"prompt": "sort: ba =", "chosen": " ab", "rejected": " ba"},
    ]
    kept = prepare_preference(Dataset.from_list(rows), tok, max_length=64)
    assert len(kept) == 1 and "dropped 1 of 2 train pairs" in caplog.text
    cut = prepare_preference(Dataset.from_list(rows), tok, max_length=64, max_prompt_length=32)
    assert len(cut) == 2 and tok.decode(cut[0]["prompt_ids"]).endswith("x sort: cba =")
    assert len(cut[0]["prompt_ids"]) == 32 and tok.decode(cut[0]["chosen_ids"]) == " abc</s>"
    with pytest.raises(DataError, match="every train pair was dropped"):
        prepare_preference(Dataset.from_list(rows[:1]), tok, max_length=64)


def test_implicit_prompt_conversational_extracts_shared_turns(tok):
    q = [{"role": "user", "content": "sort: cba"}]
    rows = [
        {
            "chosen": q + [{"role": "assistant", "content": "abc"}],
            "rejected": q + [{"role": "assistant", "content": "bca"}],
            "score_chosen": 9.0,
            "score_rejected": 2.0,
        }
    ]
    out = prepare_preference(Dataset.from_list(rows), tok, None)[0]
    assert tok.decode(out["prompt_ids"]) == "<|user|>sort: cba</s>\n<|assistant|>"
    assert tok.decode(out["chosen_ids"]) == "abc</s>\n" and tok.decode(out["rejected_ids"]) == "bca</s>\n"


def test_sft_loss_tokens(tok):
    pc = prepare_sft(Dataset.from_list([{"prompt": "sort: ba =", "completion": " ab"}]), tok, None)[0]
    assert tok.decode(pc["prompt_ids"]) == "sort: ba =" and tok.decode(pc["completion_ids"]) == " ab</s>"
    everything = prepare_sft(
        Dataset.from_list([{"prompt": "sort: ba =", "completion": " ab"}]),
        tok,
        None,
        completion_only_loss=False,
    )[0]
    assert everything["prompt_ids"] == [] and tok.decode(everything["completion_ids"]) == "sort: ba = ab</s>"
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    lm = prepare_sft(Dataset.from_list([{"messages": msgs}]), tok, None)[0]
    assert (
        lm["prompt_ids"] == [] and tok.decode(lm["completion_ids"]) == "<|user|>hi</s>\n<|assistant|>yo</s>\n"
    )


def test_prompt_only_keeps_other_columns(tok):
    out = prepare_prompts(Dataset.from_list([{"prompt": "cccc", "letter": "c"}]), tok, 2)
    assert out[0]["letter"] == "c" and tok.decode(out[0]["prompt_ids"]) == "cc"


def test_column_mapping(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"question": "q", "good": "a", "bad": "b", "prompt": "ignored"}\n')
    ds = jsonl(
        str(path), columns={"prompt": "question", "chosen": "good", "rejected": "bad", "text": None}
    ).train
    assert ds[0] == {"prompt": "q", "chosen": "a", "rejected": "b"}
    with pytest.raises(DataError, match=r"data.columns: no column \['answer'\] in the data \(found") as e:
        map_columns(ds, {"completion": "answer"})
    assert "\n" not in str(e.value)
    with pytest.raises(DataError, match="data.columns.answer: unknown role"):
        map_columns(ds, {"answer": "prompt"})


def test_hub_loader_reads_local_copies(tmp_path):
    """data=ultrafeedback_binarized data.path=<a file | a dir of split files | a save_to_disk dir> offline."""
    from datasets import DatasetDict

    from ablate.data import hub

    rows = [{"chosen": "Q: a A: yes", "rejected": "Q: a A: no", "score_chosen": 1.0}] * 3
    (tmp_path / "files").mkdir()
    for split in ("train", "test"):
        (tmp_path / "files" / f"{split}.jsonl").write_text(
            "".join(__import__("json").dumps(r) + "\n" for r in rows)
        )
    DatasetDict({"train": Dataset.from_list(rows), "test": Dataset.from_list(rows[:1])}).save_to_disk(
        tmp_path / "dd"
    )
    one = hub(str(tmp_path / "files" / "train.jsonl"), eval_split="test")
    assert len(one.train) == 3 and one.eval is None
    files = hub(str(tmp_path / "files"), eval_split="test", max_train_samples=2)
    assert len(files.train) == 2 and len(files.eval) == 3
    saved = hub(str(tmp_path / "dd"), eval_split="test")
    assert len(saved.train) == 3 and len(saved.eval) == 1 and saved.train.column_names == list(rows[0])
    with pytest.raises(DataError, match="no split 'valid'"):
        hub(str(tmp_path / "dd"), eval_split="valid")
