"""Every TRL dataset format is tokenised and truncated as TRL 1.16 does it (tokenizers only, no model).

The same rows go through TRL's own `_prepare_dataset` (+ its preference collator, which truncates) and
through ablate's; the token ids and loss masks must be equal. Run on SmolLM2's BPE tokenizer and chat
template (merges at the prompt/completion boundary, special tokens, a default system turn) and on the
tiny model's byte tokenizer. TRL is a dev-only dependency; skipped when it or SmolLM2 is absent.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
from datasets import Dataset

trl = pytest.importorskip("trl")
from trl.trainer.dpo_trainer import DataCollatorForPreference  # noqa: E402

from ablate.data.chat_templates import GENERATION, SMOLLM2  # noqa: E402
from ablate.data.tokenize import prepare_preference, prepare_prompts, prepare_sft  # noqa: E402
from ablate.methods.dpo import DPOCollator  # noqa: E402
from ablate.models.tokenizer import byte_tokenizer  # noqa: E402


def _smollm2(request):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(request.getfixturevalue("smollm2_dir"))


@pytest.fixture(scope="module", params=["smollm2", "byte"])
def tok(request):
    return _smollm2(request) if request.param == "smollm2" else byte_tokenizer()


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def bot(text: str) -> dict[str, str]:
    return {"role": "assistant", "content": text}


SYSTEM = {"role": "system", "content": "Answer in one word."}
# Boundaries chosen to make BPE merge across prompt and completion ("=" + "42", "Hello" + ",", spaces).
PREFERENCE = {
    "standard": [
        {"prompt": "Q: what is 6*7? A:", "chosen": " 42", "rejected": " 41, I think"},
        {"prompt": "Say hello", "chosen": ", world!", "rejected": "Hello"},
        {"prompt": "2+2=", "chosen": "4", "rejected": "5 or so; honestly I do not know what that is"},
    ],
    "standard, implicit prompt": [
        {"chosen": "Human: what is 6*7? Assistant: 42", "rejected": "Human: what is 6*7? Assistant: 41"},
        {"chosen": "Say hello, world!", "rejected": "Say hi"},
        {"chosen": "2+2=4", "rejected": "2+2=5"},
    ],
    "conversational": [
        {"prompt": [user("What is 6*7?")], "chosen": [bot("42")], "rejected": [bot("41, I think.")]},
        {
            "prompt": [SYSTEM, user("Colour of the sky?")],
            "chosen": [bot("Blue")],
            "rejected": [bot("Green, sometimes")],
        },
        {
            "prompt": [user("Hi"), bot("Hello!"), user("Name a fruit")],
            "chosen": [bot("Apple")],
            "rejected": [bot("Carrot")],
        },
    ],
    "conversational, implicit prompt": [  # UltraFeedback's shape
        {
            "chosen": [user("What is 6*7?"), bot("42")],
            "rejected": [user("What is 6*7?"), bot("41, I think.")],
        },
        {
            "chosen": [SYSTEM, user("Colour of the sky?"), bot("Blue")],
            "rejected": [SYSTEM, user("Colour of the sky?"), bot("Green, sometimes")],
        },
        {
            "chosen": [user("Hi"), bot("Hello!"), user("Name a fruit"), bot("Apple")],
            "rejected": [user("Hi"), bot("Hello!"), user("Name a fruit"), bot("Carrot")],
        },
    ],
}
SFT = {
    "prompt-completion": [
        {"prompt": "Q: what is 6*7? A:", "completion": " 42"},
        {"prompt": "Say hello", "completion": ", world!"},
        {"prompt": "2+2=", "completion": "4, as everyone knows by now"},
    ],
    "prompt-completion, conversational": [
        {"prompt": [user("What is 6*7?")], "completion": [bot("42")]},
        {"prompt": [SYSTEM, user("Colour of the sky?")], "completion": [bot("Blue")]},
        {
            "prompt": [user("Hi"), bot("Hello!"), user("Name a fruit")],
            "completion": [bot("Apple, or a pear")],
        },
    ],
    "messages": [
        {"messages": [user("What is 6*7?"), bot("42")]},
        {"messages": [SYSTEM, user("Colour of the sky?"), bot("Blue")]},
        {"messages": [user("Hi"), bot("Hello!"), user("Name a fruit"), bot("Apple, or a pear")]},
    ],
    "text": [{"text": "The sky is blue."}, {"text": "6*7=42"}, {"text": "Hello, world! " * 4}],
}
PROMPTS = {
    "standard": [{"prompt": "Q: what is 6*7? A:"}, {"prompt": "Say hello"}],
    "conversational": [{"prompt": [user("What is 6*7?")]}, {"prompt": [SYSTEM, user("Colour of the sky?")]}],
}


def _trl_preference(rows: list[dict[str, Any]], tok, max_length: int | None) -> dict[str, torch.Tensor]:
    args = SimpleNamespace(dataset_num_proc=None, max_length=max_length, truncation_mode="keep_start")
    ds = trl.DPOTrainer._prepare_dataset(
        SimpleNamespace(_tokenizer=tok), Dataset.from_list(rows), tok, args, "t"
    )
    return DataCollatorForPreference(pad_token_id=tok.pad_token_id, max_length=max_length)(list(ds))


def _short(rows: list[dict[str, Any]], tok) -> int:
    """A max_length that keeps the shortest prompt plus 2 completion tokens: cuts completions, drops
    the pairs with longer prompts."""
    args = SimpleNamespace(dataset_num_proc=None, max_length=None, truncation_mode="keep_start")
    ds = trl.DPOTrainer._prepare_dataset(
        SimpleNamespace(_tokenizer=tok), Dataset.from_list(rows), tok, args, "t"
    )
    return min(len(r["prompt_ids"]) for r in ds) + 2


@pytest.mark.parametrize("fmt", list(PREFERENCE))
@pytest.mark.parametrize("max_length", [None, 1024, "short"])
def test_preference_matches_trl(tok, fmt, max_length):
    rows = PREFERENCE[fmt]
    max_length = _short(rows, tok) if max_length == "short" else max_length
    theirs = _trl_preference(rows, tok, max_length)
    ours_ds = prepare_preference(Dataset.from_list(rows), tok, max_length)
    ours = DPOCollator(tok.pad_token_id)(list(ours_ds))
    for key in ("input_ids", "attention_mask", "completion_mask"):
        assert torch.equal(ours[key], theirs[key]), (fmt, key)
    assert ours["completion_mask"].sum(1).min() > 0  # every kept pair has completion tokens


@pytest.mark.parametrize("fmt", list(PREFERENCE))
def test_short_max_length_cuts_and_drops(tok, fmt):
    """The "short" case above really cuts completions and drops pairs, so it tests something."""
    rows = PREFERENCE[fmt]
    full = prepare_preference(Dataset.from_list(rows), tok, None)
    cut = prepare_preference(Dataset.from_list(rows), tok, _short(rows, tok))
    assert 0 < len(cut) < len(full) or all(len(r["chosen_ids"]) <= 2 for r in cut)
    assert max(len(r["prompt_ids"]) + len(r["chosen_ids"]) for r in cut) <= _short(rows, tok)


# SmolLM2's template marked by hand: an assistant turn's content and its end-of-turn token <|im_end|>; the role
# header and the newline after <|im_end|> are template text (the same text as SMOLLM2, tested below)
SMOLLM2_MARKED = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}"
    "{% if message['role'] == 'assistant' %}{{ '<|im_start|>assistant\n' }}{% generation %}"
    "{{ message['content'] + '<|im_end|>' }}{% endgeneration %}{{ '\n' }}"
    "{% else %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def test_smollm2_marked_renders_as_smollm2(tok):
    messages = SFT["messages"][0]["messages"]
    for gen in (False, True):
        ours = tok.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=gen, chat_template=SMOLLM2
        )
        assert ours == tok.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=gen, chat_template=SMOLLM2_MARKED
        )


def _trl_sft(
    rows: list[dict[str, Any]], tok, max_length: int | None, assistant_only_loss: bool = False
) -> list[dict[str, list[int]]]:
    sample = rows[0]
    # assistant_only_loss: TRL swaps in a template with {% generation %} markers; it has none for SmolLM2's,
    # so it is given one marked by hand, as a TRL user would pass one (ablate finds the turns by rendering prefixes)
    template = None
    if assistant_only_loss and not GENERATION.search(tok.chat_template):
        assert tok.chat_template == SMOLLM2
        template = SMOLLM2_MARKED
    fake = SimpleNamespace(
        _tokenizer=tok,
        chat_template=template,
        completion_only_loss="prompt" in sample and "completion" in sample,
    )  # TRL's None default
    args = SimpleNamespace(
        dataset_num_proc=None,
        dataset_text_field="text",
        assistant_only_loss=assistant_only_loss,
        shuffle_dataset=False,
        max_length=max_length,
        truncation_mode="keep_start",
    )
    ds = trl.SFTTrainer._prepare_dataset(fake, Dataset.from_list(rows), tok, args, False, None, "t")
    return [{"input_ids": r["input_ids"], "labels": r["labels"]} for r in ds]


@pytest.mark.parametrize("fmt", list(SFT))
@pytest.mark.parametrize("max_length", [None, 1024, "short"])
def test_sft_matches_trl(tok, fmt, max_length):
    rows = SFT[fmt]
    if max_length == "short":  # cuts every row; drops prompt-completion rows whose prompt fills it
        max_length = min(len(r["input_ids"]) for r in _trl_sft(rows, tok, None)) - 1
    theirs = _trl_sft(rows, tok, max_length)
    ours = [
        {
            "input_ids": r["prompt_ids"] + r["completion_ids"],
            "labels": [-100] * len(r["prompt_ids"]) + r["completion_ids"],
        }
        for r in prepare_sft(Dataset.from_list(rows), tok, max_length)
    ]
    assert ours == theirs


@pytest.mark.parametrize("fmt", ["messages", "prompt-completion, conversational"])
@pytest.mark.parametrize("max_length", [None, "short"])
def test_sft_assistant_only_loss_matches_trl(tok, fmt, max_length):
    """assistant_only_loss=True: the same ids, and labels only on the assistant turns (content and
    end-of-turn token), in multi-turn conversations too."""
    rows = SFT[fmt]
    if max_length == "short":  # cuts the last assistant turn of every row, keeps one assistant token or more
        max_length = min(len(r["input_ids"]) for r in _trl_sft(rows, tok, None)) - 1
    theirs = _trl_sft(rows, tok, max_length, assistant_only_loss=True)
    ours = [
        {
            "input_ids": r["prompt_ids"] + r["completion_ids"],
            "labels": [-100] * len(r["prompt_ids"])
            + [t if m else -100 for t, m in zip(r["completion_ids"], r["completion_mask"])],
        }
        for r in prepare_sft(Dataset.from_list(rows), tok, max_length, assistant_only_loss=True)
    ]
    assert ours == theirs
    full = [r for r in prepare_sft(Dataset.from_list(rows), tok, None, assistant_only_loss=True)]
    masked = [sum(r["completion_mask"]) for r in full]
    assert all(0 < m < len(r["completion_ids"]) for m, r in zip(masked, full))  # some tokens in, some out


@pytest.mark.parametrize("fmt", list(PROMPTS))
def test_prompts_match_trl(tok, fmt):
    rows = PROMPTS[fmt]
    fake = SimpleNamespace(
        _is_vlm=False,
        environment_factories=None,
        processing_class=tok,
        chat_template=None,
        tools=None,
        chat_template_kwargs={},
    )
    theirs, _, _ = trl.GRPOTrainer._tokenize_prompts(fake, [r["prompt"] for r in rows])
    ours = prepare_prompts(Dataset.from_list(rows), tok, None)["prompt_ids"]
    assert ours == [list(ids) for ids in theirs]
