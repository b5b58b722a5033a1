"""Chat templates with `{% generation %}` markers, for SFT's `assistant_only_loss` (loss on the
assistant turns of `messages` rows only, as TRL's `SFTConfig.assistant_only_loss`).

transformers marks the tokens a template renders between `{% generation %}` and `{% endgeneration %}`
(`apply_chat_template(..., return_assistant_tokens_mask=True)`); the markers change nothing in the
rendered text. Most shipped templates have none: TRL swaps in a marked copy of the templates it knows
(`trl.chat_template_utils.get_training_chat_template`, not SmolLM2's); ablate does the same for the
models it ships (`model=smollm2_135m`; the tiny model's template is marked at the source). For any
other model the tokenizer's own template must carry the markers (TRL's `trl/chat_templates/*_training.jinja`
are examples); ablate says so in one line rather than training on the wrong tokens.

Tools (ablate.rollouts.tools): a template that cannot render tool calls (SmolLM2's) is given them in the
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

# SmolLM2-135M-Instruct's template, exactly as its tokenizer ships it (the default system turn included) ...
SMOLLM2 = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# ... and marked: an assistant turn's content and its end-of-turn token <|im_end|> (what the model must
# learn to emit, to stop) count; the role header and the newline after <|im_end|> are template text
SMOLLM2_MARKED = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}"
    "{% if message['role'] == 'assistant' %}{{ '<|im_start|>assistant\n' }}{% generation %}"
    "{{ message['content'] + '<|im_end|>' }}{% endgeneration %}{{ '\n' }}"
    "{% else %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
MARKED = {SMOLLM2: SMOLLM2_MARKED}


def assistant_template(tokenizer: Any) -> str:
    """The tokenizer's chat template if it has generation markers, else ablate's marked copy of it."""
    template = tokenizer.chat_template
    if isinstance(template, dict):  # named variants: `default` is the one apply_chat_template uses
        template = template.get("default")
    if template is None:
        raise DataError("data: conversational rows need a tokenizer with a chat template; this one has none")
    if GENERATION.search(template):
        return template
    if template in MARKED:
        return MARKED[template]
    raise DataError("method.args.assistant_only_loss=true needs a chat template that marks the assistant turns "
                    "with {% generation %} ... {% endgeneration %} (as TRL requires); this model's has none: add "
                    "them to its tokenizer's chat_template, or set method.args.assistant_only_loss=false")


HERMES_SYSTEM = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{tools}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within <tool_call></tool_call> "
    "XML tags:\n<tool_call>\n{{\"name\": <function-name>, \"arguments\": <args-json-object>}}\n</tool_call>"
)
_PROBE = {"name": "tool_name_probe", "key": "arg_key_probe", "value": "arg_value_probe", "content": "tool_content_probe"}


def tool_calls_rendered(tokenizer: Any) -> str | None:
    """What the chat template renders for a user -> assistant call -> tool exchange (TRL's `supports_tool_calling`
    probe), or None when it drops any part of it or cannot render it."""
    template = tokenizer.chat_template
    return None if template is None else _rendered(tokenizer, template if isinstance(template, str) else str(template))


@functools.lru_cache(maxsize=16)
def _rendered(tokenizer: Any, template: str) -> str | None:
    call = {"type": "function", "function": {"name": _PROBE["name"], "arguments": {_PROBE["key"]: _PROBE["value"]}}}
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "name": _PROBE["name"], "content": _PROBE["content"]}]
    try:
        text = tokenizer.apply_chat_template(messages, tokenize=False)
    except Exception:  # noqa: BLE001 - jinja's TemplateError (a template that refuses the roles), TypeError
        return None
    return text if all(v in text for v in _PROBE.values()) else None


def hermes_call(name: str, arguments: Any) -> str:
    """One call as the hermes format writes it (Qwen2.5's template's text)."""
    if isinstance(arguments, str):  # TRL allows arguments as JSON text
        arguments = json.loads(arguments)
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def hermes_conversation(messages: list[dict[str, Any]], schemas: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """`messages` (TRL's: assistant `tool_calls`, `tool` turns) as plain-text turns any template renders: the
    tools described in the system turn (appended to the conversation's own, or a new first turn), each
    assistant call written into its text."""
    out = []
    for m in messages:
        calls = [c.get("function", c) for c in m.get("tool_calls") or []]
        if calls:
            text = "\n".join(hermes_call(c["name"], c.get("arguments") or {}) for c in calls)
            m = {"role": m["role"], "content": (m.get("content") or "") + ("\n" if m.get("content") else "") + text}
        elif m.get("role") != "tool":
            m = {k: v for k, v in m.items() if k != "tool_calls"}
        out.append(m)
    if not schemas:
        return out
    tools = HERMES_SYSTEM.format(tools="\n".join(json.dumps(s) for s in schemas))
    if out and out[0]["role"] == "system":
        return [{**out[0], "content": f"{out[0]['content']}\n\n{tools}"}, *out[1:]]
    return [{"role": "system", "content": tools}, *out]
