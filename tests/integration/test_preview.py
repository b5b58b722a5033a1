"""`ablate data preview`: the examples as the model sees them, from the CLI, without training or weights."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import ablate

ENV = {"OMP_NUM_THREADS": "1"}


def _conv(q: str, a: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": q}, {"role": "assistant", "content": a}]


def _uf_file(path: Path) -> Path:
    """UltraFeedback's shape: row 0 has a long prompt, row 1 a long answer."""
    rows = [
        {
            "chosen": _conv("why? " * 40, "because"),
            "rejected": _conv("why? " * 40, "no"),
            "score_chosen": 1.0,
        },
        {
            "chosen": _conv("hi", "hello there, " * 10),
            "rejected": _conv("hi", "go away"),
            "score_chosen": 2.0,
        },
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_default_preview_marks_loss_tokens_and_writes_nothing(tmp_path):
    r = ablate("data", "preview", "-n", "2", cwd=tmp_path, env=ENV)
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout
    assert "format: preference" in out and "example 1" in out and "example 2" not in out
    # the shipped pairs: "sort: xyz =" then the loss part, which ends with EOS
    assert "--- chosen ---" in out and "=⟦ " in out and "</s>⟧" in out
    assert "tokens: prompt " in out and "(loss); total " in out
    assert list(tmp_path.iterdir()) == []  # no outputs/, no run dir: nothing trained, nothing written


def test_tokenizer_only_chat_template_and_truncation_notes(tmp_path):
    """A model dir with a tokenizer and a config.json but no weights: train would fail, preview works
    (only the tokenizer is loaded). Implicit-prompt conversations get the chat template and a split at
    the shared turns; a prompt filling max_length is reported dropped, a long answer cut."""
    from ablate.models.tokenizer import byte_tokenizer

    model = tmp_path / "model"
    byte_tokenizer().save_pretrained(model)
    (model / "config.json").write_text('{"model_type": "llama"}')  # not loadable as weights
    data = _uf_file(tmp_path / "uf.jsonl")
    args = [
        "data",
        "preview",
        "model=local",
        f"model.path={model}",
        "data=jsonl",
        f"data.train_path={data}",
        "method.args.max_length=60",
    ]
    r = ablate(*args, cwd=tmp_path, env=ENV)
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout
    assert "format: implicit-prompt preference" in out
    assert "<|user|>hi</s>\n<|assistant|>⟦hello there" in out and "<|assistant|>⟦go away</s>\n⟧" in out
    assert "note: DROPPED: the prompt (" in out and "alone fills max_length=60" in out
    assert "note: chosen cut from " in out and "(max_length=60)" in out
    r = ablate(*args, "method.args.max_prompt_length=20", "-n", "1", cwd=tmp_path, env=ENV)
    assert r.returncode == 0 and "note: prompt cut from " in r.stdout and "to its last 20 tokens" in r.stdout
    assert "DROPPED" not in r.stdout


def test_smollm2_preview(tmp_path, smollm2_dir):
    data = _uf_file(tmp_path / "uf.jsonl")
    r = ablate(
        "data",
        "preview",
        "model=smollm2_135m",
        "data=jsonl",
        f"data.train_path={data}",
        "-n",
        "2",
        cwd=tmp_path,
        env=ENV,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n⟦hello there" in r.stdout
    assert "⟦go away<|im_end|>\n⟧" in r.stdout


@pytest.mark.parametrize(
    "args,needle",
    [
        (["preview", "-n", "0"], "-n needs a positive number"),
        (["preview", "--bogus"], "ablate: error: '--bogus' is not an option of ablate data"),
        (
            ["show"],
            "ablate: error: ablate data: argument action: invalid choice: 'show' (choose from 'preview', 'check')",
        ),
        (["preview", "method=nope"], "ablate: error: "),
        # GRPO on the user's prompts without a reward: the same line train gives (was a Hydra traceback)
        (["preview", "method=grpo", "data=jsonl", "data.train_path=p.jsonl"], "GRPO needs a reward function"),
    ],
)
def test_bad_preview_args_are_one_line(tmp_path, args, needle):
    (tmp_path / "p.jsonl").write_text('{"prompt": "hello"}\n')
    r = ablate("data", *args, cwd=tmp_path, env=ENV)
    assert r.returncode == 2 and needle in r.stderr and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines() == [r.stderr.strip()]  # one line (the usage was a second)


def test_config_dir_and_pretokenized_data(tmp_path):
    """`--config-dir` as for train (a user's method dir); rows already in token ids are shown as they are."""
    import os

    from conftest import ROOT, TESTS

    example = ROOT / "examples" / "custom_batch"
    path = os.pathsep.join([str(TESTS), str(example), os.environ.get("PYTHONPATH", "")])
    r = ablate(
        "data",
        "preview",
        "--config-dir",
        str(example),
        "method=dpo_custom_batch",
        "-n",
        "1",
        cwd=tmp_path,
        env={**ENV, "PYTHONPATH": path},
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "dpo_custom_batch on 512 train rows, format: already tokenized" in r.stdout
    assert "sort: " in r.stdout and "⟧" in r.stdout


def test_colour_only_on_a_terminal(monkeypatch):
    import io

    from ablate.cli.data import CLOSE, GREEN, OPEN, preview

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.delenv("NO_COLOR", raising=False)
    tty = Terminal()
    preview([], 1, out=tty)
    assert GREEN in tty.getvalue() and OPEN not in tty.getvalue()
    monkeypatch.setenv("NO_COLOR", "1")
    plain = Terminal()
    preview([], 1, out=plain)
    assert GREEN not in plain.getvalue() and OPEN in plain.getvalue() and CLOSE in plain.getvalue()
