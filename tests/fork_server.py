"""A per-worker server behind tests/conftest.py's `ablate(...)`: imports what a run imports (torch,
transformers, datasets, peft, ablate's CLI, methods, models, data) once, then forks one child per
command. A child is what `python -m ablate ARGS` is once its imports are done: its own cwd (first on
sys.path, as `-m` puts it), stdin from /dev/null, stdout/stderr to the caller's files, the caller's
environment, `ablate.cli.main(ARGS)`, then the interpreter's own exit (non-daemon threads joined,
atexit handlers run, an uncaught exception printed as a traceback with status 1).

Why: ~11 of a short CLI test's ~17 s are these imports (python -X importtime, 2026-12-03); the default
suite starts a few hundred such commands. Nothing here runs a tensor op or a tokenizer before forking,
so forking is safe (no thread pool exists yet). conftest.py uses a fresh interpreter instead whenever
the environment differs in a variable read at import time (only ABLATE_TEST_*, COLUMNS, ABLATE_CACHE
may differ), so a child never runs on import-time state its command would not have had.

Protocol (one line of JSON each way): {"argv", "cwd", "env", "out", "err"} -> {"pid"}, then {"returncode"}.
"""

from __future__ import annotations

import json
import os
import sys
import traceback


def _warm() -> None:
    import datasets  # noqa: F401
    import peft  # noqa: F401
    import torch  # noqa: F401
    import transformers  # noqa: F401
    import transformers.trainer  # noqa: F401

    import ablate.cli  # noqa: F401
    import ablate.cli.train  # noqa: F401
    import ablate.data  # noqa: F401
    import ablate.launchers.sweep  # noqa: F401
    import ablate.methods.dpo  # noqa: F401
    import ablate.methods.grpo  # noqa: F401
    import ablate.methods.sft  # noqa: F401
    import ablate.models  # noqa: F401
    import ablate.run.validate  # noqa: F401
    import ablate.train  # noqa: F401


def _exit_code(e: SystemExit) -> int:
    if e.code is None:
        return 0
    if isinstance(e.code, int):
        return e.code
    print(e.code, file=sys.stderr)  # what the interpreter does with sys.exit("message")
    return 1


def _child(job: dict) -> None:
    """Runs in the forked child; never returns."""
    code = 1
    try:
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        for fd, path in ((1, job["out"]), (2, job["err"])):
            f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(f, fd)
            os.close(f)
        os.chdir(job["cwd"])
        os.environ.clear()
        os.environ.update(job["env"])
        sys.path[0] = os.getcwd()  # `python -m` puts the cwd first: a user's own modules import from it
        import importlib

        importlib.invalidate_caches()
        import ablate.cli

        sys.argv = [ablate.cli.__file__.replace("__init__.py", "__main__.py"), *job["argv"]]
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
    except BaseException:  # noqa: BLE001
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def main() -> None:
    saved = os.dup(1)
    os.dup2(2, 1)  # whatever an import prints stays off the protocol on stdout
    try:
        _warm()
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
    for line in sys.stdin:
        job = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(job)
        print(json.dumps({"pid": pid}), flush=True)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}), flush=True)


if __name__ == "__main__":
    main()
