"""Rollouts over several turns (ablate.rollouts.turns) and GRPO's use of them, with a scripted policy (a
generator that answers by the text it is given): the completion's layout (turns and results, TRL's), the mask
that keeps results out of the loss, the limits (completion length, turns of calls), the per-token log-probs an
engine or the async worker returns, environments (TRL's contract), and the trainer's loss, metrics and rewards."""

from __future__ import annotations

import re

import pytest
import torch
from datasets import Dataset

from ablate.errors import ConfigError
from ablate.methods.grpo import GRPOConfig, GRPOTrainer
from ablate.models import tiny
from ablate.rewards.calc import correct
from ablate.rollouts.generation import Completions
from ablate.rollouts.tool_calls import ToolFormat
from ablate.rollouts.turns import Toolbox, ToolGenerator, tool_metrics
from ablate.tools import calculator

CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "%s"}}</tool_call>'


class Scripted:
    """A GenerateFn that writes by the decoded prompt (`script(text) -> text`), then EOS; with `logps`, a made-up
    per-token log-prob (-0.5) as an engine returns; `sample(policy_logps=True)` as the async worker's generator."""

    def __init__(self, tok, script, logps: bool = False) -> None:
        self.tok, self.script, self.logps, self.batches = tok, script, logps, []

    def __call__(self, model, prompt_ids):
        self.batches.append(len(prompt_ids))
        ids = [
            self.tok(self.script(self.tok.decode(p)), add_special_tokens=False)["input_ids"]
            + [self.tok.eos_token_id]
            for p in prompt_ids
        ]
        return Completions(ids=ids, logps=[[-0.5] * len(c) for c in ids]) if self.logps else ids

    def sample(self, model, prompt_ids, policy_logps=False):
        ids = self(model, prompt_ids)
        ids = ids.ids if isinstance(ids, Completions) else ids
        return Completions(ids=ids, policy_logps=[[-0.25] * len(c) for c in ids] if policy_logps else None)


def perfect(text: str) -> str:
    """Call the calculator on the question; copy the tool's result as the answer."""
    if "<|tool|>" in text:
        return re.findall(r"<\|tool\|>(.*?)</s>", text)[-1]
    question = re.findall(r"What is (.*?)\?", text)
    return CALL % question[-1] if question else "hi"


def question(expr: str) -> list[dict]:
    return [{"role": "user", "content": f"What is {expr}?"}]


def _generator(tok, script=perfect, max_completion_length=128, logps=False, **box):
    toolbox = Toolbox(ToolFormat(tok), [calculator], **box)
    return ToolGenerator(Scripted(tok, script, logps=logps), toolbox, tok, max_completion_length), toolbox


def test_turns_results_and_the_mask():
    tok, model = tiny()
    gen, box = _generator(tok)
    prompts = [box.prompt_ids(question("12*34")), box.prompt_ids([{"role": "user", "content": "Say hi."}])]
    out = gen(model, prompts)
    first = tok(CALL % "12*34", add_special_tokens=False)["input_ids"] + [2]
    suffix = tok("\n<|tool|>408</s>\n<|assistant|>", add_special_tokens=False)["input_ids"]
    suffix = [2 if t == tok.convert_tokens_to_ids("</s>") else t for t in suffix]
    answer = tok("408", add_special_tokens=False)["input_ids"] + [2]
    assert (
        out.ids[0] == first + suffix + answer
    )  # turn 1, the result, turn 2: the model's own ids, never re-tokenized
    assert out.tool_mask[0] == [1] * len(first) + [0] * len(suffix) + [1] * len(answer)
    assert [m["role"] for m in out.messages[0]] == ["assistant", "tool", "assistant"]
    assert out.messages[0][1] == {"role": "tool", "name": "calculator", "content": "408"}
    assert correct(out.messages, ["408", "408"]) == [1.0, 0.0]
    # the row without a call is one turn; only the row with a call was generated again
    assert out.tool_mask[1] == [1] * len(out.ids[1]) and gen.inner.batches == [2, 1]
    assert (out.tool_calls, out.tool_failures) == ([1, 0], [0, 0])


