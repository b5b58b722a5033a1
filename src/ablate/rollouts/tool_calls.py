"""Tool calls in GRPO's rollouts: how tools are shown to the model, how its calls are read back, how they
run, and the tokens of their results (TRL 1.16's `tools`, as its GRPOTrainer does them).

Schema: each tool is a Python function (or an environment's method); transformers' `get_json_schema` turns
its signature and docstring into the schema chat templates take (`apply_chat_template(tools=...)`).

Formats (`method.args.tool_call_format`):
- `chat_template`: the model's own. Its chat template renders the tools in the prompt, the assistant's
  calls and the tool results; the calls are parsed from the generated ids with the tokenizer's
  `response_template` (transformers' `parse_response`, with the prompt as prefix), falling back, as TRL's
  `parse_response` does, to plain text when the ids do not parse (no call). A template that renders calls
  as `<tool_call>{json}</tool_call>` (Qwen2.5's) but whose tokenizer has no response_template is parsed as
  `hermes` below.
- `hermes` (the fallback, for chat templates without tools, e.g. SmolLM2's): the tools are described as JSON
  in a system turn, in the wording Qwen2.5 and NousResearch's Hermes models are trained on (rendered by
  ablate.data.chat_templates.hermes_conversation, as SFT renders tool-use demonstrations for such a model);
  the model writes each call as `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` in its text (a
  JSON list of calls inside the tags too, as SmolLM2-Instruct writes them); results are `tool` turns, which a
  template renders as it renders any role. A call whose JSON does not parse, or that is never closed, is a
  failed call whose error the model reads (TRL has no such format; its parser would drop the call silently).
- `auto`: `chat_template` when the template renders tool calls, `hermes` otherwise.

A tool's result is appended as TRL does: the tokens between the assistant's turn and the next assistant
turn that the template renders for `{"role": "tool", "name": ..., "content": str(result)}` messages (cut from
a dummy conversation rendered with and without them, `suffix_ids`), so the model continues from its own ids,
never re-tokenized. An exception is returned as `{'error': '...'}` (TRL's text) and counted as a failure; so
is a call that outlives `tool_timeout` seconds (ablate's: TRL waits for ever). Timeouts interrupt the tool
with SIGALRM in the main thread (pure Python and sleeping code stop at once; a C call at its next bytecode);
elsewhere the tool runs in a thread that is abandoned when it times out.
"""

from __future__ import annotations

import concurrent.futures
import functools
import inspect
import json
import re
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from transformers import PreTrainedTokenizerBase
from transformers.utils import get_json_schema

from ablate.data.chat_templates import hermes_conversation, tool_calls_rendered
from ablate.errors import ConfigError, DataError, UserCodeError, log_file
from ablate.rewards.calls import name_of

OPEN, CLOSE = "<tool_call>", "</tool_call>"
CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


def schema(tool: Callable[..., Any], key: str) -> dict[str, Any]:
    """The tool's JSON schema from its signature and docstring (what the chat template renders); one line
    when the docstring does not describe every argument, as transformers requires."""
    try:
        return get_json_schema(tool)
    except Exception as e:  # transformers' DocstringParsingException / TypeError: one line
        name = getattr(tool, "__name__", repr(tool))
        raise ConfigError(
            f"{key}: tool {name} needs type hints and a docstring with an `Args:` line per "
            f"argument (its schema for the model): {str(e).splitlines()[0]}"
        ) from None


@dataclass
class Turn:
    """One assistant turn as read back: the message (role, content, tool_calls) and its calls, each
    `(name, arguments, error)`: `error` set when the call could not be read (hermes' bad JSON)."""

    message: dict[str, Any]
    calls: list[tuple[str, Any, str | None]]
    malformed: str | None = None  # why text written as a call could not be read (`ablate generate` says so)


