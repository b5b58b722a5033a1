"""SFT's assistant-only loss on real chat templates that have no {% generation %} markers: the assistant tokens
are found by rendering prefixes (ablate.data.chat_templates.assistant_mask). Checked by hand on a two-turn
conversation with Qwen2.5's and Llama 3's templates (as TRL 1.16 ships them, trl/chat_templates/, read as files:
no TRL import) and SmolLM2's (as its tokenizer ships it): the mask is 1 on exactly the characters of each
assistant turn's content and end-of-turn token. The byte tokenizer (one token per character) makes the
expected mask exact; SmolLM2's BPE tokenizer (when fetched) checks merges and special tokens."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from ablate.data.chat_templates import SMOLLM2, assistant_mask
from ablate.errors import DataError
from ablate.models.tokenizer import byte_tokenizer

TRL = importlib.util.find_spec("trl")
TEMPLATES = Path(TRL.submodule_search_locations[0]) / "chat_templates" if TRL else None
CONVERSATION = [
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "4."},
    {"role": "user", "content": "And 3+3?"},
    {"role": "assistant", "content": "6."},
]
# each template's text of the conversation above, by hand, and what is marked (⟦...⟧) in it
BY_HAND = {
    "qwen2_5": "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n⟦4.<|im_end|>⟧\n"
    "<|im_start|>user\nAnd 3+3?<|im_end|>\n<|im_start|>assistant\n⟦6.<|im_end|>⟧\n",
    "llama3": "<s><|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>"
    "<|start_header_id|>assistant<|end_header_id|>\n\n⟦4.<|eot_id|>⟧"
    "<|start_header_id|>user<|end_header_id|>\n\nAnd 3+3?<|eot_id|>"
    "<|start_header_id|>assistant<|end_header_id|>\n\n⟦6.<|eot_id|>⟧",
    "smollm2": "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n⟦4.<|im_end|>⟧\n"
    "<|im_start|>user\nAnd 3+3?<|im_end|>\n<|im_start|>assistant\n⟦6.<|im_end|>⟧\n",
}


def template(name: str) -> str:
    if name == "smollm2":
        return SMOLLM2
    if TEMPLATES is None:
        pytest.skip("TRL (the dev extra) ships the templates")
    return (TEMPLATES / f"{name}.jinja").read_text(encoding="utf-8")


def with_template(tok, name: str):
    tok.chat_template = template(name)
    return tok


def expected(marked: str) -> tuple[str, list[int]]:
    """The text without the ⟦⟧ marks, and a 1 for each character between them."""
    text, mask, inside = "", [], False
    for ch in marked:
        if ch in "⟦⟧":
            inside = ch == "⟦"
            continue
        text += ch
        mask.append(int(inside))
    return text, mask


def marked_runs(tok, ids: list[int], mask: list[int]) -> list[str]:
    """The decoded runs of consecutive masked tokens."""
    runs, run = [], []
    for token, m in [*zip(ids, mask), (None, 0)]:
        if m:
            run.append(token)
        elif run:
            runs.append(tok.decode(run))
            run = []
    return runs


@pytest.mark.parametrize("name", list(BY_HAND))
def test_mask_covers_exactly_the_assistant_turns(name):
    tok = with_template(byte_tokenizer(), name)
    text, want = expected(BY_HAND[name])
    assert (
        tok.apply_chat_template(CONVERSATION, tokenize=False) == text
    )  # the hand-written text is the template's
    ids, mask = assistant_mask(tok, CONVERSATION, 0)
    assert ids == list(tok.apply_chat_template(CONVERSATION, tokenize=True, return_dict=True)["input_ids"])
    pieces = [tok.decode([token]) for token in ids]  # one character each, but <s> (Llama 3's BOS): one token
    assert "".join(pieces) == text
    per_char = [m for piece, m in zip(pieces, mask) for _ in piece]
    assert per_char == want


@pytest.mark.parametrize("name", list(BY_HAND))
def test_mask_on_smollm2_bpe_tokenizer(name, smollm2_tokenizer):
    """The same turns with merges and special tokens: whole tokens, decoding to the turns' text."""
    tok = with_template(smollm2_tokenizer, name)
    ids, mask = assistant_mask(tok, CONVERSATION, 0)
    assert ids == list(tok.apply_chat_template(CONVERSATION, tokenize=True, return_dict=True)["input_ids"])
    end = {"llama3": "<|eot_id|>"}.get(name, "<|im_end|>")
    runs = marked_runs(tok, ids, mask)
    if (
        name == "llama3"
    ):  # its <|eot_id|> is not one of SmolLM2's tokens: the BPE token holding its last ">" counts
        assert [r.removesuffix("<") for r in runs] == [f"4.{end}", f"6.{end}"]
    else:
        assert runs == [f"4.{end}", f"6.{end}"]