def test_limits_and_failures():
    """A result past max_completion_length is dropped (TRL: the rollout ends as it is, the call still counted);
    a continuation is cut to fit; max_tool_calling_iterations stops a model that keeps calling."""
    tok, model = tiny()
    gen, box = _generator(
        tok, max_completion_length=110
    )  # a call is 82 tokens, "6"'s result 25, the error's 53
    out = gen(model, [box.prompt_ids(question("1/0")), box.prompt_ids(question("2*3"))])
    assert out.tool_calls == [1, 1] and out.tool_failures == [1, 0]
    assert out.ids[0][-1] == 2 and set(out.tool_mask[0]) == {1}  # the error would not fit: dropped
    assert [m["role"] for m in out.messages[0]] == ["assistant"]
    assert [m["role"] for m in out.messages[1]] == ["assistant", "tool", "assistant"]
    cut, _ = _generator(
        tok, script=lambda t: "x" * 50 if "<|tool|>" in t else perfect(t), max_completion_length=110
    )
    out = cut(model, [box.prompt_ids(question("2*3"))])
    assert len(out.ids[0]) == 110 and out.ids[0][-1] != 2  # cut at the budget: a clipped completion
    again, box2 = _generator(tok, script=lambda t: CALL % "1+1", max_completion_length=400, max_iterations=1)
    out = again(model, [box2.prompt_ids(question("2*3"))])
    assert out.tool_calls == [1] and [m["role"] for m in out.messages[0]] == [
        "assistant",
        "tool",
        "assistant",
    ]
    assert "tool_calls" in out.messages[0][-1]  # the last turn's call is read, not run


def test_engine_and_sampler_log_probs_are_zero_on_results():
    tok, model = tiny()
    gen, box = _generator(tok, logps=True)
    out = gen(model, [box.prompt_ids(question("12*34"))])
    assert [lp for lp, m in zip(out.logps[0], out.tool_mask[0]) if m] == [-0.5] * sum(out.tool_mask[0])
    assert [lp for lp, m in zip(out.logps[0], out.tool_mask[0]) if not m] == [0.0] * out.tool_mask[0].count(0)
    sampled = gen.sample(model, [box.prompt_ids(question("12*34"))], policy_logps=True)
    assert sampled.policy_logps[0] == [-0.25 if m else 0.0 for m in sampled.tool_mask[0]]


class Counter:
    """A TRL-style environment: reset(**row) -> text appended to the prompt; public methods are tools;
    get_reward() scores the episode."""

    made = 0

    def __init__(self) -> None:
        Counter.made += 1
        self.total = 0

    def reset(self, start: int = 0, **_) -> str:
        self.total = start
        return f" Start at {start}."

    def add(self, n: int) -> str:
        """Add n to the counter.

        Args:
            n: how much to add
        """
        self.total += n
        return str(self.total)

    def get_reward(self) -> float:
        return float(self.total)


def test_environments_one_per_rollout():
    tok, model = tiny()
    adds = '<tool_call>{"name": "add", "arguments": {"n": 5}}</tool_call>'
    box = Toolbox(ToolFormat(tok), [], environment=Counter)
    assert [s["function"]["name"] for s in box.schemas] == ["add"]  # the methods but reset / get_reward
    gen = ToolGenerator(Scripted(tok, lambda t: "done" if "<|tool|>" in t else adds), box, tok, 128)
    rows = [
        {"prompt": question("x"), "prompt_ids": box.prompt_ids(question("x")), "start": s} for s in (1, 10)
    ]
    prompts = gen.start(rows)
    assert tok.decode(prompts[1]).endswith(
        "What is x? Start at 10.</s>\n<|assistant|>"
    )  # reset's text, TRL's place
    out = gen(model, prompts)
    assert [e.total for e in gen.environments] == [6, 15] and out.messages[1][1]["content"] == "15"
    made = Counter.made
    gen.start(rows)  # the next round: the same instances, reset
    assert Counter.made == made and [e.total for e in gen.environments] == [1, 10]


