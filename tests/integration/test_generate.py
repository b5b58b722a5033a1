"""`ablate generate` on runs made as a user makes them (scratch cwd, default run dirs): a LoRA run on
the tiny model (adapter on a base built from code) and a full-model run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import ablate


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cwd = tmp_path_factory.mktemp("gen")
    r = ablate("train", "debug=fast", "+peft=lora", cwd=cwd)
    assert r.returncode == 0, r.stderr[-3000:]
    (run,) = (cwd / "outputs" / "runs").glob("*/*")
    assert (run / "model" / "adapter_config.json").is_file() and not (run / "model" / "config.json").exists()
    return run


def test_adapter_run_loads_with_trained_adapters(lora_run: Path) -> None:
    from ablate.cli.generate import load_run_model

    tok, model = load_run_model(lora_run)
    lora_b = [p for n, p in model.named_parameters() if "lora_B" in n]
    assert lora_b and any(float(p.abs().sum()) > 0 for p in lora_b)  # trained (LoRA B starts at zero)


def test_prompts_are_formatted_as_the_run_trained(lora_run: Path) -> None:
    """The run trained on plain-text prompts (tiny_prefs): run.json says so, and generate feeds the
    prompt's own tokens, as training did, not the chat template's (issue 37: 13/64 sorted right with
    the template, 64/64 without). A conversational run's plain prompt is a user turn, templated."""
    from ablate.cli.generate import load_run_model, prompt_ids, trained_format

    fmt = json.loads((lora_run / "run.json").read_text())["data_format"]
    assert fmt == {"format": "preference", "conversational": False}
    assert trained_format(lora_run)["conversational"] is False
    tok, _ = load_run_model(lora_run)
    assert prompt_ids(tok, {"prompt": "sort: dcba ="}, chat=False) == tok("sort: dcba =")["input_ids"]
    templated = tok.apply_chat_template(
        [{"role": "user", "content": "sort: dcba ="}], tokenize=False, add_generation_prompt=True
    )
    assert (
        prompt_ids(tok, {"prompt": "sort: dcba ="}, chat=True)
        == tok(templated, add_special_tokens=False)["input_ids"]
    )
    messages = [{"role": "user", "content": "sort: zy ="}]  # a conversation has no plain rendering: templated
    assert prompt_ids(tok, {"prompt": messages}, chat=False) == prompt_ids(
        tok, {"prompt": "sort: zy ="}, chat=True
    )


def test_an_older_run_without_the_record_reads_its_data(lora_run: Path, tmp_path: Path) -> None:
    """A run made before run.json recorded `data_format`: its data is loaded again from .hydra/config.yaml."""
    import shutil

    from ablate.cli.generate import trained_format

    old = tmp_path / "old_run"
    shutil.copytree(lora_run / ".hydra", old / ".hydra")
    info = json.loads((lora_run / "run.json").read_text())
    del info["data_format"]
    (old / "run.json").write_text(json.dumps(info))
    fmt = trained_format(old)
    assert fmt["conversational"] is False and fmt["source"] == ".hydra/config.yaml's data"
    (old / ".hydra" / "config.yaml").write_text(
        (old / ".hydra" / "config.yaml").read_text().replace("name: sort_prefs", "name: caps_prefs")
    )
    assert trained_format(old)["conversational"] is True  # chat messages: templated


def test_generate_cli_prompts_and_jsonl(lora_run: Path, tmp_path: Path) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(
        json.dumps({"prompt": "sort: cba ="})
        + "\n"
        + json.dumps({"prompt": [{"role": "user", "content": "sort: zy ="}]})
        + "\n"
    )
    args = [
        "generate",
        str(lora_run),
        "--prompt",
        "sort: dcba =",
        "--prompts",
        str(prompts),
        "--max-new-tokens",
        "5",
    ]
    r = ablate(*args, "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert [row["prompt"] for row in rows][:2] == ["sort: dcba =", "sort: cba ="] and len(rows) == 3
    assert all(isinstance(row["completion"], str) for row in rows)
    again = ablate(*args, "--json", cwd=tmp_path)
    assert again.stdout == r.stdout  # greedy by default: reproducible
    assert r.stderr.splitlines()[-1].startswith(
        "prompts: plain text, as written"
    )  # --json: stdout is the rows
    plain = ablate(*args[:4], cwd=tmp_path)
    assert plain.returncode == 0 and plain.stdout.startswith(
        "prompts: plain text, as written (the tokenizer's own special tokens), as the run's training rows "
        "(preference) were (run.json)\n\n>>> sort: dcba =\n"
    ), plain.stdout
    assert (
        "kernels" not in plain.stderr
    )  # bitsandbytes' CPU notice (peft imports it) is not the user's concern
    chat = ablate(*args[:4], "--format", "chat", cwd=tmp_path)
    assert (
        chat.stdout.startswith("prompts: chat template, a plain prompt as the user turn")
        and chat.stdout != plain.stdout
    )


def test_generate_counts_matches_with_the_files_completions(lora_run: Path, tmp_path: Path) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "sort: cba =", "completion": " abc"}) + "\n")
    r = ablate(
        "generate", str(lora_run), "--prompts", str(prompts), "--max-new-tokens", "3", "--json", cwd=tmp_path
    )
    assert r.returncode == 0, r.stderr[-3000:]
    (row,) = [json.loads(line) for line in r.stdout.splitlines()]
    assert row["expected"] == " abc" and row["match"] is (row["completion"].strip() == "abc")
    assert f"{int(row['match'])}/1 completions equal the file's `completion`" in r.stderr


