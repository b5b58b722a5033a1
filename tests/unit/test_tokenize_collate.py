"""Tokenisation and batching: the byte tokenizer, EOS placement, chat messages, DPO/SFT collators."""

import pytest

from ablate.data import DataError
from ablate.data.tokenize import encode_completion, encode_prompt, tokenize_sft
from ablate.methods.dpo import DPOCollator
from ablate.methods.sft import SFTCollator
from ablate.models.tokenizer import byte_tokenizer


@pytest.fixture(scope="module")
def tok():
    return byte_tokenizer()


def test_byte_tokenizer_round_trips_and_adds_no_eos(tok):
    ids = tok("sort: cba =", add_special_tokens=False)["input_ids"]
    assert len(ids) == len("sort: cba =")  # one token per byte
    assert tok.eos_token_id not in ids
    assert tok.decode(ids) == "sort: cba ="
    assert tok.decode(tok("héllo ✓")["input_ids"]) == "héllo ✓"  # multi-byte UTF-8


def test_prompt_has_no_eos_completion_ends_with_eos(tok):
    p = encode_prompt(tok, "sort: cba =")
    c = encode_completion(tok, "sort: cba =", " abc")
    assert tok.eos_token_id not in p
    assert c[-1] == tok.eos_token_id and tok.decode(c[:-1]) == " abc"


def test_chat_messages(tok):
    """Messages: the template's end-of-turn (EOS for the tiny template) ends the completion; no extra EOS."""
    prompt = [{"role": "user", "content": "sort: cba"}]
    completion = [{"role": "assistant", "content": "abc"}]
    ids = tokenize_sft(tok, {"prompt": prompt, "completion": completion})
    assert tok.decode(ids["prompt_ids"]) == "<|user|>sort: cba</s>\n<|assistant|>"
    assert tok.decode(ids["completion_ids"]) == "abc</s>\n"
    with pytest.raises(DataError, match="row 0: 'completion' must be a list of"):
        tokenize_sft(tok, {"prompt": prompt, "completion": "abc"})


def test_dpo_collator_layout():
    rows = [
        {
            "prompt_ids": [5, 6],
            "chosen_ids": [7, 2],
            "rejected_ids": [8, 9, 2],
            "ref_chosen_logps": -1.0,
            "ref_rejected_logps": -2.0,
        },
        {
            "prompt_ids": [5],
            "chosen_ids": [7, 7, 2],
            "rejected_ids": [2],
            "ref_chosen_logps": -3.0,
            "ref_rejected_logps": -4.0,
        },
    ]
    b = DPOCollator(pad_token_id=0)(rows)
    # rows: chosen 0, chosen 1, rejected 0, rejected 1
    assert b["input_ids"].tolist() == [[5, 6, 7, 2, 0], [5, 7, 7, 2, 0], [5, 6, 8, 9, 2], [5, 2, 0, 0, 0]]
    assert b["completion_mask"].tolist() == [
        [0, 0, 1, 1, 0],
        [0, 1, 1, 1, 0],
        [0, 0, 1, 1, 1],
        [0, 1, 0, 0, 0],
    ]
    assert b["attention_mask"].tolist() == [
        [1, 1, 1, 1, 0],
        [1, 1, 1, 1, 0],
        [1, 1, 1, 1, 1],
        [1, 1, 0, 0, 0],
    ]
    assert b["ref_chosen_logps"].tolist() == [-1.0, -3.0]
    assert b["ref_rejected_logps"].tolist() == [-2.0, -4.0]


def test_sft_collator_labels_only_completion():
    b = SFTCollator(pad_token_id=0)(
        [{"prompt_ids": [5, 6], "completion_ids": [7, 2]}, {"prompt_ids": [5], "completion_ids": [2]}]
    )
    assert b["labels"].tolist() == [[-100, -100, 7, 2], [-100, 2, -100, -100]]


@pytest.mark.parametrize(
    "content,needle",
    [
        ('{"prompt": "a", "chosen": "b", "rejected": "c"}\n{not json\n', "line 2 is not valid JSON"),
        ('["a", "b"]\n', "line 1 is a JSON list, not an object"),
        (
            '{"prompt": "a\tb", "chosen": "b", "rejected": "c"}\n',  # a raw tab in a string: once "at at column 14"
            r"line 1 is not valid JSON \(Invalid control character at column 14\)",
        ),
        ("\n\n", "has no examples"),
    ],
)
def test_bad_jsonl_names_file_and_line(tmp_path, content, needle):
    from ablate.data import jsonl

    path = tmp_path / "rows.jsonl"
    path.write_text(content)
    with pytest.raises(DataError, match=needle) as e:
        jsonl(str(path))
    assert str(path) in str(e.value) and "\n" not in str(e.value)
