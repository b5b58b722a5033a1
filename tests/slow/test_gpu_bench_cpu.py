"""benchmarks/gpu.py's CPU mode end to end (`--device cpu --tiny`): the same script the H200 runs, on tiny
shapes: every speed path exact against speed=off on this device, a table per section with TRL's side
and each ablate variant, the CPU smoke lines completed, and a record the speed plan can read. Timings
here are noise (seconds on a shared machine); the run is about the script working. ~3 min on 2 cores
(nine processes, each importing transformers and TRL): slow suite."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def test_gpu_benchmark_cpu_mode(tmp_path, monkeypatch):
    out, record = tmp_path / "out.json", tmp_path / "measured.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks/gpu.py"), "--device", "cpu", "--tiny", "--budget",
                           "3000", "--smoke-dir", str(tmp_path / "smoke"), "--out", str(out), "--record", str(record)],
                          capture_output=True, text=True, timeout=1800, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = proc.stdout
    for title in ("dpo tiny fp32 (cpu)", "grpo tiny fp32 (cpu)", "sft tiny fp32 (cpu)"):
        assert title in text, text
    res = json.loads(out.read_text())
    exact = res["exact"]["paths"]
    assert {"dpo_pair_rows", "padding_free", "completion_only_logits", "lean_layers", "grpo_group_rows",
            "length_groups", "grpo_packed", "shared_prefill"} <= set(exact)
    assert all(r["exact"] for r in exact.values()), exact
    for section, variants in (("dpo", {"trl", "ablate:off", "ablate:default", "ablate:forced", "ablate:padding_free"}),
                              ("grpo", {"trl", "ablate:off", "ablate:shared_prefill", "ablate:grpo_group_rows"}),
                              ("sft", {"trl", "ablate:off", "ablate:lean_layers"})):
        rows = {r["impl"]: r for r in res[section]["rows"]}
        assert variants <= set(rows) and not res[section]["errors"], (section, res[section]["errors"])
        assert all(r["s_per_step"] > 0 and r["tokens_per_s"] > 0 for r in rows.values())
    dpo = {r["impl"]: r for r in res["dpo"]["rows"]}
    assert dpo["ablate:off"]["max_loss_diff"] < 1e-4  # speed=off from TRL's init, data and batches: TRL's losses
    assert {name: r["status"] for name, r in res["smoke"].items()} == {"dpo": "completed", "grpo": "completed"}
    # the record: what the plan reads for this device type, one entry per path the two tables measured
    from ablate.speed import measured

    monkeypatch.setattr(measured, "RECORD", record)
    got = measured.measured("cpu")
    assert set(got) == set(res["verdicts"]) >= {"padding_free", "shared_prefill"}
    written = json.loads(record.read_text())["cpu"]["families"]  # the CPU's record: this CPU family's
    assert written[-1]["run"].startswith("benchmarks/gpu.py on ") and written[-1]["family"] == measured.cpu_family()
