"""Per-example eval scores: `ablate eval`'s example ids (a hash of the raw row, or of the scored
tokens when tokenising dropped rows) and eval_examples.jsonl's round trip through the run dir."""

from __future__ import annotations

import hashlib
from pathlib import Path

from datasets import Dataset

from ablate.evaluation.heldout import example_ids
from ablate.record import rundir


def test_example_ids_hash_the_raw_row_unless_rows_were_dropped() -> None:
    raw = Dataset.from_list(
        [{"prompt": "a", "chosen": "b", "rejected": "c"}, {"prompt": "d", "chosen": "e", "rejected": "f"}]
    )
    scored = Dataset.from_list(
        [
            {"prompt_ids": [1], "chosen_ids": [2], "rejected_ids": [3]},
            {"prompt_ids": [4], "chosen_ids": [5], "rejected_ids": [6]},
        ]
    )
    # json.dumps(row, sort_keys=True) of the first raw row, hashed by hand
    first = hashlib.sha1(b'{"chosen": "b", "prompt": "a", "rejected": "c"}').hexdigest()[:16]
    ids = example_ids(raw, scored)
    assert ids[0] == first and len(set(ids)) == 2
    retokenised = Dataset.from_list([{"prompt_ids": [9, 9], "chosen_ids": [8], "rejected_ids": [7]}] * 2)
    assert example_ids(raw, retokenised) == ids  # another tokenizer: the same examples, the same ids
    dropped = example_ids(raw, scored.select([1]))  # a row dropped: ids of the scored tokens instead
    assert dropped == [
        hashlib.sha1(b'{"chosen_ids": [5], "prompt_ids": [4], "rejected_ids": [6]}').hexdigest()[:16]
    ]


def test_examples_round_trip_keeps_numbers_only(tmp_path: Path) -> None:
    rundir.write_examples(
        tmp_path,
        [
            {"id": "q0", "index": 0, "loss": 0.5, "correct": True, "answer": "x"},
            {"id": 7, "index": 1, "loss": 1},
        ],
    )
    with (tmp_path / rundir.EXAMPLES).open("a") as f:
        f.write('{"no id": 1}\n{"id": "half')  # both skipped: no id, a half-written line
    assert rundir.read_examples(tmp_path) == {"q0": {"loss": 0.5, "correct": 1.0}, "7": {"loss": 1.0}}
    assert rundir.read_examples(tmp_path / "nowhere") == {}
