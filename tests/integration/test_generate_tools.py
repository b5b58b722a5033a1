"""`ablate generate` on a run whose training prompts offered tools, from a scratch directory: its prompts offer
the run's tools exactly as training rendered them (token for token), and the model's calls run as in the rollouts,
each call and its result shown, then the answer; --max-new-tokens defaults to the run's own budget.

The model: the tiny one, SFT'd on one calculator demonstration of data=calc_tools_sft until it has it by heart
(100 steps, a single row: the call, the tool's result, the answer), then one GRPO step with the calculator: a
tool run whose greedy decode calls the tool. Measured: greedy decode of the SFT model called the tool; the same
model prompted without the tools (what generate built before) wrote a garbled call."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import ROOT, ablate

QUESTION = "What is 964*59?"  # the demonstration's: calculator("964*59") -> 56876


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(scratch cwd, the SFT run, the GRPO run), trained by the CLI from the scratch cwd."""
    cwd = tmp_path_factory.mktemp("scratch dir")
    demo = (ROOT / "src/ablate/data/tiny/calc_tools_sft_train.jsonl").read_text().splitlines()[0]
    assert json.loads(demo)["prompt"][0]["content"] == QUESTION
    (cwd / "demo.jsonl").write_text(demo + "\n")
    (cwd / "questions.jsonl").write_text(
        json.dumps({"prompt": [{"role": "user", "content": QUESTION}], "answer": "56876"}) + "\n"
    )
    tools = "+data.tools=[ablate.tools.calculator]"
    sft = ablate(
        "train",
        "method=sft",
        "data=local",
        "data.train_path=demo.jsonl",
        tools,
        "method.args.assistant_only_loss=true",
        "method.args.per_device_train_batch_size=1",
        "method.args.max_steps=100",
        "method.args.save_strategy=no",
        "optimizer/scheduler=constant",
        "hydra.run.dir=outputs/sft",
        cwd=cwd,
        timeout=1800,
    )
    assert sft.returncode == 0, sft.stderr[-3000:]
    grpo = ablate(
        "train",
        "method=grpo",
        "data=local",
        "data.train_path=questions.jsonl",
        tools,
        "data.reward_funcs=[ablate.rewards.calc.correct]",
        "model=local",
        "model.path=outputs/sft/model",
        "method.args.max_steps=1",
        "method.args.per_device_train_batch_size=4",
        "method.args.num_generations=4",
        "method.args.max_completion_length=120",
        "method.args.save_strategy=no",
        "optimizer.optimizer.lr=1e-5",
        "hydra.run.dir=outputs/grpo",
        cwd=cwd,
        timeout=1800,
    )
    assert grpo.returncode == 0, grpo.stderr[-3000:]
    return cwd, cwd / "outputs/sft", cwd / "outputs/grpo"


def test_the_prompt_is_trainings_token_for_token(runs: tuple[Path, Path, Path], monkeypatch) -> None:
    """The SFT run's training prompt (its data loaded again, tokenized by SFT's own code, the rows' `tools` column
    from data.tools) and the GRPO run's (its rollouts' prompt encoding) equal what generate builds."""
    from hydra.utils import instantiate
    from omegaconf import OmegaConf
    from transformers import AutoTokenizer

    from ablate.cli.generate import run_toolbox, tool_prompt_ids
    from ablate.config.compose import register_resolvers
    from ablate.data.tokenize import tokenize_sft
    from ablate.rollouts.prompts import prompt_rows

    cwd, sft, grpo = runs
    monkeypatch.chdir(cwd)
    register_resolvers()
    for run in (sft, grpo):
        tok = AutoTokenizer.from_pretrained(run / "model")
        box, budget = run_toolbox(run, tok)
        ours = tool_prompt_ids(box, {"prompt": QUESTION})
        data = instantiate(OmegaConf.load(run / ".hydra/config.yaml").data).train
        if run == sft:
            trained = tokenize_sft(tok, data[0], 0, None, True)["prompt_ids"]
        else:
            trained = prompt_rows(data, tok, None, encode=box.prompt_ids)[0][0]["prompt_ids"]
        assert ours == trained, (tok.decode(ours), tok.decode(trained))
        assert tok.decode(ours).startswith("<|tools|>calculator(expression)</s>")
    assert run_toolbox(sft, tok)[1] is None and run_toolbox(grpo, tok)[1] == 120  # the GRPO run's budget


