"""Chat templates: which tokens are the assistant's, for SFT's `assistant_only_loss` (loss on the assistant
turns of conversational rows only, as TRL's `SFTConfig.assistant_only_loss`), and tool calls for templates
that cannot render them.

The assistant tokens (`assistant_mask`), for any chat template:
- a template with `{% generation %}` markers: the tokens it renders between `{% generation %}` and
  `{% endgeneration %}` (transformers' `apply_chat_template(..., return_assistant_tokens_mask=True)`);
- any other template (most shipped ones: Qwen2.5's, Llama 3's, SmolLM2's): by rendering prefixes. Assistant
  turn i is the text that `messages[:i + 1]` adds to `messages[:i]` rendered with the generation prompt,
  without its trailing whitespace: the turn's content and its end-of-turn token (which the model must learn
  to emit, to stop), not the role header the generation prompt already wrote nor the newline the template
  puts after it, nor what the template writes after a conversation's last message only (Phi-3's EOS). Its
  tokens are those whose characters overlap it (the tokenizer's offsets).
TRL 1.16 instead swaps in a marked copy of the templates it knows (`get_training_chat_template`) and refuses
the rest; its copies mark the same text for Llama 3, and for Qwen2.5 also the newlines around the turn.
Rendering prefixes needs a template that renders earlier turns the same whatever follows them (one that
drops the reasoning of earlier turns does not): where it does not, ablate says so in one line rather than
guess (`tests/unit/test_assistant_mask.py` checks Qwen2.5's, Llama 3's and SmolLM2's templates by hand).

Tools (ablate.rollouts.tool_calls): a template that cannot render tool calls (SmolLM2's) is given them in the
`hermes` format, the text Qwen2.5's template writes and NousResearch's Hermes and SmolLM2-Instruct models
are trained on: the tools as JSON in a system turn (`HERMES_SYSTEM`), each call as
`<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>` in the assistant's text, results as `tool`
turns (`hermes_conversation`). SFT on tool-use demonstrations and GRPO's prompts render the same way.

No torch import here.
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any

from ablate.errors import DataError

GENERATION = re.compile(r"\{%-?\s*generation\s*-?%\}")

# SmolLM2-135M-Instruct's template, exactly as its tokenizer ships it (the default system turn included)
SMOLLM2 = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ "
    "'<|im_start|>system\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def _template_text(tokenizer: Any) -> str:
    template = tokenizer.chat_template
    if isinstance(template, dict):  # named variants: `default` is the one apply_chat_template uses
        template = template.get("default")
    if template is None:
        raise DataError("data: conversational rows need a tokenizer with a chat template; this one has none")
    return template


def assistant_mask(
    tokenizer: Any, messages: list[dict[str, Any]], index: int, **chat_kwargs: Any
) -> tuple[list[int], list[int]]:
    """A conversation's token ids (as `apply_chat_template` tokenizes it) and its assistant mask (1: a token
    of an assistant turn): the template's generation markers where it has them, else by rendering prefixes."""
    if GENERATION.search(_template_text(tokenizer)):
        out = tokenizer.apply_chat_template(
            messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True, **chat_kwargs
        )
        return list(out["input_ids"]), list(out["assistant_masks"])
    if not getattr(tokenizer, "is_fast", False):
        raise DataError(
            "method.args.assistant_only_loss=true with a chat template without {% generation %} markers "
            "needs a fast tokenizer (character offsets) to find the assistant tokens; this one is not"
        )
    text = tokenizer.apply_chat_template(messages, tokenize=False, **chat_kwargs)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    trailer = text[_trailer_start(tokenizer, messages, text, enc, chat_kwargs) :]
    spans = assistant_spans(tokenizer, messages, text, trailer, index, **chat_kwargs)
    mask = [int(any(start < b and end > a for a, b in spans)) for start, end in enc["offset_mapping"]]
    return list(enc["input_ids"]), mask


PROBE = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]


def masks_no_assistant(tokenizer: Any) -> str | None:
    """What a two-turn conversation (user, assistant) renders as when the template puts none of the assistant
    turn's tokens in `assistant_only_loss`'s mask (it never renders assistant turns, or its {% generation %}
    markers hold none of them), else None: a fault of the template, whatever the data."""
    try:
        ids, mask = assistant_mask(tokenizer, PROBE, 0)
    except DataError:  # rendering prefixes failed: a template that drops the assistant's text, or one the
        try:  # rows themselves will judge
            text = tokenizer.apply_chat_template(PROBE, tokenize=False)
        except Exception:
            return None
        return None if PROBE[1]["content"] in text else repr(text)
    return None if 1 in mask else repr(tokenizer.decode(ids))