class ToolFormat:
    """How tools reach the model and how its calls come back (see the module docstring)."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, kind: str = "auto") -> None:
        # kind: method.args.tool_call_format, checked by its schema (ablate.schema.grpo.TOOL_CALL_FORMATS)
        if tokenizer.chat_template is None:
            raise ConfigError(
                "method.args.tools: the tokenizer has no chat template (tools need conversations)"
            )
        self.tokenizer = tokenizer
        rendered = tool_calls_rendered(tokenizer)
        if kind == "chat_template" and rendered is None:
            raise ConfigError(
                "method.args.tool_call_format=chat_template: this model's chat template does not render "
                "tool calls and tool results; use tool_call_format=hermes (or auto)"
            )
        self.native = kind == "chat_template" or (kind == "auto" and rendered is not None)
        self.kind = "chat_template" if self.native else "hermes"
        self.parser = getattr(tokenizer, "response_template", None) if self.native else None
        # how a call opens (the parser's marker, else hermes'), to tell a garbled call from an answer
        fields = (self.parser or {}).get("fields", {}) if isinstance(self.parser, dict) else {}
        self.opening = str((fields.get("tool_calls") or {}).get("open") or OPEN)
        if self.native and self.parser is None and not parse_hermes(rendered or "")[1]:
            raise ConfigError(
                "method.args.tools: this model's chat template renders tool calls in a format ablate "
                "cannot read back without a response parser: set the tokenizer's response_template "
                "(transformers' response parsing), or method.args.tool_call_format=hermes"
            )

    @functools.cached_property
    def longest_token(self) -> int:
        """Characters of the vocabulary's longest token, as stored (a byte-level token's bytes, a WordPiece's
        `##`): at least what any token decodes to, so n characters of text are at least n / this tokens."""
        return max((len(t) for t in self.tokenizer.get_vocab()), default=1) or 1

    def cut(self, content: str, max_tokens: int) -> tuple[str, bool]:
        """A tool result cut to its first `max_tokens` tokens, and whether it was cut. Cut first to what that
        many tokens can hold in characters (`longest_token` each), so a 20 MB result is never tokenized whole;
        then by its own tokens (decoded back to text, which the template renders as any result)."""
        head = content[: max_tokens * self.longest_token]
        ids = self.tokenizer(head, add_special_tokens=False, verbose=False)["input_ids"]  # no length warning
        if len(ids) <= max_tokens:
            return head, len(head) < len(content)
        return self.tokenizer.decode(ids[:max_tokens]), True

    def prompt(self, messages: list[dict[str, Any]], schemas: list[dict[str, Any]]) -> dict[str, Any]:
        """apply_chat_template's arguments for a prompt offering `schemas`: the template's own `tools=`, or
        (hermes) the conversation with the tools described in its system turn."""
        if self.native:
            # `or None`: TRL's (Llama renders tools=[])
            return {"conversation": messages, "tools": schemas or None}
        return {"conversation": hermes_conversation(messages, schemas), "tools": None}

    def prompt_ids(self, messages: Any, schemas: list[dict[str, Any]], index: int = 0) -> list[int]:
        """A conversational prompt's ids with the tools offered and the assistant turn opened."""
        if not isinstance(messages, list):
            raise DataError(
                f"data: row {index}: tools need conversational prompts (a list of messages), as in TRL; "
                f"this prompt is a {type(messages).__name__}"
            )
        out = self.tokenizer.apply_chat_template(
            **self.prompt(list(messages), schemas),
            add_generation_prompt=True,
            tokenize=True,
            return_dict=True,
        )
        return list(out["input_ids"])

    def read(self, ids: list[int], prefix: list[int], schemas: list[dict[str, Any]]) -> Turn:
        """The assistant turn in `ids` (generated after `prefix`) and its tool calls."""
        if self.parser is None:
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            content, calls = parse_hermes(text)
            message: dict[str, Any] = {"role": "assistant", "content": content}
            if calls:
                message["tool_calls"] = [
                    {"type": "function", "function": {"name": n, "arguments": a}} for n, a, _ in calls
                ]
            error = next((e for _, _, e in calls if e is not None), None)
            return Turn(message, calls, error or (None if calls else garbled(content, self.opening)))
        message, error = parse_response(self.tokenizer, ids, prefix, schemas)
        calls = [_call_of(c) for c in message.get("tool_calls") or []]
        text = str(message.get("content") or "")
        return Turn(message, calls, error or (None if calls else garbled(text, self.opening)))

    def suffix_ids(self, tool_messages: list[dict[str, Any]], stops: list[int]) -> list[int]:
        """TRL's `_get_tool_suffix_ids`: the ids the template puts after an assistant turn (cut after its
        end-of-turn) for these tool messages, up to and including the next assistant turn's opening."""
        call = [{"type": "function", "function": {"name": tool_messages[0]["name"], "arguments": {}}}]
        dummy = [
            {"role": "user", "content": "dummy"},
            {"role": "assistant", "content": "", **({"tool_calls": call} if self.native else {})},
        ]
        prefix = self.tokenizer.apply_chat_template(
            dummy, add_generation_prompt=False, tokenize=True, return_dict=False
        )
        full = self.tokenizer.apply_chat_template(
            dummy + tool_messages, add_generation_prompt=True, tokenize=True, return_dict=False
        )
        # TRL: the tokenizer's EOS; here any end-of-turn id
        ends = [i for i, t in enumerate(prefix) if t in stops]
        if ends:
            prefix = prefix[: ends[-1] + 1]
        if full[: len(prefix)] != prefix:
            raise ConfigError(
                "method.args.tools: the chat template renders a conversation's start differently once "
                "tool turns follow (not prefix-preserving), so tool results cannot be appended to the "
                "model's own tokens; TRL swaps in a training template for such models"
            )
        return list(full[len(prefix) :])


