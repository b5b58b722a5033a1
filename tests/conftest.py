"""Shared fixtures: run the real console entry point in a subprocess, read run dirs."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent

if os.environ.get("PYTEST_XDIST_WORKER"):
    # Each xdist worker already has a core of its own: one thread per ablate process it starts
    # (torch's default pool would give every concurrent run all cores and oversubscribe them;
    # the vLLM suite, which wants every core for its engine, runs with -n 0: no worker, no limit).
    os.environ.setdefault("OMP_NUM_THREADS", "1")


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto` (pyproject addopts): one worker per available core, at most 4, for the default and the
    slow suite alike (a slow test's processes spend much of their time starting up and waiting)."""
    return max(1, min(4, len(os.sched_getaffinity(0))))


# Files whose tests share one machine-wide service run on one worker, one after the other: the SLURM
# cluster (test_slurm_multinode turns it into two nodes and back while it runs).
SHARED = {"tests/slow/test_slurm.py": "slurm", "tests/slow/test_slurm_multinode.py": "slurm"}
# The longest groups start first (xdist hands groups out in collection order), so that the workers
# end together rather than one finishing a long group alone: the groups that took over 4 minutes of a
# worker (2 cores, 2026-12-02), longest first; the others follow by their number of tests.
FIRST = ["tests/integration/test_kill_resume.py", "tests/slow/test_smollm2.py", "slurm", "docs:README.md",
         "tests/integration/test_run_dir.py", "tests/slow/test_sweeps.py", "tests/slow/test_fsdp.py",
         "tests/slow/test_ray.py", "tests/integration/test_train.py"]
DOC_LINE = re.compile(r"tests/integration/test_readme\.py::test_doc_line_runs\[([^:\]]+):\d+ ")


def group(nodeid: str) -> str:
    """The xdist work unit of a test: its file (its module fixtures are made once, on one worker), the
    SHARED name of its file, or for the docs test's lines their doc (a doc's lines run in order in one
    scratch clone; the docs spread over the workers)."""
    doc = DOC_LINE.match(nodeid)
    if doc:
        return f"docs:{doc.group(1)}"
    path = nodeid.split("::", 1)[0]
    return SHARED.get(path, path)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Work units by `group` (xdist's `--dist loadgroup` cannot do it under pytest 9.2: the group
    names it appends to node ids no longer reach them)."""
    from xdist.scheduler import LoadScopeScheduling

    config.option.loadscopereorder = False  # the order pytest_collection_modifyitems gives

    class ByGroup(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return group(nodeid)

    return ByGroup(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The groups in FIRST first, then the others by their number of tests, most first (xdist's own
    order); a stable sort: within a group, the file's order."""
    rank = {name: i for i, name in enumerate(FIRST)}
    groups = {item.nodeid: group(item.nodeid) for item in items}
    size = Counter(groups.values())
    items.sort(key=lambda item: (rank.get(groups[item.nodeid], len(FIRST)), -size[groups[item.nodeid]]))


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
