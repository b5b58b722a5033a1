"""`ablate serve-rollouts`'s mistakes, each one line with exit 2 and nothing written (the server itself, and its
--dry-run command, need vLLM: tests/slow/test_vllm_distributed.py)."""

from __future__ import annotations

import importlib.util

import pytest
from conftest import ablate


@pytest.mark.parametrize(
    "args,words",
    [
        (["--port", "0"], "--port 0: must be a TCP port (1-65535)"),
        (["method=dpo"], "method/rollouts=vllm_server: this config has no config group method/rollouts"),
        (["method/rollouts=vllm"], "ablate serve-rollouts serves method/rollouts=vllm_server; this config's"),
    ],
)
def test_a_mistake_is_one_line_and_writes_nothing(tmp_path, args, words):
    if "method/rollouts=vllm" in args and importlib.util.find_spec("vllm") is None:
        pytest.skip("without vLLM the config check names the missing package first (the next test)")
    r = ablate("serve-rollouts", "--dry-run", *args, cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.startswith("ablate: error: ") and words in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not list(tmp_path.iterdir())


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_without_vllm_the_install_is_named(tmp_path):
    r = ablate("serve-rollouts", cwd=tmp_path)
    assert r.returncode == 2 and "needs the optional package 'vllm'" in r.stderr and "pip install" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not list(tmp_path.iterdir())
