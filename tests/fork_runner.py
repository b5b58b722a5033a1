"""Run many `ablate ...` command lines fast: import the CLI once, then fork one child per command.

Each child is what `python -m ablate ARGS` is after its imports: own cwd, own stdout/stderr (real
file descriptors, so whatever any library prints is captured), `ablate.cli.main(ARGS)`, exit status
from SystemExit, an uncaught exception printed as a traceback (exit 1), as the interpreter does.
Only the import time (~1 s a command on a loaded machine) is shared.

    python tests/fork_runner.py < [{"argv": [...], "cwd": "...", "env": {...}}, ...]  (JSON)
    -> [{"returncode": int, "stdout": str, "stderr": str}, ...]  (JSON on stdout)
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import traceback

import hydra  # noqa: F401 - warm imports shared by every child
import omegaconf  # noqa: F401
import yaml  # noqa: F401

import ablate.cli
import ablate.launchers.sweep  # noqa: F401
import ablate.run.validate  # noqa: F401
import ablate.train  # noqa: F401 - hydra, omegaconf; not torch


def _child(job: dict, out: str, err: str) -> None:
    os.chdir(job["cwd"])
    os.environ.update(job.get("env") or {})
    for fd, path in ((1, out), (2, err)):
        f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(f, fd)
        os.close(f)
    sys.argv = ["ablate", *job["argv"]]
    code = 0
    try:
        ablate.cli.main(job["argv"])
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, int) and e.code is not None:
            print(e.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - what the interpreter does with an uncaught exception
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main() -> None:
    jobs = json.load(sys.stdin)
    parallel = int(os.environ.get("ABLATE_TEST_WORKERS", "2"))
    tmp = tempfile.mkdtemp(prefix="fork_runner_")
    results: list[dict | None] = [None] * len(jobs)
    running: dict[int, int] = {}
    pending = list(range(len(jobs)))

    def reap() -> None:
        pid, status = os.wait()
        i = running.pop(pid)
        results[i] = {"returncode": os.waitstatus_to_exitcode(status),
                      "stdout": open(f"{tmp}/{i}.out", errors="replace").read(),
                      "stderr": open(f"{tmp}/{i}.err", errors="replace").read()}

    while pending or running:
        while pending and len(running) < parallel:
            i = pending.pop(0)
            pid = os.fork()
            if pid == 0:
                _child(jobs[i], f"{tmp}/{i}.out", f"{tmp}/{i}.err")
            running[pid] = i
        reap()
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()
