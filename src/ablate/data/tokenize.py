"""Turn dataset rows into token ids: plain strings or chat messages, as TRL 1.16 does for each method.

A prompt is a string or a list of `{role, content}` messages; a completion is a string or the list of
messages that follow the prompt. As in TRL's trainers (`tests/parity/test_trl_formats.py` checks it):
- strings: EOS is appended to the completion's *text* (unless it ends with it), then prompt and
  prompt+completion are tokenised with the tokenizer's own special tokens, each as a whole;
- messages: prompt (with the generation prompt) and prompt+completion are rendered and tokenised by
  the chat template; the template's end-of-turn ends the completion (no EOS is added);
- the completion starts where the two token lists diverge (BPE merges across the boundary move it);
- SFT's `assistant_only_loss` (TRL's): the loss counts only the assistant turns' tokens (`completion_mask`),
  by the template's `{% generation %}` markers or, for any other template, by rendering prefixes
  (ablate.data.chat_templates);
- `max_length` keeps the start of prompt+completion and drops rows whose prompt alone fills it;
  ablate's `max_prompt_length` (not in TRL 1.16) first keeps the prompt's *end*, the part the
  completion answers, so long prompts are shortened instead of dropped.

`encode_prompt` / `encode_completion` are the older per-part helpers (kept for user code).
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable, Iterator
from typing import Any

import torch
from datasets import Dataset, Features, List, Value
from transformers import PreTrainedTokenizerBase

from ablate.data.formats import check_rows, check_text, detect, is_messages, preference_row, to_chatml
from ablate.errors import DataError

log = logging.getLogger("ablate")

Text = str | list[dict[str, Any]]


def _template(tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, Any]], gen: bool) -> str:
    if tokenizer.chat_template is None:
        raise DataError("data: conversational rows need a tokenizer with a chat template; this one has none")
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen)


def prompt_text(tokenizer: PreTrainedTokenizerBase, prompt: Text) -> str:
    """The text the model is conditioned on."""
    return prompt if isinstance(prompt, str) else _template(tokenizer, prompt, gen=True)


def encode_prompt(tokenizer: PreTrainedTokenizerBase, prompt: Text) -> list[int]:
    return tokenizer(prompt_text(tokenizer, prompt), add_special_tokens=False)["input_ids"]


def encode_completion(tokenizer: PreTrainedTokenizerBase, prompt: Text, completion: Text) -> list[int]:
    """Completion ids followed by EOS."""
    if isinstance(completion, str):
        if not isinstance(prompt, str):
            raise DataError(
                "data: a conversational prompt needs a conversational completion (list of messages)"
            )
        text = completion
    else:
        if isinstance(prompt, str):
            raise DataError(
                "data: a conversational completion needs a conversational prompt (list of messages)"
            )
        head = prompt_text(tokenizer, prompt)
        full = _template(tokenizer, list(prompt) + list(completion), gen=False)
        if not full.startswith(head):
            raise DataError(
                "data: the chat template renders prompt+completion with a different prefix than the prompt"
            )
        text = full[len(head) :]
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return ids + [tokenizer.eos_token_id]


def _chat_kwargs(row: dict[str, Any]) -> dict[str, Any]:
    """Per-row `tools` (a list or its JSON) and `chat_template_kwargs`, passed to the template as TRL does."""
    tools = row.get("tools")
    tools = json.loads(tools) if isinstance(tools, str) else tools
    return {"tools": tools or None, **(row.get("chat_template_kwargs") or {})}


def _ids(tokenizer: PreTrainedTokenizerBase, value: Text, **chat_kwargs: Any) -> list[int]:
    """TRL's `_tokenize`: the chat template for messages, the tokenizer's default special tokens for text."""
    if isinstance(value, list):
        if tokenizer.chat_template is None:
            raise DataError(
                "data: conversational rows need a tokenizer with a chat template; this one has none"
            )
        value, chat_kwargs = _tool_turns(tokenizer, value, chat_kwargs)
        return list(
            tokenizer.apply_chat_template(value, tokenize=True, return_dict=True, **chat_kwargs)["input_ids"]
        )
    return list(tokenizer(text=value)["input_ids"])


def _tool_turns(
    tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, Any]], chat_kwargs: dict[str, Any]
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Tools and tool calls for a template that cannot render them (SmolLM2's): as hermes text, the format
    GRPO's rollouts then read back (ablate.data.chat_templates); any other conversation as it is."""
    from ablate.data.chat_templates import hermes_conversation, tool_calls_rendered

    if not (chat_kwargs.get("tools") or any(m.get("tool_calls") for m in messages)) or tool_calls_rendered(
        tokenizer
    ):
        return messages, chat_kwargs
    return hermes_conversation(messages, chat_kwargs.get("tools")), {**chat_kwargs, "tools": None}


