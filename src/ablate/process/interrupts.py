"""How a run ends when it is stopped from outside: Ctrl-C, SIGTERM, SLURM preemption.

- Ctrl-C (SIGINT) raises KeyboardInterrupt; SIGTERM (docker stop, `timeout`, a scheduler's kill, a
  sweep parent stopping its workers) raises `Interrupted` while `as_exceptions()` is active. Either
  way ablate.train writes summary.json with `status: interrupted` and exits 128+signal (130, 143);
  `ablate resume RUN_DIR` continues from the newest checkpoint.
- SLURM preemption (USR2, see ablate.process.preemption) raises `Preempted` once the checkpoint is saved.

No torch import here: ablate.train checks these types whatever stage the run failed in.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any, NoReturn

SWEEP_PID = "ABLATE_SWEEP_PID"  # set by the sweep parent, inherited by its worker processes


class Interrupted(BaseException):
    """A termination signal turned into an exception, so `finally`/`except` blocks write the record.
    A BaseException, like KeyboardInterrupt: `except Exception` in library code does not swallow it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class Preempted(SystemExit):
    """Raised out of `trainer.train` once the checkpoint is saved; `requeue()` must be called last."""

    def __init__(self, handler: Callable[[int, FrameType | None], Any], signum: int) -> None:
        super().__init__(-1)
        self._handler, self._signum = handler, signum

    def requeue(self) -> NoReturn:
        """submitit's handler: the Hydra launcher's checkpoint() (resubmit the same job), `scontrol
        requeue`, exit. On ranks > 0 submitit leaves requeueing to rank 0 and returns: exit anyway."""
        self._handler(self._signum, None)
        raise SystemExit(-1)


_state = {"raised": False}


def _raise_once(signum: int, frame: FrameType | None) -> None:
    # the first signal ends the run; a second one (Ctrl-C twice, a sweep parent forwarding the
    # terminal's SIGINT as SIGTERM) must not cut the writing of the record short
    if _state["raised"]:
        return
    _state["raised"] = True
    raise KeyboardInterrupt if signum == signal.SIGINT else Interrupted(signum)


@contextlib.contextmanager
def as_exceptions() -> Iterator[None]:
    """SIGTERM raises `Interrupted` inside the block, SIGINT KeyboardInterrupt, each only once. Only
    for signals nobody else handles (submitit installs its own handlers in SLURM jobs, a sweep parent
    its forwarder) and in the main thread (where signals are delivered)."""
    defaults = {signal.SIGTERM: signal.SIG_DFL, signal.SIGINT: signal.default_int_handler}
    mine = []
    if threading.current_thread() is threading.main_thread():
        mine = [s for s, d in defaults.items() if signal.getsignal(s) in (d, None)]
    _state["raised"] = False
    for s in mine:
        signal.signal(s, _raise_once)
    try:
        yield
    finally:
        for s in mine:
            signal.signal(s, defaults[s])


def forward_to_workers(grace_s: float = 120.0) -> None:
    """In a sweep's parent process: on SIGTERM or SIGINT, send SIGTERM to every worker process
    (hydra/launcher=local_parallel), wait up to `grace_s` for each to record `interrupted` and exit,
    then raise in the parent. Without this, `docker stop` or `kill` of the parent leaves its workers
    training; a terminal's Ctrl-C reaches them too (same process group), which is harmless."""

    def forward(signum: int, frame: FrameType | None) -> None:
        if _state["raised"]:
            return
        _state["raised"] = True
        import psutil

        # helpers that ignore SIGTERM (loky's resource tracker) end with the parent: not waited for
        workers = [w for w in psutil.Process().children() if not _ignores_sigterm(w.pid)]
        for w in workers:
            with contextlib.suppress(psutil.NoSuchProcess):
                w.send_signal(signal.SIGTERM)
        _, alive = psutil.wait_procs(workers, timeout=grace_s)
        for w in alive:
            with contextlib.suppress(psutil.NoSuchProcess):
                w.kill()
        raise KeyboardInterrupt if signum == signal.SIGINT else Interrupted(signum)

    if threading.current_thread() is threading.main_thread():
        for s in (signal.SIGTERM, signal.SIGINT):
            signal.signal(s, forward)


TRACKER_WARNING = (
    "ignore:resource_tracker:UserWarning"  # "resource_tracker: There appear to be N leaked semaphore ..."
)


def quiet_pool_trackers() -> None:
    """A local_parallel sweep stopped by a signal (or its parent killed -9) leaves its joblib pool's
    semaphores to multiprocessing's resource tracker, which unlinks them and warns about each, on the
    terminal, after the sweep's one line. The cleaning is right, the warning is noise: the tracker
    process (started later, with this environment) is told to keep it to itself."""
    filters = [f for f in os.environ.get("PYTHONWARNINGS", "").split(",") if f]
    if TRACKER_WARNING not in filters:
        os.environ["PYTHONWARNINGS"] = ",".join([*filters, TRACKER_WARNING])


def _ignores_sigterm(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            mask = next(line.split()[1] for line in f if line.startswith("SigIgn:"))
        return bool(int(mask, 16) & (1 << (signal.SIGTERM - 1)))
    except (OSError, StopIteration, ValueError):  # not Linux, or already gone
        return False


def watch_parent(poll_s: float = 1.0, grace_s: float = 120.0) -> None:
    """In a sweep's worker process (hydra/launcher=local_parallel): end with the sweep's parent. A
    parent killed with -9 forwards nothing (`forward_to_workers`), and its loky workers would finish
    their jobs and start the queued ones with no parent. A daemon thread polls the parent's PID: once
    this process has been handed to another parent (init, a subreaper), it sends itself SIGTERM (the
    job records `interrupted` and is resumed by `ablate sweep ... --resume`), and exits after
    `grace_s` if that did not end it. Only for a direct child of the sweep's parent: a SLURM job of
    the sweep runs elsewhere and outlives its submitter by design."""
    parent = os.environ.get(SWEEP_PID)
    if not in_sweep_worker() or _state.get("watching") or str(os.getppid()) != parent:
        return
    _state["watching"] = True

    def watch() -> None:
        import time

        while str(os.getppid()) == parent:
            time.sleep(poll_s)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(grace_s)
        os._exit(128 + signal.SIGTERM)

    threading.Thread(target=watch, name="ablate-watch-parent", daemon=True).start()


def in_sweep_worker() -> bool:
    """A process started by a sweep's parent to run jobs (set by `forward_to_workers`' caller)."""
    parent = os.environ.get(SWEEP_PID)
    return parent is not None and parent != str(os.getpid())


def leave_worker(code: int) -> NoReturn:
    """End a sweep worker for good once its job recorded `interrupted`: a worker that only raised
    would be handed the sweep's next job by its pool."""
    import logging
    import sys

    from ablate.process.console import end_bars

    end_bars()
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(code)


def exit_code(e: BaseException) -> int:
    """The shell's convention for a process ended by a signal: 128 + its number."""
    return 128 + (e.signum if isinstance(e, Interrupted) else signal.SIGINT)


def describe(e: BaseException) -> str:
    return str(e) if isinstance(e, Interrupted) else "SIGINT (Ctrl-C)"
