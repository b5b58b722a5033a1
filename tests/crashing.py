"""Test helpers: callbacks that kill the run at a given step, as a crash or preemption would, or hold
it at the start of a run."""

import os
import time
from pathlib import Path

from hydra.experimental.callback import Callback
from transformers import TrainerCallback


class CrashAt(TrainerCallback):
    """Crash at step ABLATE_TEST_CRASH_AT; with ABLATE_TEST_CRASH_SEED, only the run of that seed
    (one poisoned job of a sweep)."""

    def on_step_end(self, args, state, control, **kwargs):
        at = int(os.environ.get("ABLATE_TEST_CRASH_AT", "0"))
        seed = os.environ.get("ABLATE_TEST_CRASH_SEED")
        if at and state.global_step == at and (seed is None or seed == str(args.seed)):
            raise RuntimeError(f"simulated crash at step {at}")


class CrashAtEnd(TrainerCallback):
    """Dies after the last step's checkpoint, before the final model and summary.json are written."""

    def on_train_end(self, args, state, control, **kwargs):
        if os.environ.get("ABLATE_TEST_CRASH_AT_END"):
            raise RuntimeError("simulated crash after the final checkpoint")


class PauseAtRunStart(Callback):
    """A Hydra callback (after ablate's Validate, which checks the run dir): signals that it got
    here by creating ABLATE_TEST_PAUSED, then waits until ABLATE_TEST_GO exists, so a test can start
    a second process in the same run dir at exactly this moment."""

    def on_run_start(self, config, **kwargs):
        paused, go = Path(os.environ["ABLATE_TEST_PAUSED"]), Path(os.environ["ABLATE_TEST_GO"])
        paused.touch()
        deadline = time.time() + 600
        while not go.exists() and time.time() < deadline:
            time.sleep(0.1)


class KillAt(TrainerCallback):
    """The job's process dies at step ABLATE_TEST_KILL_AT (SIGKILL, as the OOM killer would: no
    Python exception, nothing recorded); with ABLATE_TEST_KILL_SEED, only the run of that seed; with
    ABLATE_TEST_KILL_JOB=N, only a sweep's job N (its run dir `N_*`).
    Leaves `killed.<pid>` in the run dir first, so a test can count how often the job ran."""

    def on_step_end(self, args, state, control, **kwargs):
        at = int(os.environ.get("ABLATE_TEST_KILL_AT", "0"))
        seed = os.environ.get("ABLATE_TEST_KILL_SEED")
        job = os.environ.get("ABLATE_TEST_KILL_JOB")
        run_dir = Path(args.output_dir).parent  # output_dir is <run dir>/checkpoints
        if (
            at
            and state.global_step == at
            and (seed is None or seed == str(args.seed))
            and (job is None or run_dir.name.startswith(f"{job}_"))
        ):
            (run_dir / f"killed.{os.getpid()}").touch()
            os.kill(os.getpid(), 9)


class StallAt(TrainerCallback):
    """Global rank ABLATE_TEST_STALL_RANK (default 1) stops at step ABLATE_TEST_STALL_AT: writes
    `stalled.<pid>` in the run dir, then sleeps, so the other ranks wait for it in their next
    collective (a test then kills its node, or lets the distributed timeout fire)."""

    def on_step_end(self, args, state, control, **kwargs):
        at = int(os.environ.get("ABLATE_TEST_STALL_AT", "0"))
        if (
            at
            and state.global_step == at
            and os.environ.get("RANK") == os.environ.get("ABLATE_TEST_STALL_RANK", "1")
        ):
            run_dir = Path(args.output_dir).parent  # output_dir is <run dir>/checkpoints
            (run_dir / f"stalled.{os.getpid()}").touch()
            time.sleep(600)


class InterruptAt(TrainerCallback):
    """Ctrl-C at step ABLATE_TEST_INTERRUPT_AT: SIGINT to this process, as a terminal sends it."""

    def on_step_end(self, args, state, control, **kwargs):
        at = int(os.environ.get("ABLATE_TEST_INTERRUPT_AT", "0"))
        if at and state.global_step == at:
            import signal

            os.kill(os.getpid(), signal.SIGINT)