def parse_response(
    tokenizer: PreTrainedTokenizerBase, ids: list[int], prefix: list[int], schemas: list[dict[str, Any]]
) -> tuple[dict[str, Any], str | None]:
    """TRL 1.16's `parse_response`: the tokenizer's parser, or the decoded text when it fails (a malformed
    call is plain content, not counted, as TRL), with why it failed; the EOS the parser may leave in the
    content removed; calls' missing arguments = {}."""
    try:
        parsed = tokenizer.parse_response(ids, prefix=prefix, tools=schemas or None)
        if parsed is None:
            raise ValueError("parse_response returned None")
        if isinstance(parsed.get("content"), str):
            parsed["content"] = parsed["content"].removesuffix(tokenizer.eos_token)
        if not parsed.get("content"):
            parsed["content"] = ""
        for call in parsed.get("tool_calls") or []:
            _check_call(call)
    except (ValueError, TypeError) as e:
        text = tokenizer.decode(ids, skip_special_tokens=True)
        return {"role": "assistant", "content": text}, f"it does not parse ({str(e).splitlines()[0][:80]})"
    return parsed, None


def garbled(text: str, opening: str) -> str | None:
    """Why `text`, read as no call, is a garbled one (it holds a near copy of the call marker: `<toool_call>`
    for `<tool_call>`, 80% alike by difflib), else None. The rollouts run no such call and count none (TRL's
    plain text); `ablate generate` says it is no answer."""
    import difflib

    for i in (i for i, ch in enumerate(text) if ch == opening[:1]):
        window = text[i : i + len(opening)]
        if difflib.SequenceMatcher(None, window, opening).ratio() >= 0.8:
            return f"{window!r} reads as the call marker {opening!r}, but no call parses"
    return None


def _check_call(call: Any) -> None:
    """TRL's `_validate_tool_calls`, for one call: a dict with a string name; absent arguments are {}."""
    if not isinstance(call, dict):
        raise ValueError("a tool call must be a dict")
    body = call.get("function", call)
    if not isinstance(body, dict) or not isinstance(body.get("name"), str):
        raise ValueError("a tool call needs a string name")
    if body.get("arguments") is None:
        body["arguments"] = {}


def _call_of(call: dict[str, Any]) -> tuple[str, Any, str | None]:
    """(name, arguments, error) of a parsed call; TRL runs only `type: function` calls."""
    if call.get("type", "function") != "function":
        return call.get("name", "unknown"), {}, f"Unsupported tool call type: {call['type']}"
    body = call.get("function", call)
    return body["name"], body.get("arguments") or {}, None


