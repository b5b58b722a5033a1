"""A local_parallel sweep's workers die with their parent (issue 22, "Orphans"): kill -9 of the
parent left its loky workers training, then starting the queued jobs with no parent, still alive 5
minutes later. Now each worker notices within seconds, records `interrupted` and exits; the queued
job never starts."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from conftest import TESTS, summary

pytestmark = pytest.mark.slow


def test_kill_9_of_the_sweep_parent_ends_its_workers(tmp_path):
    cmd = [
        sys.executable,
        "-m",
        "ablate",
        "train",
        "-m",
        "hydra/launcher=local_parallel",
        "seed=1,2,3",
        "method.args.max_steps=100000",
        "method.args.logging_steps=1",
        "method.args.save_steps=10",
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    err_file = (tmp_path / "stderr.txt").open("w")  # a file, not a pipe: nothing blocks on a full buffer
    proc = subprocess.Popen(
        cmd, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=err_file, start_new_session=True
    )
    deadline = time.time() + 600
    jobs: list[Path] = []
    while time.time() < deadline:  # 2 workers (n_jobs=2): jobs 0 and 1 train, job 2 waits in the queue
        jobs = [p.parent for p in tmp_path.glob("outputs/sweeps/multirun/*/*/metrics.jsonl")]
        if len(jobs) == 2 and all((j / "metrics.jsonl").stat().st_size for j in jobs):
            break
        time.sleep(0.5)
    assert len(jobs) == 2, "two jobs should be training"
    workers = psutil.Process(proc.pid).children(recursive=True)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    _, alive = psutil.wait_procs(workers, timeout=120)
    time.sleep(2)  # loky's resource tracker ends once its parent has gone (it warned here before)
    err_file.close()
    err = (tmp_path / "stderr.txt").read_text()  # the workers' and the tracker's too: issue 32, no noise
    assert "leaked semaphore" not in err and "ablate: interrupted" not in err, err[-3000:]
    try:
        assert not alive, [" ".join(p.cmdline()[:4]) for p in alive if p.is_running()]
    finally:
        for p in alive:
            p.kill()
    for job in jobs:
        assert summary(job)["status"] == "interrupted", job
    started = sorted(p.name for p in tmp_path.glob("outputs/sweeps/multirun/*/*") if p.is_dir())
    assert len(started) == 2 and not any(name.startswith("2_") for name in started), started
