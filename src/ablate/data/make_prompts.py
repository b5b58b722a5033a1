"""Generate the prompt-only datasets for online methods (GRPO) shipped in `ablate/data/tiny/`.

    python -m ablate.data.make_prompts

`repeat_letter`: the prompt is one letter four times (`cccc`), asking to go on repeating it; the
reward (`ablate.rewards.letters.repeat_fraction`) is the fraction of the completion's first `length`
characters that are c. The tiny model starts at ~1/256 per character and reaches ~1 in about a
hundred GRPO steps on a CPU: a task whose reward visibly rises from ~0 to ~1.

Why four letters and no instruction: the random-init model attends about uniformly, so with
`repeat c:` the letter is 1 token in 9 of what it sees and GRPO gets stuck emitting random letters
from the set (reward ~1/8, tried); with `cccc` the prompt's signal survives the averaging.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

OUT = Path(__file__).parent / "tiny"
LETTERS = "abcdefgh"
LENGTH = 8  # characters scored; match method.args.max_completion_length


def main(seed: int = 0, n_train: int = 512, n_eval: int = 64) -> None:
    rng = random.Random(seed)
    OUT.mkdir(exist_ok=True)
    for split, n in (("train", n_train), ("eval", n_eval)):
        rows = [{"prompt": x * 4, "letter": x, "length": LENGTH} for x in rng.choices(LETTERS, k=n)]
        (OUT / f"repeat_letter_{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


if __name__ == "__main__":
    main()
