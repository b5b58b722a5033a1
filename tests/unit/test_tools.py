"""Tools in GRPO's rollouts, piece by piece (ablate.rollouts.tool_calls, ablate.tools): the schema a function gives,
the two formats (the chat template's own, read back with its response parser; hermes, for templates without
tools), the tokens a tool result adds, and a call's outcomes (a result, an error, an unknown tool, a timeout)."""

from __future__ import annotations

import time

import pytest

from ablate.errors import ConfigError, DataError, UserCodeError
from ablate.methods.grpo import GRPOConfig
from ablate.models.tokenizer import byte_tokenizer
from ablate.rollouts.tool_calls import ToolFormat, call, parse_hermes, schema, tool_calls_rendered
from ablate.tools import calculator

QUESTION = [{"role": "user", "content": "What is 12*34?"}]
CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "12*34"}}</tool_call>'


def _ids(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


def test_calculator():
    assert calculator("347*29") == "10063" and calculator("6/3") == "2" and calculator("7/2") == "3.5"
    assert calculator(" (3+4)*5-1 ") == "34" and calculator("-5%3") == "1"
    for bad, says in (
        ("__import__('os')", "unsupported"),
        ("2**100", "too large"),
        ("1/0", "division by zero"),
        ("3+", "not an arithmetic expression"),
        ("1" * 201, "longer than"),
    ):
        with pytest.raises((ValueError, ZeroDivisionError), match=says):
            calculator(bad)


def test_schema_from_signature_and_docstring():
    s = schema(calculator, "method.args.tools[0]")
    assert s["function"]["name"] == "calculator"
    assert s["function"]["parameters"]["required"] == ["expression"]

    def undocumented(x: int) -> int:
        return x

    with pytest.raises(
        ConfigError, match=r"method.args.tools\[0\]: tool undocumented needs type hints and a docstring"
    ):
        schema(undocumented, "method.args.tools[0]")


def test_the_tiny_models_own_format_round_trips():
    """The tiny model's template shows the tool in one line, renders calls and results; its response template
    reads a call back from the ids (as TRL reads them), and anything else as plain content."""
    tok = byte_tokenizer()
    f = ToolFormat(tok)
    assert f.kind == "chat_template" and f.parser is not None
    schemas = [schema(calculator, "t")]
    prompt = f.prompt_ids(QUESTION, schemas)
    assert (
        tok.decode(prompt) == "<|tools|>calculator(expression)</s>\n<|user|>What is 12*34?</s>\n<|assistant|>"
    )
    turn = f.read(_ids(tok, CALL) + [tok.eos_token_id], prompt, schemas)
    assert turn.calls == [("calculator", {"expression": "12*34"}, None)]
    assert turn.message["tool_calls"][0]["function"]["name"] == "calculator"
    plain = f.read(_ids(tok, "408") + [tok.eos_token_id], prompt, schemas)
    assert plain.calls == [] and plain.message == {"role": "assistant", "content": "408"}
    broken = f.read(_ids(tok, '<tool_call>{"name": "calc') + [tok.eos_token_id], prompt, schemas)
    assert broken.calls == [] and broken.message["content"].startswith(
        "<tool_call>"
    )  # TRL: malformed = plain text
    suffix = f.suffix_ids([{"role": "tool", "name": "calculator", "content": "408"}], [tok.eos_token_id])
    assert tok.decode(suffix) == "\n<|tool|>408</s>\n<|assistant|>"


def test_hermes_for_a_template_without_tools():
    """SmolLM2's template (no tools): the tools go into a system turn as JSON, calls are read from the text
    (an object or a list of them), a call that is not JSON is a call whose error the model reads."""
    from ablate.data.chat_templates import SMOLLM2

    tok = byte_tokenizer()
    tok.chat_template, tok.response_template = SMOLLM2, None
    assert tool_calls_rendered(tok) is None
    f = ToolFormat(tok)
    assert f.kind == "hermes"
    text = tok.decode(f.prompt_ids(QUESTION, [schema(calculator, "t")]))
    assert text.startswith("<|im_start|>system\n# Tools\n") and '"name": "calculator"' in text
    assert text.endswith("<|im_start|>user\nWhat is 12*34?<|im_end|>\n<|im_start|>assistant\n")
    with_system = tok.decode(
        f.prompt_ids([{"role": "system", "content": "Be brief."}, *QUESTION], [schema(calculator, "t")])
    )
    assert with_system.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n")
    assert parse_hermes(f"Let me compute. {CALL}") == (
        "Let me compute.",
        [("calculator", {"expression": "12*34"}, None)],
    )
    listed = parse_hermes(
        '<tool_call>[{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": "{\\"y\\": 2}"}]'
        "</tool_call>"
    )
    assert listed[1] == [
        ("a", {"x": 1}, None),
        ("b", {"y": 2}, None),
    ]  # SmolLM2 writes a list; arguments as a string too
    content, [(name, _, error)] = parse_hermes("<tool_call>{not json}</tool_call>")
    assert name == "unknown" and "not valid JSON" in error
    # a call begun and never closed (the turn ended first): a failed call too, not an answer
    content, [(name, _, error)] = parse_hermes('The product: <tool_call>{"name": "calculator", "argu')
    assert content == "The product:" and name == "unknown" and "not closed (no </tool_call>)" in error
    turn = f.read(tok('<tool_call>{"name": "calc', add_special_tokens=False)["input_ids"], [], [])
    assert turn.malformed is not None and "not closed" in turn.malformed and turn.calls[0][0] == "unknown"
    # no single end-of-turn id in a byte tokenizer: the suffix is all the tool turn adds
    suffix = f.suffix_ids([{"role": "tool", "name": "calculator", "content": "408"}], [])
    assert tok.decode(suffix) == "<|im_start|>tool\n408<|im_end|>\n<|im_start|>assistant\n"


def test_format_refusals():
    tok = byte_tokenizer()
    with pytest.raises(ConfigError, match="tool_call_format=xml: must be auto, chat_template or hermes"):
        GRPOConfig(output_dir="unused", tool_call_format="xml", use_cpu=True, per_device_train_batch_size=8)
    from ablate.data.chat_templates import SMOLLM2

    tok.chat_template = SMOLLM2
    with pytest.raises(
        ConfigError, match="does not render tool calls and tool results; use tool_call_format=hermes"
    ):
        ToolFormat(tok, "chat_template")
    with pytest.raises(DataError, match="tools need conversational prompts"):
        ToolFormat(byte_tokenizer()).prompt_ids("What is 2*3?", [])


def test_a_call_and_its_failures():
    tools = {"calculator": calculator, "sleepy": lambda seconds: time.sleep(seconds) or "awake"}
    assert call(tools, "calculator", {"expression": "2*3"}, None, 5.0) == ("6", False)
    assert call(tools, "calculator", {"expression": "1/0"}, None, 5.0) == (
        {"error": "division by zero"},
        True,
    )
    assert call(tools, "nope", {}, None, 5.0) == ({"error": "Tool nope not found."}, True)  # TRL's text
    assert call(tools, "calculator", {"x": 1}, None, 5.0)[1]  # a wrong argument is the tool's TypeError
    assert call(tools, "calculator", {}, "the tool call is not valid JSON", 5.0) == (
        {"error": "the tool call is not valid JSON"},
        True,
    )
    t0 = time.perf_counter()
    assert call(tools, "sleepy", {"seconds": 30}, None, 0.2) == ({"error": "timed out after 0.2 s"}, True)
    assert time.perf_counter() - t0 < 5


def test_a_tool_that_calls_sys_exit_stops_the_run_in_one_line():
    """sys.exit(0) in a tool is no error for the model to read: it would end the run with exit status 0. One
    line naming the tool; the run fails (ablate.record.lifecycle)."""
    import bad_rewards

    with pytest.raises(UserCodeError) as e:
        call({"exit_tool": bad_rewards.exit_tool}, "exit_tool", {"expression": "1"}, None, 5.0)
    assert str(e.value).startswith(
        "tool 'exit_tool' (bad_rewards.exit_tool) called sys.exit(0): a tool returns "
        "its result, or raises for the model to read (traceback: "
    )


def test_timeout_off_the_main_thread():
    """Where SIGALRM cannot reach (another thread): the call is given up on after the timeout."""
    import threading

    out = {}
    worker = threading.Thread(
        target=lambda: out.update(r=call({"s": lambda: time.sleep(3)}, "s", {}, None, 0.2))
    )
    t0 = time.perf_counter()
    worker.start()
    worker.join()
    assert out["r"] == ({"error": "timed out after 0.2 s"}, True) and time.perf_counter() - t0 < 2.5
