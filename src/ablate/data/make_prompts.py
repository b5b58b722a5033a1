"""Generate the prompt-only datasets for online methods (GRPO) shipped in `ablate/data/tiny/`.

    python -m ablate.data.make_prompts

`repeat_letter`: the prompt is one letter four times (`cccc`), asking to go on repeating it; the
reward (`ablate.rewards.letters.repeat_fraction`) is the fraction of the completion's first `length`
characters that are c. The tiny model starts at ~1/256 per character and reaches ~1 in about a
hundred GRPO steps on a CPU: a task whose reward visibly rises from ~0 to ~1.

Held out: the task has only 8 training prompts (`aaaa` ... `hhhh`), so no random split of them can hold
any out. The eval prompts are the same letters repeated a number of times training never shows (2, 3, 5
... 10, not 4): each of the 64 (letter, count) pairs once, so a model scores on them only if it learned to
repeat the prompt's letter, not an answer to each of 8 prompts at one length. Letters training never shows
would test nothing learnable: the byte model never sees their tokens (0.0 after 200 GRPO steps, measured).

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
TRAIN_REPEATS = 4  # each train prompt is its letter this many times
EVAL_REPEATS = (2, 3, 5, 6, 7, 8, 9, 10)  # held out: never a train prompt's length


def length() -> int:
    """Characters scored: the data config's completion length (conf/data/tiny_repeat.yaml), declared there."""
    import yaml

    from ablate.paths import conf_dir

    return int(
        yaml.safe_load((Path(conf_dir()) / "data" / "tiny_repeat.yaml").read_text())["max_completion_length"]
    )


def main(seed: int = 0, n_train: int = 512, n_eval: int = 64) -> None:
    rng = random.Random(seed)
    n = length()
    OUT.mkdir(exist_ok=True)
    train = [(x, TRAIN_REPEATS) for x in rng.choices(LETTERS, k=n_train)]
    held_out = [(x, k) for x in LETTERS for k in EVAL_REPEATS]
    rng.shuffle(held_out)  # after the train draws: the train file does not depend on the eval design
    for split, pairs in (("train", train), ("eval", held_out[:n_eval])):
        rows = [{"prompt": x * k, "letter": x, "length": n} for x, k in pairs]
        (OUT / f"repeat_letter_{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


if __name__ == "__main__":
    main()
