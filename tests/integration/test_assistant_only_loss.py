"""SFT on multi-turn `messages` rows with `method.args.assistant_only_loss=true` (TRL's option): only the
assistant turns (content + end-of-turn token) count towards the loss, as `ablate data preview` shows and
the trainer's labels hold; without it every token counts (TRL's default). Tiny model, seconds each.
Against TRL itself: tests/parity/test_trl_formats.py::test_sft_assistant_only_loss_matches_trl;
on SmolLM2: tests/slow/test_smollm2.py::test_sft_on_messages_trains_only_assistant_turns."""

from __future__ import annotations

import json
import re
from pathlib import Path

from conftest import ablate, summary
from datasets import Dataset

ENV = {"OMP_NUM_THREADS": "1"}
CONVERSATIONS = [
    [
        {"role": "user", "content": f"sort: {q}"},
        {"role": "assistant", "content": "".join(sorted(q))},
        {"role": "user", "content": "again, reversed"},
        {"role": "assistant", "content": "".join(sorted(q))[::-1]},
    ]
    for q in ("cba", "fed", "hg", "kji")
]


def _data(tmp_path: Path) -> Path:
    path = tmp_path / "chats.jsonl"
    path.write_text("".join(json.dumps({"messages": m}) + "\n" for m in CONVERSATIONS))
    return path


def _marked(stdout: str) -> list[str]:
    """The loss spans of the printed examples (the legend line names the brackets too)."""
    return re.findall(r"⟦(.*?)⟧", stdout.split("===== example 0 =====", 1)[1], re.S)


def test_tiny_chat_template_text_is_unchanged_by_its_generation_markers():
    from ablate.models.tokenizer import byte_tokenizer

    text = byte_tokenizer().apply_chat_template(
        CONVERSATIONS[0][:3], tokenize=False, add_generation_prompt=True
    )
    assert text == "<|user|>sort: cba</s>\n<|assistant|>abc</s>\n<|user|>again, reversed</s>\n<|assistant|>"


def test_preview_marks_only_the_assistant_turns(tmp_path):
    args = ["data", "preview", "method=sft", "data=jsonl", f"data.train_path={_data(tmp_path)}", "-n", "1"]
    r = ablate(*args, "method.args.assistant_only_loss=true", cwd=tmp_path, env=ENV)
    assert r.returncode == 0, r.stderr[-3000:]
    assert _marked(r.stdout) == ["abc</s>", "cba</s>"], r.stdout
    assert "(8 assistant tokens in the loss)" in r.stdout  # 3 + EOS, twice
    everything = ablate(*args, cwd=tmp_path, env=ENV)  # TRL's default: the whole conversation
    assert everything.returncode == 0, everything.stderr[-3000:]
    (marked,) = _marked(everything.stdout)
    assert marked.startswith("<|user|>sort: cba") and marked.endswith("<|assistant|>cba</s>\n")


def test_shipped_caps_messages_preview(tmp_path):
    """data=caps_messages (shipped, two turns each): two marked spans per conversation, both in capitals."""
    r = ablate(
        "data",
        "preview",
        "method=sft",
        "data=caps_messages",
        "method.args.assistant_only_loss=true",
        "-n",
        "1",
        cwd=tmp_path,
        env=ENV,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "format: language modeling (conversational)" in r.stdout and "76 train rows" in r.stdout, r.stdout
    spans = _marked(r.stdout)
    assert len(spans) == 2 and all(s.endswith("</s>") and s[:-4] == s[:-4].upper() for s in spans), spans


def test_labels_cover_only_assistant_tokens_and_it_trains(tmp_path):
    from ablate.methods.sft import SFTConfig, SFTTrainer
    from ablate.models import tiny

    tok, model = tiny()
    args = SFTConfig(
        output_dir=str(tmp_path),
        max_steps=2,
        per_device_train_batch_size=4,
        report_to="none",
        use_cpu=True,
        save_strategy="no",
        disable_tqdm=True,
        assistant_only_loss=True,
    )
    trainer = SFTTrainer(
        model=model,
        args=args,
        train_dataset=Dataset.from_list([{"messages": m} for m in CONVERSATIONS]),
        processing_class=tok,
    )
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(4)])
    for row, labels in zip(CONVERSATIONS, batch["labels"]):
        kept = tok.decode([t for t in labels.tolist() if t != -100])
        assert kept == f"{row[1]['content']}</s>{row[3]['content']}</s>", kept
    assert trainer.train().global_step == 2