def _with_eos(text: str, eos: str) -> str:
    return text if text.endswith(eos) else text + eos


def common_prefix_length(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def tokenize_preference(
    tokenizer: PreTrainedTokenizerBase, row: dict[str, Any], index: int = 0
) -> dict[str, list[int]]:
    """A preference row (explicit or implicit prompt) -> prompt_ids / chosen_ids / rejected_ids,
    untruncated."""
    row = {**row, **preference_row(row, index)}
    conv = is_messages(row["chosen"])
    for column in ("prompt", "chosen", "rejected"):
        check_text(row[column], column, conv, index)
    if conv:
        kw = _chat_kwargs(row)
        p = _ids(tokenizer, row["prompt"], add_generation_prompt=True, **kw)
        pc = _ids(tokenizer, row["prompt"] + row["chosen"], **kw)
        pr = _ids(tokenizer, row["prompt"] + row["rejected"], **kw)
    else:
        eos = tokenizer.eos_token
        p = _ids(tokenizer, row["prompt"])
        pc = _ids(tokenizer, row["prompt"] + _with_eos(row["chosen"], eos))
        pr = _ids(tokenizer, row["prompt"] + _with_eos(row["rejected"], eos))
    n = min(common_prefix_length(p, pc), common_prefix_length(p, pr))
    return {"prompt_ids": p[:n], "chosen_ids": pc[n:], "rejected_ids": pr[n:]}


def _assistant_ids(
    tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, Any]], index: int, **chat_kwargs: Any
) -> tuple[list[int], list[int]]:
    """Token ids of a conversation and its assistant mask (1: an assistant turn's tokens, by the template's
    generation markers or by rendering prefixes: ablate.data.chat_templates), as TRL's `assistant_only_loss`;
    a conversation without an assistant token is an error, as in TRL."""
    from ablate.data.chat_templates import assistant_mask

    messages, chat_kwargs = _tool_turns(tokenizer, messages, chat_kwargs)
    ids, mask = assistant_mask(tokenizer, messages, index, **chat_kwargs)
    if 1 not in mask and any(m.get("role") == "assistant" and m.get("content") for m in messages):
        raise DataError(  # the template's fault (ablate.config.code_checks says so before a run)
            f"data: row {index}: method.args.assistant_only_loss=true, but the chat template puts no token "
            "of the conversation's assistant turns in the loss (it does not render them, or its "
            "{% generation %} markers hold none): fix the template, or set "
            "method.args.assistant_only_loss=false"
        )
    if 1 not in mask:
        raise DataError(
            f"data: row {index}: method.args.assistant_only_loss=true, but the conversation has no "
            "assistant turn (nothing to learn from)"
        )
    return ids, mask


def _conversational_only(assistant_only_loss: bool, index: int) -> None:
    if assistant_only_loss:
        raise DataError(
            f"data: row {index}: method.args.assistant_only_loss=true needs conversational rows "
            "(messages, or prompt/completion as lists of messages), as in TRL"
        )


