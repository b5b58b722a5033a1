"""Test helper: a callback that kills the run at a given step, as a crash or preemption would."""

import os

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


class KillAt(TrainerCallback):
    """The job's process dies at step ABLATE_TEST_KILL_AT (SIGKILL, as the OOM killer would: no
    Python exception, nothing recorded); with ABLATE_TEST_KILL_SEED, only the run of that seed.
    Leaves `killed.<pid>` in the run dir first, so a test can count how often the job ran."""

    def on_step_end(self, args, state, control, **kwargs):
        at = int(os.environ.get("ABLATE_TEST_KILL_AT", "0"))
        seed = os.environ.get("ABLATE_TEST_KILL_SEED")
        if at and state.global_step == at and (seed is None or seed == str(args.seed)):
            from pathlib import Path

            run_dir = Path(args.output_dir).parent  # output_dir is <run dir>/checkpoints
            (run_dir / f"killed.{os.getpid()}").touch()
            os.kill(os.getpid(), 9)
