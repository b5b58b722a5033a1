"""Preemption on SLURM (hydra/launcher=slurm): checkpoint at the end of the current step, requeue, resume.

How a preemption goes:
1. SLURM sends USR2 to the job: `scancel --signal=USR2 JOBID`, a preemption, or `signal_delay_s` before
   the time limit (`#SBATCH --signal=USR2@<signal_delay_s>`, conf/hydra/launcher/slurm.yaml).
2. submitit's handler for it (installed before the job's function runs) would at once call the Hydra
   launcher's `checkpoint()` (which resubmits the same job: same overrides, same run dir), requeue the
   job (`scontrol requeue`) and `sys.exit` -- mid-step, so every step since the last periodic
   checkpoint would be trained again.
3. `SaveOnPreemption` defers that handler while the Trainer runs: the signal only sets a flag; at the
   end of the current optimizer step the Trainer saves a checkpoint, and `on_save` then runs
   submitit's handler (requeue + exit), re-raised as `Preempted` so that ablate.train records
   `status: preempted` (not a failure) in summary.json.
4. SLURM starts the requeued job after a short wait; it runs the same command in the same run dir, so
   ablate.train resumes from the newest checkpoint (the one just saved: no step is lost or repeated)
   and continues the same W&B run (its id is in run.json).

Outside a submitit job (no Python handler for the signal) the callback does nothing. A signal before
or after `trainer.train` (model loading, final save) keeps submitit's immediate behaviour: the job is
requeued and resumes from its newest periodic checkpoint.
"""

from __future__ import annotations

import logging
import os
import signal
from types import FrameType
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

log = logging.getLogger("ablate")


class Preempted(SystemExit):
    """The job was preempted: a checkpoint is saved and the job requeued (raised out of `trainer.train`)."""


def preemption_signal() -> signal.Signals:
    """The signal submitit treats as preemption/timeout (`SUBMITIT_PREEMPT_SIGNAL`, default USR2)."""
    return signal.Signals["SIG" + os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2")]


class SaveOnPreemption(TrainerCallback):
    """Turns submitit's preemption handler into "save a checkpoint at the end of this step, then
    requeue". Installed by ablate.train on every run; a no-op unless a Python handler is set for the
    preemption signal (which submitit does in SLURM jobs)."""

    def __init__(self) -> None:
        self.signum = preemption_signal()
        self.requested = False
        self._handler: Any = None  # submitit's handler, restored when training ends

    def _defer(self, signum: int, frame: FrameType | None) -> None:
        # runs in the main thread between two bytecodes: only set the flag, act at the step's end
        log.warning("%s received: checkpointing at the end of this step, then requeueing", signal.Signals(signum).name)
        self.requested = True

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        handler = signal.getsignal(self.signum)
        if callable(handler):
            self._handler = handler
            signal.signal(self.signum, self._defer)

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        if self._handler is not None and self._any_rank_requested(args):
            control.should_save = True  # Trainer saves right after on_step_end, then calls on_save

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        if self._handler is None or not self.requested:
            return
        handler, self._handler = self._handler, None
        signal.signal(self.signum, handler)
        log.warning("checkpoint-%d saved; requeueing the job (it resumes from this checkpoint)", state.global_step)
        try:
            handler(self.signum, None)  # submitit: launcher checkpoint(), `scontrol requeue`, sys.exit
        except SystemExit as e:
            raise Preempted(e.code) from None
        raise Preempted(-1)  # non-zero ranks: submitit leaves requeueing to rank 0; stop here too

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        if self._handler is not None:  # training finished before a checkpoint could be taken: keep the result
            signal.signal(self.signum, self._handler)
            self._handler = None
            if self.requested:
                log.warning("preemption signal arrived after the last step; finishing the run instead of requeueing")

    def _any_rank_requested(self, args: TrainingArguments) -> bool:
        """Every rank must save the same step: with torch.distributed, a flag on any rank counts."""
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return self.requested
        import torch

        flag = torch.tensor([1.0 if self.requested else 0.0], device=args.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        self.requested = bool(flag.item())
        return self.requested
