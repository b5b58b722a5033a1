"""The run dir's flock (ablate.record.rundir.lock) and forked children."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

HOLDER = """
import os, signal, sys, time
from pathlib import Path
from ablate.record.rundir import lock
run_dir = Path(sys.argv[1])
lock(run_dir)
pid = os.fork()
if pid == 0:  # the child outlives its parent, as a generation worker still dying after a kill -9
    time.sleep(60)
    os._exit(0)
(run_dir / "child.pid").write_text(str(pid))
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.skipif(not hasattr(os, "register_at_fork"), reason="needs os.fork")
def test_a_forked_child_alive_after_its_parent_was_killed_does_not_hold_the_run_dir(tmp_path: Path) -> None:
    """The parent locks the dir, forks a child that sleeps, and is killed -9. While the child lives the
    lock is free: a resume right after the kill gets the dir (the CI failure: 'in use by PID ...', the
    PID of the killed trainer, its generation worker still exiting)."""
    run_dir = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-c", HOLDER, str(run_dir)], timeout=120)
    assert proc.returncode == -signal.SIGKILL
    child = int((run_dir / "child.pid").read_text())
    try:
        os.kill(child, 0)  # alive (raises if not): the case under test
        fd = os.open(run_dir / ".lock", os.O_RDWR)
        # The child lets go of its copy in its after-fork hook, its first act; on a loaded machine the
        # child may not have run yet when the parent is killed, so allow it a few seconds of its 60.
        deadline = time.monotonic() + 5
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError while the child holds it
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        os.close(fd)
    finally:
        os.kill(child, signal.SIGKILL)
        time.sleep(0.1)