def test_generate_errors_are_one_line(tmp_path: Path) -> None:
    r = ablate("generate", str(tmp_path), "--prompt", "x", cwd=tmp_path)
    assert r.returncode == 2 and "has no saved model" in r.stderr and "Traceback" not in r.stderr


def test_eval_scores_the_saved_model_on_other_data(lora_run: Path, tmp_path: Path) -> None:
    """`ablate eval RUN data=...`: the run's method metrics on another preference set, eval.json written;
    the reference is the base (adapters off), so the trained adapters give nonzero margins."""
    r = ablate("eval", str(lora_run), "data=caps_prefs", "data.max_eval_samples=4", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads((lora_run / "eval.json").read_text())
    assert result["method"] == "dpo" and result["split"] == "eval" and result["examples"] == 4
    assert "data=caps_prefs" in result["overrides"] and "debug=fast" in result["overrides"]
    m = result["metrics"]
    assert 0.0 <= m["eval_rewards/accuracies"] <= 1.0 and m["eval_rewards/margins"] != 0.0
    assert f"wrote {lora_run / 'eval.json'}" in r.stdout and "eval_loss" in r.stdout
    # no training counters of a trainer that trained nothing (issue 37: `eval_num_tokens 0`, `num_input_tokens_seen 0`)
    assert not {"epoch", "num_input_tokens_seen", "eval_num_tokens", "eval_model_preparation_time"} & set(m)
    assert "num_input_tokens_seen" not in r.stdout and "eval_num_tokens" not in r.stdout


def test_eval_of_a_non_run_is_one_line(tmp_path: Path) -> None:
    r = ablate("eval", str(tmp_path), cwd=tmp_path)
    assert r.returncode == 2 and "is not an ablate run dir" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("command", [["eval"], ["generate", "--prompt", "x"]])
def test_a_run_dir_that_does_not_exist_is_said_at_once(tmp_path: Path, command: list[str]) -> None:
    """Before any heavy import (no torch), in those words (issue 37: eval said "(no run.json)" after 8 s)."""
    import re
    import subprocess
    import sys

    code = (
        "import sys\nfrom ablate.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit:\n"
        "    assert 'torch' not in sys.modules, 'torch imported'\n    raise\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code, command[0], "outputs/runs/nope", *command[1:]],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2, r.stderr
    assert re.fullmatch(
        r"ablate: error: \S*outputs/runs/nope does not exist \(`ablate ls` lists your runs, newest first\)",
        r.stderr.strip(),
    ), r.stderr


def test_eval_writes_each_examples_scores(lora_run: Path, tmp_path: Path) -> None:
    """eval_examples.jsonl: one row per eval example, scored alone; their mean is eval.json's number
    (4 examples in one eval batch), so the per-example pass scores the same examples the same way."""
    r = ablate("eval", str(lora_run), "data=caps_prefs", "data.max_eval_samples=4", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"wrote {lora_run / 'eval_examples.jsonl'}" in r.stdout
    metrics = json.loads((lora_run / "eval.json").read_text())["metrics"]
    rows = [json.loads(line) for line in (lora_run / "eval_examples.jsonl").read_text().splitlines()]
    assert [row["index"] for row in rows] == [0, 1, 2, 3] and len({row["id"] for row in rows}) == 4
    assert all(row["rewards/accuracies"] in (0.0, 1.0) and "num_tokens" not in row for row in rows)
    for name in ("loss", "rewards/margins", "rewards/accuracies"):
        mean = sum(row[name] for row in rows) / 4
        assert mean == pytest.approx(metrics[f"eval_{name}"], rel=1e-3, abs=1e-5), name
