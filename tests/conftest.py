"""Shared fixtures: run the real console entry point in a subprocess, read run dirs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent

if os.environ.get("PYTEST_XDIST_WORKER"):
    # Each xdist worker already has a core of its own: one thread per ablate process it starts
    # (torch's default pool would give every concurrent run all cores and oversubscribe them).
    os.environ.setdefault("OMP_NUM_THREADS", "1")


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto` (pyproject addopts): one worker per available core, at most 4; none for `-m slow`,
    whose one-node SLURM cluster, torchrun jobs and aimed kills want the machine to themselves."""
    markexpr = config.getoption("markexpr") or ""
    if "slow" in markexpr and "not slow" not in markexpr:
        return 0
    return max(1, min(4, len(os.sched_getaffinity(0))))


def ablate(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None,
           timeout: int = 600) -> subprocess.CompletedProcess:
    """`python -m ablate <args>` in a subprocess (the same code path as the console script)."""
    full_env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
                "WANDB_MODE": os.environ.get("WANDB_MODE", "offline"), **(env or {})}
    return subprocess.run([sys.executable, "-m", "ablate", *args], cwd=cwd or ROOT, env=full_env,
                          capture_output=True, text=True, timeout=timeout)


def summary(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "summary.json").read_text())


def metrics(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture
def run_ablate():
    return ablate


@pytest.fixture(scope="module")
def smollm2():
    """SmolLM2-135M-Instruct's (model, tokenizer), loaded once per module from ablate's cache (for
    the slow suites; tests/slow/test_smollm2.py has its own `smollm2`: the converted dir)."""
    from ablate.models import smollm2_135m

    try:
        return smollm2_135m()
    except Exception as e:  # offline and not cached
        pytest.skip(f"SmolLM2-135M not available: {e}")
