"""Generate the calculator task shipped in `ablate/data/tiny/`: arithmetic the tiny model cannot do in its
head but can with a `calculator` tool (ablate.tools.calculator).

    python -m ablate.data.make_calc

Each question multiplies a 3-digit number by a 2-digit one ("What is 347*29?"): a 2-layer, 150k-parameter
byte model cannot multiply, but it can copy the expression into a tool call and the tool's result into its
answer, both copies its attention can learn.
- `calc_tools_sft`: demonstrations (conversational prompt/completion, TRL's format): the user's question; the
  assistant's call `calculator(expression="347*29")`; the tool's result; the assistant's answer, the number
  alone. A third (`direct`) answer at once, without the tool: the SFT model then calls the calculator about
  two times in three, and GRPO has something to learn (calling pays; answering from memory does not). The data
  config's `tools: [ablate.tools.calculator]` gives each row TRL's `tools` column (the calculator's schema),
  so its chat template shows the tool as GRPO's prompts do. For SFT (a warm start: the model learns the
  format).
- `calc_tools`: the questions alone, with the `answer` column the reward reads (ablate.rewards.calc.correct),
  for GRPO with `method.args.tools=[ablate.tools.calculator]` (data=calc_tools sets it).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from ablate.tools import calculator

OUT = Path(__file__).parent / "tiny"


def question(rng: random.Random) -> tuple[str, str]:
    """('347*29', '10063'): a 3-digit by 2-digit product and its value."""
    a, b = rng.randint(100, 999), rng.randint(10, 99)
    return f"{a}*{b}", str(a * b)


def demonstration(expression: str, answer: str, use_tool: bool = True) -> dict[str, Any]:
    """The question, then the calculator's call, its result and the answer; or (`use_tool=False`) the answer
    alone, which the model can imitate in form only: it cannot multiply."""
    call = {"type": "function", "function": {"name": "calculator", "arguments": {"expression": expression}}}
    turns = (
        [
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "name": "calculator", "content": calculator(expression)},
        ]
        if use_tool
        else []
    )
    return {
        "prompt": [{"role": "user", "content": f"What is {expression}?"}],
        "completion": [*turns, {"role": "assistant", "content": answer}],
    }


def main(
    seed: int = 0, n_sft: int = 2048, n_prompts: int = 512, n_eval: int = 64, direct: float = 1 / 3
) -> None:
    rng = random.Random(seed)
    seen: set[str] = set()

    def fresh() -> tuple[str, str]:  # no question twice across the files: eval stays held out
        while (q := question(rng))[0] in seen:
            pass
        seen.add(q[0])
        return q

    files = {
        f"calc_tools_sft_{split}": [
            demonstration(*fresh(), use_tool=rng.random() >= direct) for _ in range(n)
        ]
        for split, n in (("train", n_sft), ("eval", n_eval))
    }
    for split, n in (("train", n_prompts), ("eval", n_eval)):
        files[f"calc_tools_{split}"] = [
            {"prompt": [{"role": "user", "content": f"What is {e}?"}], "answer": a}
            for e, a in (fresh() for _ in range(n))
        ]
    OUT.mkdir(exist_ok=True)
    for name, rows in files.items():
        (OUT / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


if __name__ == "__main__":
    main()
