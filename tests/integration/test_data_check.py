"""`ablate data check` from a scratch dir: the splits a run would train and evaluate on, and one warning
line when eval prompts also occur in the training data (held-out metrics would overstate)."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import ablate

ENV = {"OMP_NUM_THREADS": "1"}
LINE = "warning: {} of {} eval prompts also occur in the training data ({}): held-out metrics will overstate"


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _pairs(prompts: list) -> list[dict]:
    return [{"prompt": p, "chosen": " yes", "rejected": " no"} for p in prompts]


def _warnings(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "warning:" in line]


def test_check_counts_eval_prompts_the_training_data_holds(tmp_path):
    train = _write(tmp_path / "train.jsonl", _pairs([f"q{i}" for i in range(10)]))
    held_out = _write(
        tmp_path / "eval.jsonl", _pairs(["q1", "q2 ", "q3", "new1", "new2"])
    )  # " q2 ": the same prompt
    r = ablate(
        "data",
        "check",
        "data=local",
        "data.train_path=train.jsonl",
        "data.eval_path=eval.jsonl",
        cwd=tmp_path,
        env=ENV,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "dpo: 10 train rows (train.jsonl), 5 eval rows; format: preference" in r.stdout
    assert _warnings(r.stderr) == ["ablate: " + LINE.format(3, 5, "train.jsonl")]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["eval.jsonl", "train.jsonl"]  # nothing written
    assert train.exists() and held_out.exists()


def test_check_messages_compares_user_turns_and_a_clean_split_says_so(tmp_path):
    """SFT on conversations: a prompt is its user turns, whatever the system prompt; a held-out split that is
    held out gets one line saying so and no warning."""

    def conv(q: str, system: str = "") -> dict:
        turns = [{"role": "system", "content": system}] if system else []
        return {"messages": [*turns, {"role": "user", "content": q}, {"role": "assistant", "content": "ok"}]}

    _write(tmp_path / "train.jsonl", [conv(f"question {i}") for i in range(6)])
    _write(tmp_path / "leaky.jsonl", [conv("question 0", system="Be brief."), conv("question 9")])
    _write(tmp_path / "clean.jsonl", [conv("question 7"), conv("question 8")])
    args = ["data", "check", "method=sft", "data=local", "data.train_path=train.jsonl"]
    r = ablate(*args, "data.eval_path=leaky.jsonl", cwd=tmp_path, env=ENV)
    assert r.returncode == 0, r.stderr[-3000:]
    assert _warnings(r.stderr) == ["ablate: " + LINE.format(1, 2, "train.jsonl")]
    r = ablate(*args, "data.eval_path=clean.jsonl", cwd=tmp_path, env=ENV)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "held out: none of the 2 eval prompts occurs in the training data" in r.stdout and not _warnings(
        r.stderr
    )


def test_check_without_eval_split_and_on_the_shipped_tasks(tmp_path):
    _write(tmp_path / "train.jsonl", _pairs(["a", "b"]))
    r = ablate("data", "check", "data=local", "data.train_path=train.jsonl", cwd=tmp_path, env=ENV)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "held out: no eval split, nothing to check" in r.stdout and not _warnings(r.stderr)
    for method in ("dpo", "sft", "grpo"):  # the shipped tasks are held out
        r = ablate("data", "check", f"method={method}", cwd=tmp_path, env=ENV)
        assert r.returncode == 0, r.stderr[-3000:]
        assert "held out: none of the 64 eval prompts occurs in the training data" in r.stdout, r.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.jsonl"]


def test_preview_warns_too_and_a_bad_eval_file_is_one_line(tmp_path):
    _write(tmp_path / "train.jsonl", _pairs(["a", "b"]))
    _write(tmp_path / "eval.jsonl", _pairs(["a"]))
    r = ablate(
        "data",
        "preview",
        "-n",
        "1",
        "data=local",
        "data.train_path=train.jsonl",
        "data.eval_path=eval.jsonl",
        cwd=tmp_path,
        env=ENV,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert _warnings(r.stderr) == ["ablate: " + LINE.format(1, 1, "train.jsonl")] and "example 0" in r.stdout
    r = ablate(
        "data",
        "check",
        "data=local",
        "data.train_path=train.jsonl",
        "data.eval_path=nope.jsonl",
        cwd=tmp_path,
        env=ENV,
    )
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and r.stderr.startswith("ablate: error: "), (
        r.stderr
    )
    assert "nope.jsonl" in r.stderr
