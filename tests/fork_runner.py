"""Run many `ablate ...` command lines fast: import the CLI once, then fork one child per command.

Each child is what `python -m ablate ARGS` is after its imports: own cwd, own stdout/stderr (real
file descriptors, so whatever any library prints is captured), `ablate.cli.main(ARGS)`, exit status
from SystemExit, an uncaught exception printed as a traceback (exit 1), as the interpreter does.
Only the import time (~1 s a command on a loaded machine) is shared.

    python tests/fork_runner.py < [{"argv": [...], "cwd": "...", "env": {...}, "unprivileged": bool}, ...]  (JSON)
    -> [{"returncode": int, "stdout": str, "stderr": str, "torch": bool}, ...]  (JSON on stdout)

`unprivileged`: under root, the command runs without root's power over file permissions (so a
chmod 000 dir is unreadable to it, as to any user).
`torch`: whether the command imported torch (a refusal before it costs ~1 s; after it, several).
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


def _drop_file_capabilities() -> None:
    """Root without CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH: file permissions apply to it as to its
    owner (a chmod 000 dir cannot be read), while root's own 0700 dirs (the interpreter) still can."""
    import ctypes

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]

    libc = ctypes.CDLL(None, use_errno=True)
    header, data = Header(0x20080522, 0), (Data * 2)()  # _LINUX_CAPABILITY_VERSION_3
    if libc.capget(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capget")
    drop = ~((1 << 1) | (1 << 2)) & 0xFFFFFFFF  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
    data[0].effective &= drop
    data[0].permitted &= drop
    if libc.capset(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capset")


def _child(job: dict, out: str, err: str) -> None:
    for fd, path in ((1, out), (2, err)):
        f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(f, fd)
        os.close(f)
    if job.get("unprivileged") and os.geteuid() == 0:
        _drop_file_capabilities()
    os.chdir(job["cwd"])
    os.environ.update(job.get("env") or {})
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
    with open(f"{out}.torch", "w") as f:  # whether the command imported torch (the slow part of a start)
        f.write("1" if "torch" in sys.modules else "0")
    os._exit(code)


def _warm() -> None:
    """ABLATE_FORK_WARM=1: import what a run imports (torch, transformers, datasets, the methods) once,
    before forking, for commands that get that far (checks of the method's code, data errors): each
    then costs its own work, not a ~5 s import. Nothing runs a tensor op here: forking stays safe."""
    import datasets  # noqa: F401
    import torch  # noqa: F401
    import transformers  # noqa: F401

    import ablate.data  # noqa: F401
    import ablate.methods.dpo  # noqa: F401
    import ablate.methods.grpo  # noqa: F401
    import ablate.methods.sft  # noqa: F401
    import ablate.models  # noqa: F401


def main() -> None:
    if os.environ.get("ABLATE_FORK_WARM") == "1":
        saved = os.dup(1)
        os.dup2(2, 1)  # whatever an import prints stays off the JSON answer on stdout
        try:
            _warm()
        finally:
            sys.stdout.flush()
            os.dup2(saved, 1)
            os.close(saved)
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
                      "stderr": open(f"{tmp}/{i}.err", errors="replace").read(),
                      "torch": os.path.exists(f"{tmp}/{i}.out.torch") and open(f"{tmp}/{i}.out.torch").read() == "1"}

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
