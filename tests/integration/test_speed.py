"""Numbers in every run: `ablate train` from a scratch dir (default run dirs) logs tokens/s and MFU at
every training log event, shows them on the progress bar, records run-level values in summary.json,
and GRPO adds its time split; `ablate compare --metric speed` tabulates and plots them."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from conftest import ablate, metrics, summary

STEPS = ["method.args.max_steps=3", "method.args.logging_steps=1", "method.args.save_strategy=no"]


def _run(cwd: Path, cache: Path, *overrides: str) -> Path:
    r = ablate("train", *overrides, *STEPS, cwd=cwd, env={"OMP_NUM_THREADS": "1", "ABLATE_CACHE": str(cache)})
    assert r.returncode == 0, r.stderr[-3000:]
    assert "tok/s, MFU" in r.stderr  # the progress bar's postfix (tqdm writes to stderr)
    run_dir = Path(r.stdout.split("run dir: ")[-1].strip())
    assert run_dir.is_relative_to(cwd / "outputs" / "runs")
    return run_dir


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    cwd = tmp_path_factory.mktemp("scratch")
    return {
        "cwd": cwd,
        "dpo": _run(cwd, cwd / "cache_dpo"),  # peak measured by the probe
        "grpo": _run(
            cwd,
            cwd / "cache_grpo",
            "method=grpo",
            "method.args.per_device_train_batch_size=16",
            "peak_tflops=1.0",
        ),
    }  # peak given: no probe


def _train_events(run_dir: Path) -> list[dict]:
    return [e for e in metrics(run_dir) if "loss" in e]


def test_dpo_logs_tokens_per_second_and_mfu_against_the_probed_peak(runs) -> None:
    from ablate.models import tiny
    from ablate.speed import throughput as speed

    events = _train_events(runs["dpo"])
    assert [e["step"] for e in events] == [1, 2, 3]
    for e in events:
        assert e["tokens_per_second"] > 0 and 0 < e["mfu"] < 1, e
    s = summary(runs["dpo"])
    cached = json.loads((runs["cwd"] / "cache_dpo" / speed.PEAK_CACHE).read_text())
    assert len(cached) == 1 and "float32" in next(iter(cached))  # probed once, in the run's dtype, cached
    assert s["peak_tflops"] == pytest.approx(next(iter(cached.values()))["flops"] / 1e12, rel=1e-4)
    assert s["peak_source"].startswith(
        ("measured on an idle machine", "the best of 1 probe(s) on a busy CPU")
    )
    fpt = speed.flops_per_token(tiny()[1])
    for e in events:  # MFU = 6N * tokens/s / peak (DPO generates nothing)
        assert e["mfu"] == pytest.approx(e["tokens_per_second"] * fpt / (s["peak_tflops"] * 1e12), rel=1e-3)
    assert s["tokens_per_second"] > 0 and 0 < s["mfu"] < 1


def test_grpo_logs_its_time_split_and_counts_its_tokens(runs) -> None:
    events = _train_events(runs["grpo"])
    assert [e["step"] for e in events] == [1, 2, 3]
    for e in events:
        assert e["tokens_per_second"] > 0 and 0 < e["mfu"] < 1, e
        assert e["time/generation"] > 0 and e["time/scoring"] > 0 and e["time/training"] > 0, e
        # spg 1: each step trains on the prompt + completion tokens its round generated
        assert e["num_input_tokens_seen"] == e["num_tokens"]
    s = summary(runs["grpo"])
    assert s["peak_tflops"] == 1.0  # the user's value
    assert not (runs["cwd"] / "cache_grpo").exists()  # ... and no probe ran


def test_compare_tabulates_and_plots_speed(runs) -> None:
    out = runs["cwd"] / "report"
    r = ablate(
        "compare",
        "outputs/runs",
        "--metric",
        "speed",
        "--out",
        str(out),
        cwd=runs["cwd"],
        env={"COLUMNS": "250"},
    )
    assert r.returncode == 0, r.stderr[-3000:]
    header = next(line for line in r.stdout.splitlines() if "tokens_per_second" in line)
    assert "mfu" in header and "time/generation" in header
    rows = {row["group"]: row for row in csv.DictReader((out / "summary.csv").open())}
    by_method = {("grpo" if "grpo" in g else "dpo"): row for g, row in rows.items()}
    assert float(by_method["dpo"]["tokens_per_second mean"]) == pytest.approx(
        summary(runs["dpo"])["tokens_per_second"]
    )
    assert float(by_method["grpo"]["mfu mean"]) == pytest.approx(summary(runs["grpo"])["mfu"])
    assert by_method["dpo"]["time/training mean"] == ""  # DPO has no time split
    for name in ("tokens_per_second_vs_step.png", "mfu_vs_step.png", "time_generation_by_group.png"):
        assert (out / name).is_file(), name
