"""benchmarks/harness.py: alternation, the table's arithmetic (on children with known numbers), and the
child side (StepRecorder + report) on a real 2-step Trainer run. No timing is asserted."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import harness  # noqa: E402

FAKE_CHILD = """
import json, sys
name, log = sys.argv[1], sys.argv[2]
open(log, "a").write(name + "\\n")
loss = {"a": [1.0, 0.5, 0.25], "b": [1.0, 0.5, 0.26]}[name]
step = {"a": [9.0, 1.0, 1.0], "b": [9.0, 2.0, 2.0]}[name]
print("noise before the result")
print(json.dumps({"step_seconds": step, "losses": loss, "tokens": 300 if name == "a" else 0, "generated_tokens": 30,
                  "flops_per_token": 6.0, "peak_flops": 1000.0, "peak_rss_mb": 10.0 if name == "a" else 20.0,
                  "computed": {"tokens": 600, "head_rows": 30}, "head_params": 0.25}))
"""


def test_alternates_and_tabulates(tmp_path: Path) -> None:
    child, log = tmp_path / "child.py", tmp_path / "order.txt"
    child.write_text(FAKE_CHILD)
    results = harness.run_alternately({n: [sys.executable, str(child), n, str(log)] for n in ("a", "b")}, repeats=2)
    assert log.read_text().split() == ["a", "b", "a", "b"]
    assert all(r["process_seconds"] > 0 for runs in results.values() for r in runs)
    a, b = harness.summarize(results)
    assert (a["s_per_step"], b["s_per_step"]) == (1.0, 2.0)  # each run's first (warm-up) step left out
    assert a["tokens_per_s"] == 100.0 and a["tokens_counted"]  # 300 tokens / 3 steps / 1 s
    assert b["tokens_per_s"] == 50.0 and not b["tokens_counted"]  # b counts none: a's 100 per step, at 2 s
    assert a["mfu"] == pytest.approx((6 * 100 + 2 * 10) / 1.0 / 1000)  # 6N per trained, 2N per generated token
    assert b["mfu"] == pytest.approx((6 * 100 + 2 * 10) / 2.0 / 1000)
    # hardware: N = 1 (0.75 body + 0.25 head); per step 600/3 = 200 positions, 10 head rows:
    # 6 * (0.75 * 200 + 0.25 * 10) = 915 FLOPs per step
    assert a["hw_mfu"] == pytest.approx(915 / 1.0 / 1000) and b["hw_mfu"] == pytest.approx(915 / 2.0 / 1000)
    assert a["max_loss_diff"] == 0.0 and b["max_loss_diff"] == pytest.approx(0.01)
    assert b["peak_rss_mb"] == 20.0
    text = harness.format_table("title", [a, b])
    assert text.splitlines()[0] == "title" and "62.0%" in text and "31.0%" in text and "1.00e-02" in text
    assert "91.5%" in text and "45.8%" in text
    assert "50*" in text and "counted by another implementation" in text


def test_child_side_on_a_real_trainer(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("ABLATE_CACHE", str(tmp_path / "cache"))
    from ablate.data import packaged
    from ablate.models import tiny
    from ablate.trainers.sft import SFTConfig, SFTTrainer

    tok, model = tiny()
    rec = harness.StepRecorder()
    rec.watch(model)
    args = SFTConfig(output_dir=str(tmp_path / "out"), max_steps=2, logging_steps=1, per_device_train_batch_size=4,
                     report_to="none", save_strategy="no", use_cpu=True, disable_tqdm=True,
                     include_num_input_tokens_seen="non_padding")
    SFTTrainer(model=model, args=args, train_dataset=packaged("sort_sft", with_eval=False).train,
               processing_class=tok, callbacks=[rec]).train()
    out = harness.report(rec, model, args)
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == out
    assert len(out["step_seconds"]) == len(out["losses"]) == 2 and out["tokens"] > 0
    assert out["flops_per_token"] > 0 and out["peak_flops"] > 0 and "float32" in out["device"]
    # training forwards only: 2 steps of 4 padded rows, every position through the head (SFT's logits)
    assert out["computed"]["tokens"] == out["computed"]["head_rows"] >= out["tokens"] > 0
    assert out["head_params"] == model.get_output_embeddings().weight.numel()
