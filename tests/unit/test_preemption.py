"""SaveOnPreemption without SLURM: a stand-in for submitit's USR2 handler is deferred to the end of the
step (checkpoint first), then called and re-raised as Preempted; outside submitit it does nothing.
The real thing on a real cluster: tests/slow/test_slurm.py."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest
from transformers import TrainerControl, TrainerState, TrainingArguments

from ablate.preemption import Preempted, SaveOnPreemption


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


def _begin(cb: SaveOnPreemption) -> tuple[TrainingArguments, TrainerState, TrainerControl]:
    args, state, control = TrainingArguments(output_dir="unused", use_cpu=True), TrainerState(), TrainerControl()
    cb.on_train_begin(args, state, control)
    return args, state, control


def test_signal_saves_at_step_end_then_requeues(usr2_handler: list[int]) -> None:
    cb = SaveOnPreemption()
    args, state, control = _begin(cb)
    os.kill(os.getpid(), signal.SIGUSR2)  # delivered now; must not exit mid-step
    assert cb.requested and usr2_handler == []
    state.global_step = 7
    cb.on_step_end(args, state, control)
    assert control.should_save  # Trainer saves checkpoint-7 right after on_step_end
    with pytest.raises(Preempted) as exc:
        cb.on_save(args, state, control)  # checkpoint written: now submitit's handler runs
    assert exc.value.code == -1 and usr2_handler == [signal.SIGUSR2]
    assert signal.getsignal(signal.SIGUSR2).__name__ == "submitit_like"  # submitit's handler is back


def test_no_signal_no_change(usr2_handler: list[int]) -> None:
    cb = SaveOnPreemption()
    args, state, control = _begin(cb)
    cb.on_step_end(args, state, control)
    cb.on_save(args, state, control)  # a periodic checkpoint: nothing happens
    assert not control.should_save and usr2_handler == []
    assert signal.getsignal(signal.SIGUSR2) == cb._defer  # deferred while training
    cb.on_train_end(args, state, control)
    assert signal.getsignal(signal.SIGUSR2).__name__ == "submitit_like"  # restored after


def test_outside_submitit_it_is_a_noop() -> None:
    old = signal.signal(signal.SIGUSR2, signal.SIG_DFL)  # no Python handler: not a submitit job
    try:
        cb = SaveOnPreemption()
        args, state, control = _begin(cb)
        assert signal.getsignal(signal.SIGUSR2) == signal.SIG_DFL
        cb.requested = True
        cb.on_step_end(args, state, control)
        assert not control.should_save
        cb.on_save(args, state, control)  # does not raise
    finally:
        signal.signal(signal.SIGUSR2, old)