def assistant_spans(
    tokenizer: Any, messages: list[dict[str, Any]], text: str, trailer: str, index: int, **chat_kwargs: Any
) -> list[tuple[int, int]]:
    """The character spans of the assistant turns in `text` (the whole conversation rendered, ending with
    `trailer`), by rendering prefixes (the module's docstring); one line where the template renders a turn
    differently once later turns follow it, or cannot render the conversation before an assistant turn."""
    spans = []
    for i, message in enumerate(messages):
        if message.get("role") != "assistant":
            continue
        before = _render(tokenizer, messages[:i], True, index, chat_kwargs)
        through = _render(tokenizer, messages[: i + 1], False, index, chat_kwargs)
        through = through[: len(through) - len(trailer)] if trailer and through.endswith(trailer) else through
        if not through.startswith(before) or not text.startswith(through):
            raise DataError(
                f"data: row {index}: method.args.assistant_only_loss=true, but the chat template renders "
                f"message {i} (assistant) differently once later messages follow, so its tokens cannot be "
                "found by rendering prefixes: mark the assistant turns in the template with {% generation %} "
                "... {% endgeneration %}, or set method.args.assistant_only_loss=false"
            )
        spans.append((len(before), len(before) + len(through[len(before) :].rstrip())))
    return spans


def _trailer_start(
    tokenizer: Any, messages: list[dict[str, Any]], text: str, enc: Any, chat_kwargs: dict[str, Any]
) -> int:
    """Where the special tokens start that the template writes after a conversation's last message only
    (Phi-3's EOS): those of `text` the same conversation with one more message does not have there, found by
    tokens (a character may coincide: </s> and <|user|> share their "<"); len(text) when there are none."""
    try:
        longer = tokenizer.apply_chat_template(
            [*messages, {"role": "user", "content": "?"}], tokenize=False, **chat_kwargs
        )
    except Exception:  # a template that refuses the probe: no trailer assumed
        return len(text)
    ids, more = enc["input_ids"], tokenizer(longer, add_special_tokens=False)["input_ids"]
    first = next((j for j, (a, b) in enumerate(zip(ids, more)) if a != b), len(ids))
    special = set(tokenizer.all_special_ids)
    if first == len(ids) or not all(t in special for t in ids[first:]):
        return len(text)
    return enc["offset_mapping"][first][0]


def _render(
    tokenizer: Any, messages: list[dict[str, Any]], prompt: bool, index: int, chat_kwargs: dict[str, Any]
) -> str:
    try:
        return tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=prompt, **chat_kwargs
        )
    except Exception as e:  # jinja's errors, transformers' refusal of an empty conversation
        raise DataError(
            f"data: row {index}: method.args.assistant_only_loss=true, but the chat template cannot render "
            f"the conversation's first {len(messages)} messages ({type(e).__name__}: "
            f"{str(e).splitlines()[0] if str(e) else ''}), which finding the assistant tokens by rendering "
            "prefixes needs: mark the assistant turns in the template with {% generation %} ... "
            "{% endgeneration %}, or set method.args.assistant_only_loss=false"
        ) from e


HERMES_SYSTEM = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML "
    "tags:\n<tools>\n{tools}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> "
    'XML tags:\n<tool_call>\n{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>'
)
_PROBE = {
    "name": "tool_name_probe",
    "key": "arg_key_probe",
    "value": "arg_value_probe",
    "content": "tool_content_probe",
}


def tool_calls_rendered(tokenizer: Any) -> str | None:
    """What the chat template renders for a user -> assistant call -> tool exchange (TRL's
    `supports_tool_calling` probe), or None when it drops any part of it or cannot render it."""
    template = tokenizer.chat_template
    return (
        None
        if template is None
        else _rendered(tokenizer, template if isinstance(template, str) else str(template))
    )


@functools.lru_cache(maxsize=16)
def _rendered(tokenizer: Any, template: str) -> str | None:
    call = {
        "type": "function",
        "function": {"name": _PROBE["name"], "arguments": {_PROBE["key"]: _PROBE["value"]}},
    }
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "name": _PROBE["name"], "content": _PROBE["content"]},
    ]
    try:
        text = tokenizer.apply_chat_template(messages, tokenize=False)
    except Exception:  # jinja's TemplateError (a template that refuses the roles), TypeError
        return None
    return text if all(v in text for v in _PROBE.values()) else None


def hermes_call(name: str, arguments: Any) -> str:
    """One call as the hermes format writes it (Qwen2.5's template's text)."""
    if isinstance(arguments, str):  # TRL allows arguments as JSON text
        arguments = json.loads(arguments)
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def hermes_conversation(
    messages: list[dict[str, Any]], schemas: list[dict[str, Any]] | None
) -> list[dict[str, Any]]:
    """`messages` (TRL's: assistant `tool_calls`, `tool` turns) as plain-text turns any template renders: the
    tools described in the system turn (appended to the conversation's own, or a new first turn), each
    assistant call written into its text."""
    out = []
    for m in messages:
        calls = [c.get("function", c) for c in m.get("tool_calls") or []]
        if calls:
            text = "\n".join(hermes_call(c["name"], c.get("arguments") or {}) for c in calls)
            m = {
                "role": m["role"],
                "content": (m.get("content") or "") + ("\n" if m.get("content") else "") + text,
            }
        elif m.get("role") != "tool":
            m = {k: v for k, v in m.items() if k != "tool_calls"}
        out.append(m)
    if not schemas:
        return out
    tools = HERMES_SYSTEM.format(tools="\n".join(json.dumps(s) for s in schemas))
    if out and out[0]["role"] == "system":
        return [{**out[0], "content": f"{out[0]['content']}\n\n{tools}"}, *out[1:]]
    return [{"role": "system", "content": tools}, *out]
