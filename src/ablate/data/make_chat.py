"""Generate the small conversational datasets shipped in `ablate/data/tiny/` for a real chat model
(`model=smollm2_135m`), seeded; rerun to reproduce them:

    python -m ablate.data.make_chat

The task is a format instruction: every user turn ends with "Answer in ALL CAPS." and the right
answer is the plain answer upper-cased. SmolLM2-135M-Instruct knows the answers but rarely follows the
instruction (it answers in sentence case), so a few CPU minutes of training visibly change that:
- `caps_prefs`: DPO pairs; chosen = the answer in capitals, rejected = the same answer as written.
  Both say the same thing, so the only learnable difference is the format (a real preference, not a
  fact the model lacks). Eval pairs ask questions that are not in the train split.
- `caps_sft`: conversational prompt/completion (lists of chat messages); completion in capitals.
- `caps_messages`: the same questions as two-turn conversations in TRL's `messages` format (user,
  assistant, user, assistant; answers in capitals), consecutive questions of a split paired up. For
  SFT with `method.args.assistant_only_loss=true`: the loss is on the two assistant turns only.
- `one_word_prompts`: prompt-only rows for GRPO, the same questions ending "Answer with one word.",
  scored by `ablate.rewards.format.one_word` (the model starts out answering with a sentence; the
  capitals instruction made a poor GRPO task: ~8% of letters capitalised at the start, no rise in
  6 steps, so too few samples in a group differ for a short CPU run).
Questions are built from a few fact tables (colours, capitals, sums, opposites, animal sounds); the
splits are disjoint by question.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

OUT = Path(__file__).parent / "tiny"
INSTRUCTION = "Answer in ALL CAPS."
ONE_WORD = "Answer with one word."

COLOURS = {
    "the sky": "blue",
    "grass": "green",
    "snow": "white",
    "coal": "black",
    "a banana": "yellow",
    "a tomato": "red",
    "an orange": "orange",
    "a lemon": "yellow",
    "milk": "white",
    "a carrot": "orange",
    "a strawberry": "red",
    "the sun": "yellow",
    "a crow": "black",
    "a lime": "green",
    "chocolate": "brown",
    "a cloud": "white",
    "an emerald": "green",
    "a ruby": "red",
    "a pumpkin": "orange",
    "the sea": "blue",
}
CAPITALS = {
    "France": "Paris",
    "Italy": "Rome",
    "Spain": "Madrid",
    "Germany": "Berlin",
    "Japan": "Tokyo",
    "Egypt": "Cairo",
    "Russia": "Moscow",
    "China": "Beijing",
    "Greece": "Athens",
    "Peru": "Lima",
    "Norway": "Oslo",
    "Kenya": "Nairobi",
    "Canada": "Ottawa",
    "Ireland": "Dublin",
    "Poland": "Warsaw",
    "Austria": "Vienna",
    "Portugal": "Lisbon",
    "Sweden": "Stockholm",
    "Cuba": "Havana",
    "India": "New Delhi",
}
OPPOSITES = {
    "hot": "cold",
    "big": "small",
    "up": "down",
    "fast": "slow",
    "happy": "sad",
    "light": "dark",
    "open": "closed",
    "early": "late",
    "full": "empty",
    "strong": "weak",
    "old": "young",
    "wet": "dry",
    "hard": "soft",
    "loud": "quiet",
    "rich": "poor",
    "tall": "short",
    "day": "night",
    "left": "right",
    "win": "lose",
    "begin": "end",
}
SOUNDS = {
    "dog": "woof",
    "cat": "meow",
    "cow": "moo",
    "duck": "quack",
    "sheep": "baa",
    "pig": "oink",
    "owl": "hoot",
    "lion": "roar",
    "horse": "neigh",
    "frog": "croak",
    "mouse": "squeak",
    "snake": "hiss",
}


def _facts() -> list[tuple[str, str]]:
    """(question, plain answer) pairs; each answer is one short sentence."""
    qa = [(f"What colour is {k}?", f"{k[0].upper() + k[1:]} is {v}.") for k, v in COLOURS.items()]
    qa += [(f"What is the capital of {k}?", f"The capital of {k} is {v}.") for k, v in CAPITALS.items()]
    qa += [(f"What is the opposite of {k}?", f"The opposite of {k} is {v}.") for k, v in OPPOSITES.items()]
    qa += [(f"What sound does a {k} make?", f"A {k} says {v}.") for k, v in SOUNDS.items()]
    qa += [
        (f"What is {a} plus {b}?", f"{a} plus {b} is {a + b}.") for a in range(1, 13) for b in range(1, 13)
    ]
    return qa


def _user(question: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"{question} {INSTRUCTION}"}]


def _assistant(text: str) -> list[dict[str, str]]:
    return [{"role": "assistant", "content": text}]


def _write(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def main(seed: int = 0, n_eval: int = 64) -> None:
    rng = random.Random(seed)
    qa = _facts()
    rng.shuffle(qa)
    OUT.mkdir(exist_ok=True)
    for split, rows in (("eval", qa[:n_eval]), ("train", qa[n_eval:])):
        _write(
            OUT / f"caps_prefs_{split}.jsonl",
            [
                {"prompt": _user(q), "chosen": _assistant(a.upper()), "rejected": _assistant(a)}
                for q, a in rows
            ],
        )
        _write(
            OUT / f"caps_sft_{split}.jsonl",
            [{"prompt": _user(q), "completion": _assistant(a.upper())} for q, a in rows],
        )
        _write(
            OUT / f"caps_messages_{split}.jsonl",
            [
                {"messages": _user(q1) + _assistant(a1.upper()) + _user(q2) + _assistant(a2.upper())}
                for (q1, a1), (q2, a2) in zip(rows[0::2], rows[1::2])
            ],
        )
        _write(
            OUT / f"one_word_prompts_{split}.jsonl",
            [{"prompt": [{"role": "user", "content": f"{q} {ONE_WORD}"}], "answer": a} for q, a in rows],
        )


if __name__ == "__main__":
    main()