def tokenize_sft(
    tokenizer: PreTrainedTokenizerBase,
    row: dict[str, Any],
    index: int = 0,
    completion_only_loss: bool | None = None,
    assistant_only_loss: bool = False,
) -> dict[str, list[int]]:
    """An SFT row -> prompt_ids / completion_ids; the loss is on completion_ids. Language modeling rows
    (`messages`, `text`) and `completion_only_loss=False` put everything in completion_ids, as TRL's
    labels do (TRL's default `completion_only_loss=None` means True for prompt-completion rows).
    `assistant_only_loss` (conversational rows) adds `completion_mask`: 1 on the completion_ids that are
    assistant tokens, the only ones in the loss."""
    mask: list[int] | None = None
    # a mix's rows of those kinds
    other = any(row.get(c) is not None for c in ("messages", "conversations", "text"))
    if "prompt" in row and "completion" in row and (row["completion"] is not None or not other):
        conv = is_messages(row["prompt"])
        check_text(row["completion"], "completion", conv, index)
        if conv:
            kw = _chat_kwargs(row)
            p = _ids(tokenizer, row["prompt"], add_generation_prompt=True, **kw)
            pc = _ids(tokenizer, row["prompt"] + row["completion"], **kw)
            if assistant_only_loss:
                pc, mask = _assistant_ids(tokenizer, row["prompt"] + row["completion"], index, **kw)
        else:
            _conversational_only(assistant_only_loss, index)
            check_text(row["prompt"], "prompt", False, index)
            p = _ids(tokenizer, row["prompt"])
            pc = _ids(tokenizer, row["prompt"] + _with_eos(row["completion"], tokenizer.eos_token))
        n = common_prefix_length(p, pc) if completion_only_loss is not False else 0
        out = {"prompt_ids": pc[:n], "completion_ids": pc[n:]}
    else:
        row = to_chatml(row)
        if row.get("messages") is not None:
            check_text(row["messages"], "messages", True, index)
            if assistant_only_loss:
                ids, mask = _assistant_ids(tokenizer, row["messages"], index, **_chat_kwargs(row))
            else:
                ids = _ids(tokenizer, row["messages"], **_chat_kwargs(row))
            out = {"prompt_ids": [], "completion_ids": ids}
            n = 0
        else:
            _conversational_only(assistant_only_loss, index)
            check_text(row.get("text"), "text", False, index)
            return {
                "prompt_ids": [],
                "completion_ids": _ids(tokenizer, _with_eos(row["text"], tokenizer.eos_token)),
            }
    if mask is not None:
        out["completion_mask"] = mask[n:]
    return out


def tokenize_prompt(tokenizer: PreTrainedTokenizerBase, row: dict[str, Any], index: int = 0) -> list[int]:
    """A prompt-only row -> prompt ids (TRL's GRPO: generation prompt for messages, special tokens for
    text)."""
    conv = is_messages(row["prompt"])
    check_text(row["prompt"], "prompt", conv, index)
    return (
        _ids(tokenizer, row["prompt"], add_generation_prompt=True, **_chat_kwargs(row))
        if conv
        else _ids(tokenizer, row["prompt"])
    )


def truncate(
    ids: dict[str, list[int]],
    max_length: int | None,
    max_prompt_length: int | None = None,
    max_completion_length: int | None = None,
) -> dict[str, list[int]] | None:
    """Cut prompt_ids / <completion>_ids (every key but prompt_ids is a completion sharing the prompt).

    `max_prompt_length` keeps the prompt's end; `max_completion_length` and `max_length` keep the start
    (TRL's `keep_start`). None: the prompt alone reaches `max_length`, so no completion token is left
    to learn from (TRL drops such rows too).
    """
    prompt = ids["prompt_ids"]  # a `completion_mask` is cut as its completion_ids are
    if max_prompt_length is not None:
        prompt = prompt[-max_prompt_length:] if max_prompt_length > 0 else []
    out = {"prompt_ids": prompt}
    for key, value in ids.items():
        if key == "prompt_ids":
            continue
        if max_completion_length is not None:
            value = value[:max_completion_length]
        if max_length is not None:
            value = value[: max(max_length - len(prompt), 0)]
        if not value:
            return None
        out[key] = value
    return out


def _finish(dataset: Dataset, kept: Dataset, name: str, what: str, hint: str) -> Dataset:
    """Drop the rows `truncate` rejected, saying how many; none left is an error."""
    dropped = len(dataset) - len(kept)
    if dropped and len(kept) == 0:
        raise DataError(f"data: every {name} {what} was dropped: its prompt alone fills max_length ({hint})")
    if dropped:
        log.warning(
            "dropped %d of %d %s %ss whose prompt alone fills max_length (%s)",
            dropped,
            len(dataset),
            name,
            what,
            hint,
        )
    return kept


def _tokenized_map(dataset: Dataset, fn: Any, name: str, what: str, columns: tuple[str, ...]) -> Dataset:
    # explicit features: a batch whose lists are all empty (e.g. `messages` rows' prompt_ids) must not
    # make the column's type `list<null>`
    features = Features({c: List(Value("int64")) for c in columns} | {"keep": Value("bool")})
    with bars_if_large(len(dataset)):
        tokenized = dataset.map(
            fn,
            with_indices=True,
            remove_columns=dataset.column_names,
            features=features,
            desc=f"Tokenizing {name} {what}s",
        )
    kept = tokenized.filter(lambda row: row["keep"], desc=f"Dropping fully truncated {name} {what}s")
    return kept.remove_columns("keep")


