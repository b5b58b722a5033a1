"""A run's process group is destroyed before its process exits (ablate.process.setup.process_group_left):
left to the interpreter's exit, gloo's threads can abort a rank that completed its run (SIGABRT,
"terminate called without an active exception"; seen once in the FSDP slow test)."""

import subprocess
import sys
import textwrap

import pytest
from conftest import gloo_ranks

RANK = textwrap.dedent("""
    import os, sys
    import torch, torch.distributed as dist
    from ablate.process.setup import process_group_left
    dist.init_process_group("gloo")
    t = torch.ones(1) * (dist.get_rank() + 1)
    try:
        with process_group_left():
            dist.all_reduce(t)  # 1 + 2
            if sys.argv[1] == "failed":
                raise RuntimeError("the run failed")
    except RuntimeError:
        pass
    print("rank", os.environ["RANK"], "sum", int(t.item()), "initialized", dist.is_initialized(), flush=True)
""")


@pytest.mark.parametrize("how", ["finished", "failed"])
def test_both_ranks_leave_the_group_and_exit_cleanly(tmp_path, how):
    outs = gloo_ranks(RANK, how, timeout=120)
    for r, (code, out, err) in enumerate(outs):
        assert code == 0, err[-2000:]
        assert f"rank {r} sum 3 initialized False" in out, (out, err[-2000:])


def test_without_torch_distributed_imported_it_is_a_no_op(monkeypatch):
    from ablate.process import setup

    monkeypatch.delitem(sys.modules, "torch.distributed", raising=False)
    with setup.process_group_left():  # nothing to leave: no import of torch.distributed
        pass
    assert "torch.distributed" not in sys.modules


EXIT = textwrap.dedent("""
    import atexit, sys
    from ablate.process import setup
    atexit.register(lambda: print("atexit ran", flush=True))
    setup._GROUP_LEFT = sys.argv[1] == "left"
    with setup.exit_without_teardown():
        print("ran", flush=True)
        if sys.argv[2] != "none":
            sys.exit(int(sys.argv[2]) if sys.argv[2].isdigit() else sys.argv[2])
    print("after the block", flush=True)  # reached only when no group was left
""")


@pytest.mark.parametrize("left", ["left", "not"])
@pytest.mark.parametrize("code,rc", [("none", 0), ("3", 3), ("a message", 1)])
def test_a_rank_that_left_its_group_exits_past_teardown_with_its_code(left, code, rc):
    """A rank that left its group ends with os._exit: its exit code kept (sys.exit(3) -> 3, a message
    -> printed, 1), atexit handlers run and output flushed first; without a group nothing changes."""
    r = subprocess.run([sys.executable, "-c", EXIT, left, code], capture_output=True, text=True, timeout=60)
    assert r.returncode == rc, r.stderr
    assert "ran" in r.stdout and "atexit ran" in r.stdout
    assert ("after the block" in r.stdout) == (left == "not" and code == "none")
    assert ("a message" in r.stderr) == (code == "a message")