@pytest.fixture
def smollm2_tokenizer(smollm2_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    assert tok.chat_template == SMOLLM2  # the constant is SmolLM2's template as shipped
    return tok


def test_llama3_matches_trls_marked_copy():
    """TRL marks Llama 3's assistant turns by hand (llama3_training.jinja): the same tokens as rendering prefixes."""
    conversation = [{"role": "system", "content": "Be brief."}, *CONVERSATION]
    ours = assistant_mask(with_template(byte_tokenizer(), "llama3"), conversation, 0)
    theirs = assistant_mask(
        with_template(byte_tokenizer(), "llama3_training"), conversation, 0
    )  # markers path
    assert ours == theirs and sum(ours[1]) == 2 * len("4.<|eot_id|>")


def test_a_trailer_after_the_last_turn_is_not_the_assistants():
    """Phi-3's template writes EOS after a conversation that ends without a generation prompt: not an assistant token."""
    tok = with_template(byte_tokenizer(), "phi3")
    ids, mask = assistant_mask(tok, CONVERSATION, 0)
    assert tok.decode(ids).endswith("6.<|end|>\n</s>")
    assert marked_runs(tok, ids, mask) == ["4.<|end|>", "6.<|end|>"]


def test_template_with_markers_uses_them():
    """The tiny model's template has {% generation %} markers: transformers' mask, content and EOS."""
    tok = byte_tokenizer()
    ids, mask = assistant_mask(tok, CONVERSATION, 0)
    assert marked_runs(tok, ids, mask) == ["4.</s>", "6.</s>"]


def test_template_that_rewrites_earlier_turns_is_refused():
    """Qwen3's template renders an assistant turn with an empty <think></think> only while it is the last one:
    prefixes do not match; one line, never a guess."""
    tok = with_template(byte_tokenizer(), "qwen3")
    with pytest.raises(DataError) as e:
        assistant_mask(tok, CONVERSATION, 7)
    message = str(e.value)
    assert "\n" not in message and message.startswith("data: row 7: method.args.assistant_only_loss=true")
    assert (
        "message 1 (assistant) differently once later messages follow" in message
        and "{% generation %}" in message
    )


def test_conversation_opening_with_the_assistant_is_refused():
    """Nothing renders before the first message (transformers refuses an empty conversation): one line."""
    tok = with_template(byte_tokenizer(), "qwen2_5")
    with pytest.raises(DataError, match=r"^data: row 2: .*cannot render the conversation's first 0 messages"):
        assistant_mask(tok, CONVERSATION[1:], 2)


USER_ONLY = (
    "{% for m in messages %}{% if m['role'] == 'user' %}<|user|>{{ m['content'] }}\n{% endif %}{% endfor %}"
)


@pytest.mark.parametrize(
    "template, says",
    [
        (SMOLLM2, None),  # renders and finds the assistant's turns
        (USER_ONLY, "'<|user|>Hi\\n'"),  # never renders an assistant turn
        (
            USER_ONLY + "{% if add_generation_prompt %}<|assistant|>{% endif %}",
            "'<|user|>Hi\\n'",
        ),  # ... nor with a header
        # markers around nothing: the answer is rendered, none of it marked
        (
            "{% for m in messages %}<|{{ m['role'] }}|>{% if m['role'] == 'assistant' %}{% generation %}"
            "{% endgeneration %}{% endif %}{{ m['content'] }}\n{% endfor %}",
            "'<|user|>Hi\\n<|assistant|>Hello\\n'",
        ),
    ],
)
def test_a_template_that_marks_no_assistant_token_is_told_from_the_data(
    template: str, says: str | None
) -> None:
    """ablate.data.chat_templates.masks_no_assistant: a user turn and an assistant turn rendered, and nothing
    of the assistant's in the mask: what they render as (the template's fault, named before a run); a template
    that marks the answer: None."""
    from ablate.data.chat_templates import masks_no_assistant

    tok = byte_tokenizer()
    tok.chat_template = template
    assert masks_no_assistant(tok) == says
