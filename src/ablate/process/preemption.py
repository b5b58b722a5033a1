"""Preemption on SLURM (hydra/launcher=slurm): checkpoint at the end of the current step, requeue, resume.

How a preemption goes:
1. SLURM sends USR2 to the job: `scancel --signal=USR2 JOBID`, a preemption, or `signal_delay_s` before
   the time limit (`#SBATCH --signal=USR2@<signal_delay_s>`, conf/hydra/launcher/slurm.yaml).
2. submitit's handler for it (installed before the job's function runs) would at once call the Hydra
   launcher's `checkpoint()` (which resubmits the same job: same overrides, same run dir), requeue the
   job (`scontrol requeue`) and `sys.exit` -- mid-step, so every step since the last periodic
   checkpoint would be trained again.
3. `SaveOnPreemption` defers that handler: the signal only sets a flag; at the end of the current
   optimizer step the Trainer saves a checkpoint, and `on_save` raises `Preempted`. ablate.train then
   writes summary.json (`status: preempted`), finishes the W&B run, and only then calls
   `Preempted.requeue()`, which runs submitit's handler: once `scontrol requeue` is issued SLURM
   SIGTERMs every process of the job (W&B's service process too), so nothing may come after it.
4. SLURM starts the requeued job after a short wait; it runs the same command in the same run dir, so
   ablate.train resumes from the newest checkpoint (the one just saved: no step is lost or repeated)
   and continues the same W&B run (its id is in run.json).

Several tasks per job (hydra.launcher.tasks_per_node=2, one DDP run): srun forwards USR2 to every
task, but each rank's handler runs whenever its Python gets control (a rank blocked in a collective
runs it late). So the ranks decide together: at each step's end an all-reduce of the flags makes every
rank stop at the same step, and only that agreed decision (never a flag set after the all-reduce)
raises `Preempted` after the checkpoint. Every rank resumes from the same newest checkpoint; rank 0
records `preempted`, all ranks meet at a barrier, then rank 0 requeues (ranks > 0 just exit).

The deferral starts when the callback is built (ablate.train builds it after starting the tracker) and
lasts until the process ends: a signal before training starts is acted on at the end of the first
step; one after the last step is ignored (the run is finishing anyway). Outside a submitit job (no
Python handler for the signal) the callback does nothing. Whoever catches `Preempted` must call its
`requeue()`, or the job ends without being requeued.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from types import FrameType
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from ablate.process.interrupts import Preempted  # defined torch-free, for ablate.train

log = logging.getLogger("ablate")


def preemption_signal() -> signal.Signals:
    """The signal submitit treats as preemption/timeout (`SUBMITIT_PREEMPT_SIGNAL`, default USR2)."""
    return signal.Signals["SIG" + os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2")]


class SaveOnPreemption(TrainerCallback):
    """Turns submitit's preemption handler into "save a checkpoint at the end of this step, then
    requeue". Built by ablate.train for every run; a no-op unless a Python handler is set for the
    preemption signal (submitit sets one in SLURM jobs) and this is the main thread."""

    def __init__(self) -> None:
        self.signum = preemption_signal()
        self.requested = False  # set by the signal, on this rank, at any moment
        self.stopping = False  # what every rank agreed on at a step's end: save this step, then raise
        self._training_done = False
        self._handler: Any = None  # submitit's handler, called by Preempted.requeue()
        handler = signal.getsignal(self.signum)
        if callable(handler) and threading.current_thread() is threading.main_thread():
            self._handler = handler
            signal.signal(self.signum, self._defer)

    def _defer(self, signum: int, frame: FrameType | None) -> None:
        # runs in the main thread between two bytecodes: only set a flag, act at the step's end
        if self._training_done:
            log.warning("%s received after the last step: finishing the run", signal.Signals(signum).name)
            return
        log.warning(
            "%s received: checkpointing at the end of this step, then requeueing", signal.Signals(signum).name
        )
        self.requested = True

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self._handler is not None and self._any_rank_requested(args):
            self.stopping = True
            control.should_save = True  # Trainer saves right after on_step_end, then calls on_save

    def on_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        # `stopping`, not `requested`: a signal landing between the step's all-reduce and a periodic save
        # would stop only this rank (the others train on and hang or die in their next collective);
        # it is acted on at the next step's end instead
        if self._handler is not None and self.stopping:
            log.warning("checkpoint-%d saved; the job is requeued and resumes from it", state.global_step)
            raise Preempted(self._handler, self.signum)

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self._training_done = True

    def _any_rank_requested(self, args: TrainingArguments) -> bool:
        """Every rank must save the same step: with torch.distributed, a flag on any rank counts."""
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return self.requested
        import torch

        flag = torch.tensor([1.0 if self.requested else 0.0], device=args.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())