def _trainer(tmp_path, generator, **args):
    tok, model = tiny()
    ds = Dataset.from_list([{"prompt": question(e), "answer": str(eval(e))} for e in ("12*34", "56*7")])
    config = GRPOConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=128,
        report_to="none",
        use_cpu=True,
        **args,
    )
    return GRPOTrainer(
        model=model,
        args=config,
        train_dataset=ds,
        processing_class=tok,
        reward_funcs={"correct": correct},
        generator=generator(tok),
    )


def test_the_trainer_masks_results_out_of_the_loss(tmp_path):
    trainer = _trainer(tmp_path, lambda tok: Scripted(tok, perfect), tools=["ablate.tools.calculator"])
    rows = [trainer.train_dataset[i] for i in (0, 0, 1, 1)]
    assert trainer.processing_class.decode(rows[0]["prompt_ids"]).startswith(
        "<|tools|>calculator(expression)"
    )
    rollout = trainer._generate_and_score(rows, "train")
    assert rollout.tool_mask is not None and (rollout.tool_mask == 0).any()
    loss_mask = rollout.completion_mask * rollout.tool_mask
    assert torch.equal(rollout.loss_mask(), loss_mask) and rollout.num_items == loss_mask.sum()
    m = trainer.metrics.pop("train")
    assert (
        m["tools/call_frequency"] == 1.0
        and m["tools/failure_frequency"] == 0.0
        and m["rewards/correct/mean"] == 1.0
    )
    assert m["completions/mean_length"] == loss_mask.sum() / 4  # the model's tokens only (TRL)
    # the loss reads the mask: results' tokens change nothing
    trainer.model.train()
    loss = trainer.compute_loss(trainer.model, rollout)
    rollout.completion_ids = rollout.completion_ids.masked_fill(
        rollout.tool_mask == 0, 7
    )  # other result tokens
    logps = trainer._token_logps(trainer.model, rollout.tokens())[0]
    assert torch.isfinite(loss) and logps.shape == rollout.tool_mask.shape


def test_environment_reward_and_refusals(tmp_path):
    trainer = _trainer(tmp_path, lambda tok: Scripted(tok, lambda t: "7"), environment=Counter)
    assert list(trainer.reward_funcs) == ["correct", "Counter"] and trainer.reward_weights.tolist() == [
        1.0,
        1.0,
    ]
    with pytest.raises(ConfigError, match="environment=.*: must be null with method.args.max_staleness > 0"):
        GRPOConfig(
            output_dir=str(tmp_path),
            environment=Counter,
            max_staleness=1,
            use_cpu=True,
            per_device_train_batch_size=8,
        )
    with pytest.raises(
        ConfigError, match=r"method.args.tools\[0\]=ablate.tools.calc: ablate.tools has no 'calc'"
    ):
        GRPOConfig(
            output_dir=str(tmp_path), tools=["ablate.tools.calc"], use_cpu=True, per_device_train_batch_size=8
        )
    with pytest.raises(
        ConfigError, match=r"max_tool_calling_iterations=-1: must be null \(no limit\) or an integer >= 0"
    ):
        GRPOConfig(
            output_dir=str(tmp_path),
            max_tool_calling_iterations=-1,
            use_cpu=True,
            per_device_train_batch_size=8,
        )


def test_async_worker_runs_the_tools(tmp_path):
    """max_staleness=1: the forked worker samples with the tools (Scripted.sample, as SharedPromptGenerator's), runs
    the calls (one that fails too: its error is the result) and sends the tool mask, messages and counts back with
    its round; the trainer trains on them masked, logs the worker's tool metrics and scores its messages."""

    def fails_on_seven(text: str) -> str:  # 56*7 is asked as 56/0*7: the tool's ZeroDivisionError is copied
        q = re.findall(r"What is (.*?)\?", text)
        return perfect(text) if "<|tool|>" in text or not q else CALL % q[-1].replace("*7", "/0*7")

    trainer = _trainer(
        tmp_path,
        lambda tok: Scripted(tok, fails_on_seven),
        tools=["ablate.tools.calculator"],
        max_staleness=1,
        max_steps=2,
        logging_steps=1,
        save_strategy="no",
        disable_tqdm=True,
    )
    served = []
    compute_loss = trainer.compute_loss

    def recording(model, inputs, *a, **k):
        served.append(inputs)
        return compute_loss(model, inputs, *a, **k)

    trainer.compute_loss = recording
    trainer.train()
    assert trainer.generator.inner.batches == []  # the trainer's process sampled nothing: the worker did
    assert len(served) == 2 and all(s.tool_mask is not None and (s.tool_mask == 0).any() for s in served)
    assert all(torch.equal(s.loss_mask(), s.completion_mask * s.tool_mask) for s in served)
    logged = [e for e in trainer.state.log_history if "tools/call_frequency" in e]
    assert [e["tools/call_frequency"] for e in logged] == [1.0, 1.0]
    assert [e["tools/failure_frequency"] for e in logged] == [0.5, 0.5]  # 56/0*7 failed, 12*34 did not
    assert [e["reward"] for e in logged] == [0.5, 0.5]  # the right product copied from the result: 12*34 only


