"""SaveOnPreemption without SLURM: a stand-in for submitit's USR2 handler is deferred to the end of the
step (checkpoint first), then called and re-raised as Preempted; outside submitit it does nothing.
The real thing on a real cluster: tests/slow/test_slurm.py."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest
from transformers import TrainerControl, TrainerState, TrainingArguments

from ablate.process.preemption import Preempted, SaveOnPreemption


@pytest.fixture
def usr2_handler() -> Iterator[list[int]]:
    """Install a submitit-like handler (requeue, then sys.exit(-1)); yields the signals it saw."""
    seen: list[int] = []

    def submitit_like(signum: int, frame: object) -> None:
        seen.append(signum)
        raise SystemExit(-1)

    old = signal.signal(signal.SIGUSR2, submitit_like)
    yield seen
    signal.signal(signal.SIGUSR2, old)


def _state() -> tuple[TrainingArguments, TrainerState, TrainerControl]:
    return TrainingArguments(output_dir="unused", use_cpu=True), TrainerState(), TrainerControl()


def test_signal_saves_at_step_end_then_requeues(usr2_handler: list[int]) -> None:
    cb = SaveOnPreemption()  # from here on the signal is deferred
    args, state, control = _state()
    os.kill(os.getpid(), signal.SIGUSR2)  # delivered now; must not exit mid-step
    assert cb.requested and usr2_handler == []
    state.global_step = 7
    cb.on_step_end(args, state, control)
    assert control.should_save  # Trainer saves checkpoint-7 right after on_step_end
    with pytest.raises(Preempted) as exc:
        cb.on_save(args, state, control)  # checkpoint written: out of trainer.train
    assert usr2_handler == []  # ablate.train records the summary and finishes W&B first ...
    with pytest.raises(SystemExit) as exit_:
        exc.value.requeue()  # ... then submitit's handler requeues and exits
    assert exit_.value.code == -1 and usr2_handler == [signal.SIGUSR2]


def test_no_signal_no_change(usr2_handler: list[int]) -> None:
    cb = SaveOnPreemption()
    args, state, control = _state()
    assert signal.getsignal(signal.SIGUSR2) == cb._defer
    cb.on_step_end(args, state, control)
    cb.on_save(args, state, control)  # a periodic checkpoint: nothing happens
    assert not control.should_save and usr2_handler == []
    cb.on_train_end(args, state, control)
    os.kill(os.getpid(), signal.SIGUSR2)  # after the last step: ignored, the run finishes
    cb.on_save(args, state, control)
    assert not cb.requested and usr2_handler == []


def test_signal_after_the_step_end_waits_for_the_next_step(usr2_handler: list[int]) -> None:
    """A signal landing between on_step_end (where the ranks agree, by all-reduce under DDP) and a
    periodic checkpoint's on_save must not stop this rank alone: the others would train on and die in
    their next collective (seen on SLURM with tasks_per_node=2). It is acted on at the next step's end."""
    cb = SaveOnPreemption()
    args, state, control = _state()
    state.global_step = 10
    cb.on_step_end(args, state, control)  # no signal yet: every rank agrees to go on
    control.should_save = True  # save_steps=10: a periodic checkpoint
    os.kill(os.getpid(), signal.SIGUSR2)  # arrives while checkpoint-10 is written
    cb.on_save(args, state, control)  # does not raise: the other ranks have not agreed to stop
    control.should_save = False
    state.global_step = 11
    cb.on_step_end(args, state, control)
    assert control.should_save
    with pytest.raises(Preempted):
        cb.on_save(args, state, control)


def test_outside_submitit_it_is_a_noop() -> None:
    old = signal.signal(signal.SIGUSR2, signal.SIG_DFL)  # no Python handler: not a submitit job
    try:
        cb = SaveOnPreemption()
        args, state, control = _state()
        assert signal.getsignal(signal.SIGUSR2) == signal.SIG_DFL
        cb.requested = True
        cb.on_step_end(args, state, control)
        assert not control.should_save
        cb.on_save(args, state, control)  # does not raise
    finally:
        signal.signal(signal.SIGUSR2, old)
