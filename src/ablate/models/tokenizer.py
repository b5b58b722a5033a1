"""A byte-level tokenizer built locally (no download).

A `tokenizers` byte-level BPE with an empty merge list, wrapped in `PreTrainedTokenizerFast`: every
UTF-8 byte is one token, so any text round-trips. Unlike `ByT5Tokenizer` it does not append `</s>` to
every encode (which would put an EOS after the prompt); EOS is added by the trainers where a
completion ends.
"""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

PAD, BOS, EOS = "<pad>", "<s>", "</s>"

# A minimal chat template so conversational datasets (lists of {role, content}) work with the tiny
# model; `add_generation_prompt` opens the assistant turn the completion continues. Every turn ends
# with EOS, as real templates end it with their end-of-turn token: for messages, TRL adds no EOS of its
# own, so the template's is what teaches the model to stop.
# The {% generation %} markers (no effect on the text) mark an assistant turn's content and EOS for
# SFT's assistant_only_loss (ablate.data.chat_templates).
# Tools (GRPO's method.args.tools, a `tools` column in SFT data): one short line naming each tool and its
# parameters (a 256-position model has no room for JSON schemas), the assistant's calls as
# <tool_call>{"name": ..., "arguments": {...}}</tool_call> after its content, tool results as `tool` turns;
# RESPONSE_TEMPLATE parses the calls back (transformers' parse_response, as TRL does). Without tools or
# calls the text is what it was before they existed.
CHAT_TEMPLATE = (
    "{% if tools %}<|tools|>{% for t in tools %}{% set f = t.function if t.function is defined else t %}"
    "{{ f.name }}({{ (f.parameters.properties if f.parameters is defined else {}) | list | join(',') }})"
    "{% if not loop.last %} {% endif %}{% endfor %}{{ eos_token }}\n{% endif %}"
    "{% for m in messages %}<|{{ m['role'] }}|>"
    "{% if m['role'] == 'assistant' %}{% generation %}{% if m['content'] %}{{ m['content'] }}{% endif %}"
    "{% for c in m['tool_calls'] or [] %}{% set f = c.function if c.function is defined else c %}"
    "<tool_call>{{ {'name': f.name, 'arguments': f.arguments} | tojson }}</tool_call>{% endfor %}"
    "{{ eos_token }}{% endgeneration %}{{ '\\n' }}"
    "{% else %}{{ m['content'] }}{{ eos_token }}\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
# transformers' response parser for that template (`tokenizer.response_template`, saved with the tokenizer)
RESPONSE_TEMPLATE = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<|assistant|>",
    "fields": {
        "tool_calls": {
            "open": "<tool_call>",
            "close_pattern": r"</tool_call>\s*",
            "repeats": True,
            "content": "json",
            "transform": {"type": "function", "function": "{content}"},
        },
        "content": {"close_pattern": r"</s>\s*", "content": "text"},
    },
}


def byte_tokenizer() -> PreTrainedTokenizerFast:
    """Return the byte-level tokenizer: ids 0-2 are pad/bos/eos, 3-258 the 256 bytes."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()  # the 256 printable stand-ins for bytes
    vocab = {PAD: 0, BOS: 1, EOS: 2}
    for ch in sorted(alphabet):
        vocab[ch] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token=PAD, bos_token=BOS, eos_token=EOS, model_max_length=512
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.response_template = RESPONSE_TEMPLATE
    return fast