@pytest.mark.parametrize("which", ["sft", "grpo"])
def test_generate_runs_the_call_and_shows_call_result_answer(
    runs: tuple[Path, Path, Path], which: str
) -> None:
    cwd, *_ = runs
    r = ablate("generate", f"outputs/{which}", "--prompt", QUESTION, cwd=cwd)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.splitlines()
    assert "offering the run's tools (calculator; tool_call_format=chat_template)" in lines[0], lines[0]
    assert f"up to {120 if which == 'grpo' else 256} new tokens over all turns" in lines[0], lines[0]
    at = lines.index(f">>> {QUESTION}")
    assert lines[at + 1 : at + 4] == [
        'call:   calculator({"expression": "964*59"})',
        "result: 56876",
        "answer: 56876",
    ], r.stdout


def test_generate_json_rows_hold_the_turns(runs: tuple[Path, Path, Path]) -> None:
    cwd, *_ = runs
    r = ablate("generate", "outputs/grpo", "--prompts", "questions.jsonl", "--json", "--before", cwd=cwd)
    assert r.returncode == 0, r.stderr[-3000:]
    (row,) = [json.loads(line) for line in r.stdout.splitlines()]
    assert row["completion"] == "56876" and row["calls"] == 1
    assert [m["role"] for m in row["turns"]] == ["assistant", "tool", "assistant"]
    assert row["turns"][1] == {"role": "tool", "name": "calculator", "content": "56876"}  # the tool ran
    assert "before_turns" in row  # the starting model (the SFT run's) with the same tools


def test_a_garbled_call_is_said_to_be_one_not_printed_as_the_answer(runs: tuple[Path, Path, Path]) -> None:
    """The SFT model knows one demonstration by heart; asked other things it writes calls it garbles
    (measured: `<toool_call>{"name": ...}</tool_cal>` for "What is 12*7?" and "Hi"). Each is said to be a
    malformed call, with why, and no answer is printed for it; where it used to be printed as `answer: <toool_call>...`."""
    from ablate.rollouts.tool_calls import garbled

    cwd, *_ = runs
    r = ablate("generate", "outputs/sft", "--prompt", "What is 12*7?", "--prompt", "Hi", cwd=cwd)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.splitlines()
    answers = [line for line in lines if line.startswith("answer: ")]
    assert not [a for a in answers if garbled(a, "<tool_call>")], r.stdout  # no garbled call passes for one
    said = [i for i, line in enumerate(lines) if line.startswith("malformed call (not run: ")]
    assert said, r.stdout
    assert all(
        lines[i + 1] == "answer: (none: the last turn is a tool call that could not be read)" for i in said
    )


HUGE = '''def calculator(expression: str) -> str:
    """A calculator that answers with 20 MB of digits.

    Args:
        expression: what to compute
    """
    return "9" * 20_000_000
'''


@pytest.mark.slow
def test_a_tool_returning_20_mb_runs_its_steps_in_about_a_normal_tools_time(
    runs: tuple[Path, Path, Path],
) -> None:
    """Two GRPO steps from the SFT model, whose rollouts call the calculator: with the real one, then with one
    returning 20 MB per call. The result is cut to max_completion_length tokens before it is tokenized (it
    never fits the budget either way), so the steps take about the same time, where tokenizing 20 MB per call
    took ~140 s a step; the cut results are counted (tools/truncated_frequency) and said once."""
    from conftest import metrics, summary

    cwd, *_ = runs
    (cwd / "hugecalc.py").write_text(HUGE)
    seconds = {}
    for name, tool in (("normal", "ablate.tools.calculator"), ("huge", "hugecalc.calculator")):
        r = ablate(
            "train",
            "method=grpo",
            "data=local",
            "data.train_path=questions.jsonl",
            f"+data.tools=[{tool}]",
            "data.reward_funcs=[ablate.rewards.calc.correct]",
            "model=local",
            "model.path=outputs/sft/model",
            "method.args.max_steps=2",
            "method.args.per_device_train_batch_size=4",
            "method.args.num_generations=4",
            "method.args.max_completion_length=120",
            "method.args.save_strategy=no",
            "method.args.logging_steps=1",
            "optimizer.optimizer.lr=1e-5",
            f"hydra.run.dir=outputs/tool_{name}",
            cwd=cwd,
            timeout=1800,
        )
        assert r.returncode == 0, r.stderr[-3000:]
        run = cwd / f"outputs/tool_{name}"
        seconds[name] = summary(run)["metrics"]["train_runtime"]
        steps = [m for m in metrics(run) if "tools/call_frequency" in m]
        assert steps and steps[0]["tools/call_frequency"] > 0, steps  # the rollouts call the tool
        cut = [m["tools/truncated_frequency"] for m in steps if m["tools/call_frequency"] > 0]
        assert cut == [1.0 if name == "huge" else 0.0] * len(cut), (name, cut)  # every 20 MB result, no other
        said = (r.stdout + r.stderr).count("returned 20000000 characters: cut to its first 120 tokens")
        assert said == (1 if name == "huge" else 0), r.stdout[-3000:]
    assert seconds["huge"] <= 2 * seconds["normal"] + 10, seconds
