"""Run `ablate ...` command lines fast: do the imports once, then fork one child per command.

Each child is what `python -m ablate ARGS` is once its imports are done: its own cwd (first on
sys.path, as `-m` puts it), stdin from /dev/null, stdout/stderr to files (real file descriptors, so
whatever any library prints is captured), the job's whole environment, `ablate.cli.main(ARGS)`, then
the interpreter's own exit (non-daemon threads joined, atexit handlers run, an uncaught exception
printed as a traceback with status 1, SystemExit's code or message). Why: ~11 of a short CLI command's
~17 s are imports (torch, transformers.trainer, peft, datasets; python -X importtime, 2026-12-03).
Nothing here runs a tensor op or a tokenizer before forking, so forking is safe (no thread pool yet).

Two modes:

    python tests/fork_runner.py < [{"argv": [...], "cwd": "...", "env": {...}, "unprivileged": bool}, ...]
    -> [{"returncode": int, "stdout": str, "stderr": str, "torch": bool}, ...]  (JSON on stdout)

the bad-inputs table (tests/integration/test_bad_inputs.py), each as the `ablate` console script runs
it (the cwd not on sys.path): `env` adds to this process's; the CLI's
imports only (no torch: a refusal before torch must not import it) unless ABLATE_FORK_WARM=1.
`unprivileged`: under root, the command runs without root's power over file permissions (a chmod 000
dir is unreadable to it, as to any user). `torch`: whether the command imported torch.

    python tests/fork_runner.py --serve   (a line of JSON each way)
    {"argv", "cwd", "env", "out", "err"} -> {"pid": int}, then {"returncode": int}

tests/conftest.py's server behind `ablate(...)`, one per test process, the imports of a run warmed
first: `env` is the command's whole environment (conftest sends a command here only when it differs
from the server's in variables read at run time, never at import time).
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
import ablate.config.validate  # noqa: F401
import ablate.train  # noqa: F401 - hydra, omegaconf; not torch


def _drop_file_capabilities() -> None:
    """Root without CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH: file permissions apply to it as to its
    owner (a chmod 000 dir cannot be read), while root's own 0700 dirs (the interpreter) still can."""
    import ctypes

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [
            ("effective", ctypes.c_uint32),
            ("permitted", ctypes.c_uint32),
            ("inheritable", ctypes.c_uint32),
        ]

    libc = ctypes.CDLL(None, use_errno=True)
    header, data = Header(0x20080522, 0), (Data * 2)()  # _LINUX_CAPABILITY_VERSION_3
    if libc.capget(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capget")
    drop = ~((1 << 1) | (1 << 2)) & 0xFFFFFFFF  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
    data[0].effective &= drop
    data[0].permitted &= drop
    if libc.capset(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capset")


def _exit_code(e: SystemExit) -> int:
    if e.code is None:
        return 0
    if isinstance(e.code, int):
        return e.code
    print(e.code, file=sys.stderr)  # what the interpreter does with sys.exit("message")
    return 1


def _child(job: dict, out: str, err: str, torch_file: str | None = None, as_module: bool = True) -> None:
    """Runs in the forked child; never returns. `torch_file`: where to write whether it imported torch.
    `as_module`: `python -m ablate` (the cwd first on sys.path), else the `ablate` console script (not)."""
    code = 1
    try:
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        for fd, path in ((1, out), (2, err)):
            f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(f, fd)
            os.close(f)
        if job.get("unprivileged") and os.geteuid() == 0:
            _drop_file_capabilities()
        os.chdir(job["cwd"])
        os.environ.clear()
        os.environ.update(job["env"])
        if as_module:
            sys.path[0] = os.getcwd()  # `python -m` puts the cwd first: a user's own modules import from it
            sys.argv = [ablate.cli.__file__.replace("__init__.py", "__main__.py"), *job["argv"]]
        else:
            sys.argv = ["ablate", *job["argv"]]
        import importlib

        importlib.invalidate_caches()
        try:
            ablate.cli.main(job["argv"])
            code = 0
        except SystemExit as e:
            code = _exit_code(e)
        except BaseException:  # noqa: BLE001 - what the interpreter does with an uncaught exception
            traceback.print_exc()
            code = 1
        # the interpreter's shutdown: join non-daemon threads, then atexit handlers
        import atexit
        import threading

        threading._shutdown()  # type: ignore[attr-defined]
        atexit._run_exitfuncs()
        if torch_file is not None:
            with open(torch_file, "w") as f:
                f.write("1" if "torch" in sys.modules else "0")
    except BaseException:  # noqa: BLE001
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _warm() -> None:
    """Import what a run imports (torch, transformers' Trainer, datasets, peft, the methods) once,
    before forking: each command then costs its own work, not these imports. What an import prints
    stays off stdout (the answers go there)."""
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        import datasets  # noqa: F401
        import peft  # noqa: F401
        import torch  # noqa: F401
        import transformers  # noqa: F401
        import transformers.trainer  # noqa: F401

        import ablate.cli.train  # noqa: F401
        import ablate.data  # noqa: F401
        import ablate.methods.dpo  # noqa: F401
        import ablate.methods.grpo  # noqa: F401
        import ablate.methods.sft  # noqa: F401
        import ablate.models  # noqa: F401
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def batch() -> None:
    """Every job of the JSON list on stdin, ABLATE_TEST_WORKERS (2) at a time; their results on stdout."""
    if os.environ.get("ABLATE_FORK_WARM") == "1":
        _warm()
    jobs = json.load(sys.stdin)
    parallel = int(os.environ.get("ABLATE_TEST_WORKERS", "2"))
    tmp = tempfile.mkdtemp(prefix="fork_runner_")
    results: list[dict | None] = [None] * len(jobs)
    running: dict[int, int] = {}
    pending = list(range(len(jobs)))

    def reap() -> None:
        pid, status = os.wait()
        i = running.pop(pid)
        results[i] = {
            "returncode": os.waitstatus_to_exitcode(status),
            "stdout": open(f"{tmp}/{i}.out", errors="replace").read(),
            "stderr": open(f"{tmp}/{i}.err", errors="replace").read(),
            "torch": os.path.exists(f"{tmp}/{i}.torch") and open(f"{tmp}/{i}.torch").read() == "1",
        }

    while pending or running:
        while pending and len(running) < parallel:
            i = pending.pop(0)
            job = {**jobs[i], "env": {**os.environ, **(jobs[i].get("env") or {})}}
            pid = os.fork()
            if pid == 0:
                _child(job, f"{tmp}/{i}.out", f"{tmp}/{i}.err", f"{tmp}/{i}.torch", as_module=False)
            running[pid] = i
        reap()
    json.dump(results, sys.stdout)


def serve() -> None:
    """One command at a time, as conftest sends them: its pid once forked, its exit status once ended."""
    _warm()
    for line in sys.stdin:
        job = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(job, job["out"], job["err"])
        print(json.dumps({"pid": pid}), flush=True)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}), flush=True)


if __name__ == "__main__":
    serve() if sys.argv[1:] == ["--serve"] else batch()
