"""Generate the small datasets shipped in `ablate/data/tiny/` (seeded; rerun to reproduce them).

    python -m ablate.data.make_tiny

The task is sorting a few letters: `sort: dbca =` -> ` abcd`. A model of ~150k parameters learns it
in minutes on a CPU, so the default runs show real learning, not noise:
- `sort_prefs`: DPO pairs; chosen is the sorted string, rejected a wrong order of the same letters.
- `sort_sft`: prompt/completion pairs with the sorted string.
Both files of a split hold the same examples. The eval prompts are held out: drawn after the train ones,
skipping any word the train split (or an earlier eval row) has, so no eval prompt occurs in training.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

OUT = Path(__file__).parent / "tiny"
LETTERS = "abcdefgh"


def _example(rng: random.Random) -> tuple[str, str, str]:
    word = rng.sample(LETTERS, rng.randint(3, 5))
    target = "".join(sorted(word))
    wrong = list(target)
    while "".join(wrong) == target:
        rng.shuffle(wrong)
    return f"sort: {''.join(word)} =", f" {target}", f" {''.join(wrong)}"


def _write(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def main(seed: int = 0, n_train: int = 512, n_eval: int = 64) -> None:
    rng = random.Random(seed)
    OUT.mkdir(exist_ok=True)
    train = [_example(rng) for _ in range(n_train)]  # repeats allowed, as a sampled corpus has them
    seen, held_out = {p for p, _, _ in train}, []
    while len(held_out) < n_eval:
        if (ex := _example(rng))[0] not in seen:
            seen.add(ex[0])
            held_out.append(ex)
    for split, ex in (("train", train), ("eval", held_out)):
        _write(
            OUT / f"sort_prefs_{split}.jsonl", [{"prompt": p, "chosen": c, "rejected": r} for p, c, r in ex]
        )
        _write(OUT / f"sort_sft_{split}.jsonl", [{"prompt": p, "completion": c} for p, c, _ in ex])


if __name__ == "__main__":
    main()
