"""Every TRL dataset format trains; the real UltraFeedback shape works as `data=ultrafeedback_binarized`.

The CLI tests run from a scratch cwd with default run dirs (the user's path); the per-format matrix
builds the trainers in-process on the tiny model (one step each) to stay fast.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import ablate
from datasets import Dataset

ENV = {"OMP_NUM_THREADS": "1"}
Q = ["sort: cba", "sort: fed", "sort: hg", "sort: kji"]


def _conv(q: str, a: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": q}, {"role": "assistant", "content": a}]


def _write(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _ultrafeedback_rows() -> list[dict[str, Any]]:
    """trl-lib/ultrafeedback_binarized's columns: whole conversations, no prompt, plus scores."""
    return [
        {
            "chosen": _conv(q, "".join(sorted(q[6:]))),
            "rejected": _conv(q, q[6:]),
            "score_chosen": 8.0,
            "score_rejected": 3.5,
        }
        for q in Q
    ]


def _run_dirs(cwd: Path) -> list[Path]:
    return [p.parent for p in (cwd / "outputs" / "runs").glob("*/*/summary.json")]


def _completed(r: Any, cwd: Path) -> dict[str, Any]:
    assert r.returncode == 0, r.stderr[-3000:]
    (run,) = _run_dirs(cwd)
    s = json.loads((run / "summary.json").read_text())
    assert s["status"] == "completed" and s["global_step"] == 2, s
    return s


def test_ultrafeedback_shape_trains_with_the_config(tmp_path):
    """Issue 8 failure 4: on main this is `missing ['prompt']`. A local copy of the dataset (train and
    test files) through `data=ultrafeedback_binarized data.path=...`, eval included."""
    data = tmp_path / "uf"
    _write(data / "train.jsonl", _ultrafeedback_rows())
    _write(data / "test.jsonl", _ultrafeedback_rows()[:2])
    cwd = tmp_path / "work"
    cwd.mkdir()
    r = ablate(
        "train",
        "data=ultrafeedback_binarized",
        f"data.path={data}",
        "method.args.max_steps=2",
        "method.args.per_device_train_batch_size=2",
        "method.args.eval_strategy=steps",
        "method.args.eval_steps=2",
        cwd=cwd,
        env=ENV,
    )
    s = _completed(r, cwd)
    assert "eval_rewards/accuracies" in s["metrics"]


def test_saved_dataset_dir_and_h4_shape_train(tmp_path):
    """`save_to_disk` dirs load too; HuggingFaceH4's variant (a *string* prompt beside conversational
    chosen/rejected) has its prompt extracted from the conversations, as TRL's maybe_extract_prompt."""
    rows = [
        {"prompt": r["chosen"][0]["content"], "prompt_id": str(i), **r}
        for i, r in enumerate(_ultrafeedback_rows())
    ]
    Dataset.from_list(rows).save_to_disk(str(tmp_path / "saved"))
    cwd = tmp_path / "work"
    cwd.mkdir()
    r = ablate(
        "train",
        "data=ultrafeedback_binarized",
        f"data.path={tmp_path / 'saved'}",
        "data.eval_split=null",
        "method.args.max_steps=2",
        "method.args.per_device_train_batch_size=2",
        cwd=cwd,
        env=ENV,
    )
    _completed(r, cwd)


def test_column_mapping_trains(tmp_path):
    rows = [{"question": f"{q} =", "good": " " + "".join(sorted(q[6:])), "bad": " " + q[6:]} for q in Q]
    path = _write(tmp_path / "pairs.jsonl", rows)
    cwd = tmp_path / "work"
    cwd.mkdir()
    r = ablate(
        "train",
        "data=jsonl",
        f"data.train_path={path}",
        "data.columns.prompt=question",
        "data.columns.chosen=good",
        "data.columns.rejected=bad",
        "method.args.max_steps=2",
        "method.args.per_device_train_batch_size=2",
        cwd=cwd,
        env=ENV,
    )
    _completed(r, cwd)


def test_unmapped_columns_are_one_line(tmp_path):
    path = _write(tmp_path / "pairs.jsonl", [{"question": "q", "good": "a", "bad": "b"}])
    r = ablate("train", "data=jsonl", f"data.train_path={path}", f"hydra.run.dir={tmp_path / 'run'}", env=ENV)
    assert r.returncode == 2
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith(
        f"ablate: error: data.train_path={path}: DPO found columns ['bad', 'good', 'question'], "
        "expected one of"
    ), last
    assert "implicit-prompt preference: chosen, rejected" in last and "data.columns" in last
    assert not (tmp_path / "run").exists()  # refused from the file's first row, before the run dir


def _reward_len(completions: list[Any], **_: Any) -> list[float]:
    return [float(len(c if isinstance(c, str) else c[0]["content"])) for c in completions]


FORMATS = {
    "dpo standard": ("dpo", [{"prompt": f"{q} =", "chosen": " ab", "rejected": " ba"} for q in Q]),
    "dpo standard implicit": ("dpo", [{"chosen": f"{q} = ab", "rejected": f"{q} = ba"} for q in Q]),
    "dpo conversational": (
        "dpo",
        [
            {
                "prompt": [{"role": "user", "content": q}],
                "chosen": [{"role": "assistant", "content": "ab"}],
                "rejected": [{"role": "assistant", "content": "ba"}],
            }
            for q in Q
        ],
    ),
    "dpo conversational implicit": ("dpo", _ultrafeedback_rows()),
    "sft prompt-completion": ("sft", [{"prompt": f"{q} =", "completion": " ab"} for q in Q]),
    "sft conversational prompt-completion": (
        "sft",
        [
            {
                "prompt": [{"role": "user", "content": q}],
                "completion": [{"role": "assistant", "content": "ab"}],
            }
            for q in Q
        ],
    ),
    "sft messages": ("sft", [{"messages": _conv(q, "ab")} for q in Q]),
    "sft text": ("sft", [{"text": f"{q} = ab"} for q in Q]),
    "grpo standard": ("grpo", [{"prompt": q} for q in Q]),
    "grpo conversational": ("grpo", [{"prompt": [{"role": "user", "content": q}]} for q in Q]),
}


@pytest.mark.parametrize("name", list(FORMATS))
def test_every_format_trains(tmp_path, name):
    from ablate.methods.dpo import DPOConfig, DPOTrainer
    from ablate.methods.grpo import GRPOConfig, GRPOTrainer
    from ablate.methods.sft import SFTConfig, SFTTrainer
    from ablate.models import tiny

    method, rows = FORMATS[name]
    tok, model = tiny()
    common = dict(
        output_dir=str(tmp_path),
        max_steps=1,
        per_device_train_batch_size=4,
        report_to="none",
        use_cpu=True,
        save_strategy="no",
        disable_tqdm=True,
    )
    ds = Dataset.from_list(rows)
    if method == "dpo":
        trainer = DPOTrainer(model=model, args=DPOConfig(**common), train_dataset=ds, processing_class=tok)
    elif method == "sft":
        trainer = SFTTrainer(model=model, args=SFTConfig(**common), train_dataset=ds, processing_class=tok)
    else:
        args = GRPOConfig(**common, num_generations=2, max_completion_length=4)
        trainer = GRPOTrainer(
            model=model, args=args, train_dataset=ds, processing_class=tok, reward_funcs={"len": _reward_len}
        )
    out = trainer.train()
    assert trainer.state.global_step == 1 and out.training_loss == out.training_loss  # a number, not NaN
