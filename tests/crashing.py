"""Test helper: a callback that kills the run at a given step, as a crash or preemption would."""

import os

from transformers import TrainerCallback


class CrashAt(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        at = int(os.environ.get("ABLATE_TEST_CRASH_AT", "0"))
        if at and state.global_step == at:
            raise RuntimeError(f"simulated crash at step {at}")