def parse_hermes(text: str) -> tuple[str, list[tuple[str, Any, str | None]]]:
    """The content (the text around the calls, stripped) and the calls written as
    <tool_call>{json}</tool_call> (a JSON object with `name` and `arguments`, or a list of them); a call that
    does not parse is ("unknown", {}, the reason), which the model reads back as the tool's error."""
    calls: list[tuple[str, Any, str | None]] = []
    for body in CALL.findall(text):
        try:
            value = json.loads(body)
        except json.JSONDecodeError as e:
            calls.append(
                ("unknown", {}, f"the tool call is not valid JSON ({e.msg} at char {e.pos}): {body[:80]}")
            )
            continue
        for item in value if isinstance(value, list) else [value]:
            if not isinstance(item, dict) or not isinstance(item.get("name"), str):
                calls.append(("unknown", {}, 'a tool call is {"name": <function-name>, "arguments": {...}}'))
                continue
            args = item.get("arguments", item.get("parameters")) or {}
            if isinstance(args, str):
                try:
                    args = json.loads(args)
                except json.JSONDecodeError:
                    pass
            calls.append((item["name"], args, None))
    content = CALL.sub("", text)
    if OPEN in content:  # a call begun and never closed (the turn ended first): failed, as bad JSON is
        content, _, body = content.partition(OPEN)
        calls.append(("unknown", {}, f"the tool call is not closed (no {CLOSE}): {body.strip()[:80]}"))
    return content.strip(), calls


class ToolTimeout(Exception):
    """A tool ran past `tool_timeout` seconds."""


def call(
    tools: dict[str, Callable[..., Any]], name: str, arguments: Any, error: str | None, timeout: float | None
) -> tuple[Any, bool]:
    """Run one call: (result, failed). As TRL: an unknown name or a raising tool gives `{'error': str(e)}`.
    Async tools (coroutine functions) run to completion on their own event loop."""
    try:
        if error is not None:
            raise ValueError(error)
        if name not in tools:
            raise ValueError(f"Tool {name} not found.")
        if not isinstance(arguments, dict):
            raise TypeError(f"the arguments of {name} must be an object of named values, got {arguments!r}")
        return run_with_timeout(tools[name], arguments, timeout), False
    except SystemExit as e:  # not an error for the model to read: it would end the run as a success
        raise UserCodeError(
            f"tool '{name}' ({name_of(tools[name])}) called sys.exit({e.code!r}): a tool returns "
            f"its result, or raises for the model to read (traceback: {log_file()})"
        ) from e
    except Exception as e:  # any tool error is the model's to read, and a failure to count
        return {"error": str(e)}, True


def run_with_timeout(fn: Callable[..., Any], kwargs: dict[str, Any], timeout: float | None) -> Any:
    """`fn(**kwargs)`, stopped with ToolTimeout after `timeout` seconds (None or 0: no limit)."""
    if inspect.iscoroutinefunction(fn):
        import asyncio

        async def bounded() -> Any:
            return await asyncio.wait_for(fn(**kwargs), timeout) if timeout else await fn(**kwargs)

        try:
            return asyncio.run(bounded())
        except TimeoutError:
            raise ToolTimeout(f"timed out after {timeout:g} s") from None
    if not timeout:
        return fn(**kwargs)
    if threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer"):

        def alarm(signum: int, frame: Any) -> None:
            raise ToolTimeout(f"timed out after {timeout:g} s")

        previous = signal.signal(signal.SIGALRM, alarm)
        signal.setitimer(signal.ITIMER_REAL, timeout)
        try:
            return fn(**kwargs)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="ablate-tool")
    try:
        return pool.submit(fn, **kwargs).result(timeout=timeout)
    except concurrent.futures.TimeoutError:
        raise ToolTimeout(f"timed out after {timeout:g} s") from None
    finally:
        pool.shutdown(wait=False)  # a thread that will not stop is left behind, not waited for