LARGE = 20_000  # rows from which tokenising takes long enough to want a progress bar (seconds or more)


@contextlib.contextmanager
def bars_if_large(rows: int) -> Iterator[None]:
    """datasets' progress bars on for a long pass over `rows` rows (a run turns them off otherwise:
    a bar that flashes by on a small dataset only buries the training bar)."""
    from datasets.utils import logging as ds_logging

    was = ds_logging.is_progress_bar_enabled()
    if rows >= LARGE and not was:
        ds_logging.enable_progress_bar()
    try:
        yield
    finally:
        if rows >= LARGE and not was:
            ds_logging.disable_progress_bar()


def prepare_preference(
    dataset: Dataset,
    tokenizer: PreTrainedTokenizerBase,
    max_length: int | None,
    max_prompt_length: int | None = None,
    max_completion_length: int | None = None,
    name: str = "train",
) -> Dataset:
    """Any preference format -> prompt_ids / chosen_ids / rejected_ids, truncated (DPO's
    `_prepare_dataset`)."""
    detect(dataset, "preference")
    check_rows(dataset)

    def fn(row: dict[str, Any], index: int) -> dict[str, Any]:
        ids = tokenize_preference(tokenizer, row, index)
        out = truncate(ids, max_length, max_prompt_length, max_completion_length)
        return {**ids, "keep": False} if out is None else {**out, "keep": True}

    kept = _tokenized_map(dataset, fn, name, "pair", ("prompt_ids", "chosen_ids", "rejected_ids"))
    return _finish(
        dataset, kept, name, "pair", "set method.args.max_prompt_length to keep the end of long prompts"
    )


def prepare_sft(
    dataset: Dataset,
    tokenizer: PreTrainedTokenizerBase,
    max_length: int | None,
    completion_only_loss: bool | None = None,
    name: str = "train",
    assistant_only_loss: bool = False,
) -> Dataset:
    """Any SFT format -> prompt_ids / completion_ids (+ completion_mask with `assistant_only_loss`),
    truncated (SFT's `_prepare_dataset`)."""
    detect(dataset, "sft")
    check_rows(dataset)

    def fn(row: dict[str, Any], index: int) -> dict[str, Any]:
        ids = tokenize_sft(tokenizer, row, index, completion_only_loss, assistant_only_loss)
        out = truncate(ids, max_length)
        if out is not None and "completion_mask" in out and 1 not in out["completion_mask"]:
            out = None  # max_length cut every assistant token: nothing left to learn from
        return {**ids, "keep": False} if out is None else {**out, "keep": True}

    columns = ("prompt_ids", "completion_ids") + (("completion_mask",) if assistant_only_loss else ())
    kept = _tokenized_map(dataset, fn, name, "example", columns)
    return _finish(dataset, kept, name, "example", "raise method.args.max_length")


def prepare_prompts(
    dataset: Dataset,
    tokenizer: PreTrainedTokenizerBase,
    max_prompt_length: int | None,
    name: str = "train",
    encode: Callable[[Any, int], list[int]] | None = None,
) -> Dataset:
    """Prompt-only rows -> add `prompt_ids` (the last `max_prompt_length` tokens); other columns stay
    (GRPO's reward functions receive them). `encode(prompt, index)`: how a prompt becomes ids when the
    caller renders it itself (GRPO with tools: the prompt offers them, ablate.rollouts.tool_calls)."""
    detect(dataset, "prompt")
    check_rows(dataset)

    def cut(ids: list[int]) -> list[int]:
        return ids[-max_prompt_length:] if max_prompt_length else ids

    if encode is not None:  # a plain pass: `encode` holds functions `datasets` would try (and fail) to hash
        ids = [cut(encode(prompt, i)) for i, prompt in enumerate(dataset["prompt"])]
        return dataset.add_column("prompt_ids", ids, feature=List(Value("int64")))

    def fn(row: dict[str, Any], index: int) -> dict[str, list[int]]:
        return {"prompt_ids": cut(tokenize_prompt(tokenizer, row, index))}

    with bars_if_large(len(dataset)):
        return dataset.map(fn, with_indices=True, desc=f"Tokenizing {name} prompts")


def pad(seqs: list[list[int]], value: int) -> torch.Tensor:
    """Right-pad lists of ids to one (B, T) tensor."""
    width = max(len(s) for s in seqs)
    return torch.tensor([s + [value] * (width - len(s)) for s in seqs], dtype=torch.long)
