"""benchmarks/gpu.py's CPU mode end to end (`--device cpu --tiny`): the same script the H200 runs, on tiny
shapes: every speed path exact against speed=off on this device, a table per section with TRL's side
and each ablate variant, the CPU smoke lines completed, and a record the speed plan can read. Timings
here are noise (seconds on a shared machine); the run is about the script working, and about every ablate
variant of the dpo, grpo and sft tables taking TRL's steps (per-step loss, gradient norm, GRPO's reward).
7-9 min on 2 loaded cores (twenty processes, each importing transformers and TRL): slow suite."""

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
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks/gpu.py"),
            "--device",
            "cpu",
            "--tiny",
            "--budget",
            "3000",
            "--smoke-dir",
            str(tmp_path / "smoke"),
            "--out",
            str(out),
            "--record",
            str(record),
        ],
        capture_output=True,
        text=True,
        timeout=1800,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = proc.stdout
    for title in ("dpo tiny fp32 (cpu)", "grpo tiny fp32 (cpu)", "sft tiny fp32 (cpu)"):
        assert title in text, text
    res = json.loads(out.read_text())
    exact = res["exact"]["paths"]
    assert {
        "dpo_pair_rows",
        "padding_free",
        "completion_only_logits",
        "lean_layers",
        "grpo_group_rows",
        "length_groups",
        "grpo_packed",
        "shared_prefill",
    } <= set(exact)
    assert all(r["exact"] for r in exact.values()), exact
    decisive = {"trl", "ablate:off", "ablate:forced", "ablate:default"}
    for section, variants in (
        ("dpo", decisive | {"ablate:padding_free"}),
        ("grpo", decisive | {"ablate:shared_prefill", "ablate:grpo_group_rows"}),
        ("sft", decisive | {"ablate:lean_layers"}),
    ):
        rows = {r["impl"]: r for r in res[section]["rows"]}
        assert variants <= set(rows) and not res[section]["errors"], (section, res[section]["errors"])
        assert res[section]["rows"][0]["impl"] == "trl"  # the base every agreement column is measured against
        assert all(r["s_per_step"] > 0 and r["tokens_per_s"] > 0 and r["mfu"] > 0 for r in rows.values())
        # speed=off from TRL's init, data and batches: TRL's per-step losses and gradient norms
        assert (
            rows["ablate:off"]["max_loss_diff"] < 1e-4 and rows["ablate:off"]["max_grad_norm_rel"] < 1e-4
        ), section
        assert f"{section} tiny fp32 (cpu)" in text
    # GRPO and SFT: every variant against TRL, step by step (fp32 on a CPU: each path exact); GRPO's rewards too,
    # its samples drawn alike (each round's RNG seeded alike on every side)
    for section in ("grpo", "sft"):
        runs = res[section]["runs"]
        assert (
            len(runs["trl"][0]["losses"])
            == len(runs["trl"][0]["grad_norms"])
            == (2 if section == "grpo" else 3)
        )
        assert all(
            g > 0 for g in runs["trl"][0]["grad_norms"]
        )  # a real gradient: the agreement is not 0 == 0
        for r in res[section]["rows"][1:]:
            assert r["max_loss_diff"] < 1e-4 and r["max_grad_norm_rel"] < 1e-4, (section, r)
    trl_rewards = res["grpo"]["runs"]["trl"][0]["rewards"]
    assert len(trl_rewards) == 2 and all(0 < x < 1 for x in trl_rewards)
    assert all(r["max_reward_diff"] < 1e-6 for r in res["grpo"]["rows"][1:]), res["grpo"]["rows"]
    assert "max |dreward|" in text and "grad-norm rel" in text
    assert res["sft"]["rows"][0].get("max_reward_diff") is None  # SFT logs no reward
    assert {name: r["status"] for name, r in res["smoke"].items()} == {
        "dpo": "completed",
        "grpo": "completed",
    }
    # the record: what the plan reads for this device type, one entry per path the two tables measured
    from ablate.speed import measured

    monkeypatch.setattr(measured, "RECORD", record)
    got = measured.measured("cpu")
    assert set(got) == set(res["verdicts"]) >= {"padding_free", "shared_prefill"}
    written = json.loads(record.read_text())["cpu"]["families"]  # the CPU's record: this CPU family's
    assert (
        written[-1]["run"].startswith("benchmarks/gpu.py on ")
        and written[-1]["family"] == measured.cpu_family()
    )