def test_hermes_turns_for_a_template_without_tools():
    """SmolLM2's template (no tools): the call is read from the text, its result is a `tool` turn in the template's
    generic rendering, and generation continues after it, as with a template of its own format."""
    from ablate.data.chat_templates import SMOLLM2

    tok, model = tiny(max_position_embeddings=2048)  # the tools' JSON schema in bytes: ~700 tokens of prompt
    tok.chat_template, tok.response_template = SMOLLM2, None

    def script(text: str) -> str:
        if "<|im_start|>tool\n" in text:
            return re.findall(r"<\|im_start\|>tool\n(.*?)<\|im_end\|>", text)[-1]
        return (
            '<tool_call>\n{"name": "calculator", "arguments": {"expression": "%s"}}\n</tool_call>'
            % (re.findall(r"What is (.*?)\?", text)[-1])
        )

    box = Toolbox(ToolFormat(tok), [calculator])
    assert box.format.kind == "hermes"
    gen = ToolGenerator(Scripted(tok, script), box, tok, 400)
    prompt = box.prompt_ids(question("12*34"))
    assert tok.decode(prompt).startswith("<|im_start|>system\n# Tools")
    out = gen(model, [prompt])
    text = tok.decode(out.ids[0])
    assert text.endswith("</tool_call></s><|im_start|>tool\n408<|im_end|>\n<|im_start|>assistant\n408</s>"), (
        text
    )
    assert [m["role"] for m in out.messages[0]] == ["assistant", "tool", "assistant"] and out.tool_calls == [
        1
    ]


def test_ablate_eval_runs_the_tools(tmp_path, monkeypatch):
    """`ablate eval` of a run with tools (ablate.rollouts.evaluate.reward_eval) generates as GRPO's rounds did: the
    calls run between turns and the rewards read the messages (the scripted policy copies the tool's result: exact
    answers only with the calls run), the tool metrics reported beside the reward."""
    from ablate.rollouts import evaluate

    tok, model = tiny()
    monkeypatch.setattr(evaluate, "SharedPromptGenerator", lambda *a, **k: Scripted(tok, perfect))
    ds = Dataset.from_list(
        [{"prompt": question(e), "answer": str(eval(e))} for e in ("12*34", "56*7", "9*9")]
    )
    args = GRPOConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=128,
        report_to="none",
        use_cpu=True,
        tools=["ablate.tools.calculator"],
    )
    metrics, examples = evaluate.reward_eval(model, tok, ds, {"correct": correct}, args, batch_size=2)
    assert metrics["eval_reward"] == 1.0 and [e["reward"] for e in examples] == [1.0, 1.0, 1.0]
    assert metrics["eval_tools/call_frequency"] == 1.0 and metrics["eval_tools/failure_frequency"] == 0.0