def test_cli_trains_on_messages_with_assistant_only_loss(tmp_path):
    r = ablate(
        "train",
        "method=sft",
        "data=jsonl",
        f"data.train_path={_data(tmp_path)}",
        "method.args.assistant_only_loss=true",
        "method.args.max_steps=2",
        "method.args.logging_steps=1",
        cwd=tmp_path,
        env=ENV,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    (run_dir,) = [p.parent for p in (tmp_path / "outputs" / "runs").glob("*/*/summary.json")]
    s = summary(run_dir)
    assert s["status"] == "completed" and s["global_step"] == 2 and s["metrics"]["train_loss"] > 0, s


def test_text_rows_are_refused_in_one_line(tmp_path):
    data = tmp_path / "text.jsonl"
    data.write_text(json.dumps({"text": "abc"}) + "\n")
    r = ablate(
        "train",
        "method=sft",
        "data=jsonl",
        f"data.train_path={data}",
        "method.args.assistant_only_loss=true",
        "method.args.max_steps=1",
        cwd=tmp_path,
        env=ENV,
    )
    assert r.returncode != 0 and "assistant_only_loss=true needs conversational rows" in r.stderr, r.stderr[
        -2000:
    ]


# Llama 3's chat template as its tokenizers ship it (no {% generation %} markers: ablate finds the assistant turns by
# rendering prefixes, ablate.data.chat_templates; tests/unit/test_assistant_mask.py checks it by hand)
LLAMA3 = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
    "message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
# a template that writes the last assistant turn differently from earlier ones (as reasoning templates do)
REWRITES = (
    "{% for m in messages %}<{{ m['role'] }}>{% if m['role'] == 'assistant' and loop.last %}[final] {% endif %}"
    "{{ m['content'] }}</s>{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}"
)


def _model_with_template(tmp_path: Path, template: str) -> Path:
    """The tiny model saved with another chat template (what model=local reads)."""
    from ablate.models import tiny

    tok, model = tiny()
    tok.chat_template = template
    out = tmp_path / "model"
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def test_cli_trains_with_a_template_without_generation_markers(tmp_path):
    """model=local with Llama 3's template: the preview marks exactly the two assistant turns (content and
    <|eot_id|>), and SFT with assistant_only_loss trains."""
    common = [
        "method=sft",
        "model=local",
        f"model.path={_model_with_template(tmp_path, LLAMA3)}",
        "data=jsonl",
        f"data.train_path={_data(tmp_path)}",
        "method.args.assistant_only_loss=true",
    ]
    r = ablate("data", "preview", *common, "-n", "1", cwd=tmp_path, env=ENV)
    assert r.returncode == 0, r.stderr[-3000:]
    assert _marked(r.stdout) == ["abc<|eot_id|>", "cba<|eot_id|>"], r.stdout
    assert f"({2 * len('abc<|eot_id|>')} assistant tokens in the loss)" in r.stdout, r.stdout
    r = ablate("train", *common, "method.args.max_steps=2", cwd=tmp_path, env=ENV)
    assert r.returncode == 0, r.stderr[-3000:]
    (run_dir,) = [p.parent for p in (tmp_path / "outputs" / "runs").glob("*/*/summary.json")]
    s = summary(run_dir)
    assert s["status"] == "completed" and s["global_step"] == 2 and s["metrics"]["train_loss"] > 0, s


def test_template_whose_turns_cannot_be_found_is_refused_in_one_line(tmp_path):
    r = ablate(
        "train",
        "method=sft",
        "model=local",
        f"model.path={_model_with_template(tmp_path, REWRITES)}",
        "data=jsonl",
        f"data.train_path={_data(tmp_path)}",
        "method.args.assistant_only_loss=true",
        "method.args.max_steps=1",
        cwd=tmp_path,
        env=ENV,
    )
    lines = [line for line in r.stderr.splitlines() if line.startswith("ablate: error:")]
    assert r.returncode != 0 and len(lines) == 1, r.stderr[-3000:]
    assert "renders message 1 (assistant) differently once later messages follow" in lines[0], lines
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
