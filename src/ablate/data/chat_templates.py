"""Chat templates with `{% generation %}` markers, for SFT's `assistant_only_loss` (loss on the
assistant turns of `messages` rows only, as TRL's `SFTConfig.assistant_only_loss`).

transformers marks the tokens a template renders between `{% generation %}` and `{% endgeneration %}`
(`apply_chat_template(..., return_assistant_tokens_mask=True)`); the markers change nothing in the
rendered text. Most shipped templates have none: TRL swaps in a marked copy of the templates it knows
(`trl.chat_template_utils.get_training_chat_template`, not SmolLM2's); ablate does the same for the
models it ships (`model=smollm2_135m`; the tiny model's template is marked at the source). For any
other model the tokenizer's own template must carry the markers (TRL's `trl/chat_templates/*_training.jinja`
are examples); ablate says so in one line rather than training on the wrong tokens.

No torch import here.
"""

from __future__ import annotations

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
