"""The user's path, as a new user walks it: default run dirs (named by their overrides, so holding
`=` and `,`) under a cwd whose path holds spaces and quotes, piped output, bf16 on a CPU machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import TESTS, ablate, summary

FAST = ["method.args.max_steps=1", "method.args.save_strategy=no"]


@pytest.fixture
def piped(monkeypatch):
    """A user's pipe: no COLUMNS in the environment, so rich assumes 80 columns."""
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.delenv("LINES", raising=False)


def _run_dirs(cwd: Path) -> list[Path]:
    return sorted((cwd / "outputs" / "runs").glob("*/*"))


def test_resume_a_default_named_run_dir_from_a_cwd_with_spaces_and_quotes(tmp_path):
    """`ablate resume outputs/runs/<date>/<time>_<overrides>`: the overrides held `=`, `,` and `+` (the dir
    name keeps only shell-safe characters), the cwd a space and a quote; the path reaches Hydra as one quoted
    override value."""
    cwd = tmp_path / "it's my runs"
    cwd.mkdir()
    common = [
        "method.args.max_steps=4",
        "method.args.save_steps=2",
        "+callbacks.crash._target_=crashing.CrashAt",
    ]
    crashed = ablate("train", *common, cwd=cwd, env={"ABLATE_TEST_CRASH_AT": "3"})
    assert crashed.returncode != 0
    [run_dir] = _run_dirs(cwd)
    assert "max_steps-4_save_steps-2" in run_dir.name and not set(run_dir.name) & set("=,+'\" ")
    assert summary(run_dir)["status"] == "failed"

    resumed = ablate("resume", str(run_dir.relative_to(cwd)), cwd=cwd)  # as pasted: relative to the cwd
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    s = summary(run_dir)
    assert s["status"] == "completed" and s["global_step"] == 4
    assert _run_dirs(cwd) == [run_dir]  # resumed in place, no second dir
    assert f"run dir: {run_dir}\n" in resumed.stdout


def test_run_dir_line_is_never_wrapped_when_piped(tmp_path, piped):
    cwd = tmp_path / ("a long project path " + "x" * 80)
    cwd.mkdir()
    r = ablate("train", *FAST, "seed=7", cwd=cwd)
    assert r.returncode == 0, r.stderr[-3000:]
    [run_dir] = _run_dirs(cwd)
    lines = [line for line in r.stdout.splitlines() if line.startswith("run dir: ")]
    assert lines == [f"run dir: {run_dir}"]  # whole, on one line, pasteable
    assert len(lines[0]) > 150


def test_sweep_table_paths_are_never_wrapped_when_piped(tmp_path, piped):
    cwd = tmp_path / ("a long project path " + "y" * 80)
    cwd.mkdir()
    r = ablate("train", "-m", "seed=1,2", *FAST, cwd=cwd)
    assert r.returncode == 0, r.stderr[-3000:]
    jobs = sorted(p.parent for p in (cwd / "outputs" / "sweeps" / "multirun").glob("*/*/summary.json"))
    assert len(jobs) == 2
    for job in jobs:
        assert len(str(job)) > 150
        assert str(job) in r.stdout, f"{job} is folded in the table:\n{r.stdout}"
    assert "2/2 jobs completed" in r.stdout


@pytest.mark.parametrize("precision, dtype", [("bf16", "torch.bfloat16"), ("fp32", "torch.float32")])
def test_bf16_autocasts_on_any_machine(tmp_path, precision, dtype):
    """The cheat-sheet's `ablate train optimizer=sgd precision=bf16` ("CPU ok"): on a CPU-only machine
    it trains on the CPU with the layers computing in bfloat16 (fp32 as the control), weights fp32."""
    out = tmp_path / "dtypes.json"
    r = ablate(
        "train",
        "optimizer=sgd",
        f"precision={precision}",
        "method.args.max_steps=2",
        "+callbacks.probe._target_=dtype_probe.DtypeProbe",
        cwd=tmp_path,
        env={"ABLATE_TEST_DTYPE_OUT": str(out)},
    )
    assert r.returncode == 0, r.stderr[-3000:]
    seen = json.loads(out.read_text())
    assert seen["linear_out"] == [dtype]
    if not torch.cuda.is_available():
        assert seen["device"] == "cpu"
    [run_dir] = _run_dirs(tmp_path)
    assert summary(run_dir)["status"] == "completed"
    from safetensors.torch import load_file

    weights = load_file(run_dir / "model" / "model.safetensors")
    assert {t.dtype for t in weights.values()} == {torch.float32}  # autocast only: weights stay fp32


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-only machines: bf16 there means use_cpu")
def test_bf16_under_torchrun_on_cpu(tmp_path):
    """`torchrun ... precision=bf16` on a CPU machine: both ranks train on the CPU (gloo) under bf16
    autocast, without the `method.args.use_cpu=true` that fp32 needs there."""
    out = tmp_path / "dtypes.json"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",
        "ABLATE_TEST_DTYPE_OUT": str(out),
    }
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node=2",
            "-m",
            "ablate",
            "train",
            "precision=bf16",
            "method.args.max_steps=2",
            "method.args.save_strategy=no",
            "+callbacks.probe._target_=dtype_probe.DtypeProbe",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    [run_dir] = _run_dirs(tmp_path)
    s = summary(run_dir)
    assert s["status"] == "completed" and s["metrics"]["epoch"] == pytest.approx(
        2 * 16 / 512
    )  # 2 ranks x 8 pairs
    assert json.loads(out.read_text()) == {"linear_out": ["torch.bfloat16"], "device": "cpu"}