def test_a_garbled_call_is_said_to_be_malformed_not_an_answer():
    """The tiny model's own format (its template's response parser): a turn whose call does not parse is plain
    text to the rollouts, as TRL (no call run, none counted), and `ablate generate` shows it as a malformed call
    with why, not as the answer; a good call and a plain answer are unchanged."""
    from ablate.cli.generate import show_turns

    tok, model = tiny()
    garbled = '<tool_call>{"name": "calculator", "arguments": {"expression": 12*34}}</tool_call>'  # not JSON
    gen, box = _generator(tok, script=lambda t: garbled if "12*34" in t else perfect(t))
    out = gen(model, [box.prompt_ids(question("12*34")), box.prompt_ids(question("2*3"))])
    assert (out.tool_calls, out.tool_failures) == (
        [0, 1],
        [0, 0],
    )  # TRL's counts: the garbled turn ran nothing
    assert gen.malformed[0] is not None and "does not parse" in gen.malformed[0] and gen.malformed[1] is None
    lines = show_turns(out.messages[0], gen.malformed[0])
    assert lines[0].startswith("malformed call (not run: it does not parse") and garbled in lines[0], lines
    assert lines[1] == "answer: (none: the last turn is a tool call that could not be read)"
    assert not any(line.startswith("answer: <tool_call>") for line in lines)
    assert show_turns(out.messages[1], gen.malformed[1])[-1] == "answer: 6"


def huge(expression: str) -> str:
    """A calculator that answers with 20 MB of digits.

    Args:
        expression: ignored
    """
    return "9" * 20_000_000


def test_a_huge_tool_result_is_cut_before_it_is_tokenized():
    """A tool result is cut to Toolbox.max_result_tokens: to that many tokens' worth of characters first (the
    vocabulary's longest token each), then by its own tokens, so the tokenizer never reads the 20 MB a tool
    returned; cut results are counted (tools/truncated_frequency) and said once. At the completion budget
    (the default: max_completion_length) the cut changes nothing: a result that long never fits, and the
    rollout ends as TRL's does, with the same ids."""
    import logging

    tok, model = tiny()
    seen: list[int] = []
    real = type(tok).__call__

    def counting(self, text, *args, **kwargs):
        seen.append(len(text) if isinstance(text, str) else sum(len(t) for t in text))
        return real(self, text, *args, **kwargs)

    prompts = lambda box: [box.prompt_ids(question("12*34")), box.prompt_ids(question("2*3"))]  # noqa: E731
    box = Toolbox(ToolFormat(tok), [huge], max_result_tokens=128)
    gen = ToolGenerator(Scripted(tok, lambda t: CALL.replace("calculator", "huge") % "1"), box, tok, 128)
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("ablate").addHandler(handler)
    try:
        type(tok).__call__ = counting
        out = gen(model, prompts(box))
    finally:
        type(tok).__call__ = real
        logging.getLogger("ablate").removeHandler(handler)
    assert max(seen) <= 128 * box.format.longest_token, max(seen)  # never the whole result
    assert out.tool_calls == [1, 1] and out.tool_truncated == [1, 1]
    said = [r.getMessage() for r in records if "returned 20000000 characters" in r.getMessage()]
    assert len(said) == 1 and "cut to its first 128 tokens" in said[0], [r.getMessage() for r in records]
    metrics = tool_metrics(out.tool_calls, out.tool_failures, out.tool_truncated)
    assert metrics["tools/truncated_frequency"].item() == 1.0
    # at the budget the cut changes nothing (a result of 5000 characters, tokenized whole without a cut)

    def long(expression: str) -> str:
        return "9" * 5000

    long.__name__, long.__doc__ = "huge", huge.__doc__
    ids = []
    for cut in (None, 128):
        box = Toolbox(ToolFormat(tok), [long], max_result_tokens=cut)
        gen = ToolGenerator(Scripted(tok, lambda t: CALL.replace("calculator", "huge") % "1"), box, tok, 128)
        ids.append(gen(model, prompts(box)).ids)
    assert ids[0] == ids[1]
    # below the budget the model reads the result's start
    box = Toolbox(ToolFormat(tok), [huge], max_result_tokens=8)
    gen = ToolGenerator(
        Scripted(tok, lambda t: "ok" if "<|tool|>" in t else CALL.replace("calculator", "huge") % "1"),
        box,
        tok,
        256,
    )
    out = gen(model, prompts(box))
    assert out.messages[0][1] == {"role": "tool", "name": "huge", "content": "9" * 8}, out.messages[0][1]
