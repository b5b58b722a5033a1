"""Asynchronous GRPO: generation rounds sampled ahead by a worker process with its own copy of the
weights, while the trainer trains on the current round (`method.args.max_staleness`, TRL's name).

With max_staleness s > 0, at the start of round j the trainer takes round j (sampled earlier) and
hands the worker its current weights (policy version v_j = optimizer steps taken) for round j + s:

    round        0      1      2      3      4   ...      (s = 1, spg = 1: a round is a step)
    trains on    v0     v0     v1     v2     v3           (round k sampled by v_{k-1}; rounds 0..s by v0)
    worker       r1     r2     r3     r4     r5           (r_{j+1} sampled while round j trains)

So generation runs concurrently with training, at most s rounds behind the policy (TRL's
AsyncGRPOTrainer bounds the lag by dropping late samples; here the lag is exactly the schedule's,
ablate.rollouts.schedule.Schedule.policy_version, so runs are reproducible; s = 1 is verl's
one-step-off pipeline). Each round records the `policy_version` that sampled it, and the worker
takes each token's log-prob under the weights that sampled it from the logits it was drawn from
(GRPOTrainer._sample_ahead): those log-probs are pi_old in the importance ratio, so clipping sees the
real off-policy gap.

Determinism: the worker is a forked process (its RNG, threads and weights its own); it seeds torch's
RNG from (seed, round index) before each round (`round_seed`), so what it samples depends only on
the weights it was given, the prompts and the round index, never on timing. An async run's per-step
losses therefore equal those of a synchronous run that samples each round from the recorded older
weights with that seed (tests/unit/test_grpo_async.py). Weights travel through shared memory: s + 1
slots of the trainable parameters (frozen ones never change), each written once per round by the
trainer and computed with in place by the worker (no copy on its side). The extra slot lets the
trainer queue round k + s (with its current weights) before it awaits round k, so the worker goes
from one round to the next without waiting for the hand-over: on two cores the worker's rounds are
an async step's critical path.

Precision (`method.args.generation_dtype`): by default the worker computes in the trainer's dtype, so
at zero lag its pi_old is the trainer's log-prob up to the KV cache's summation order. With bfloat16 its
weights are the trainer's rounded to bf16 (the slots hold bf16: the trainer's write rounds them) and
it decodes in bf16, reading half the bytes per token: decoding on a CPU is bound by reading the weights.
pi_old is then the bf16 sampler's own log-prob of each token (the logits it was drawn from, in fp32 from
there on), so the importance ratio pi_theta / pi_old is taken against the distribution that really drew
the tokens, and clipping bounds the precision gap with the staleness, as for a bf16 rollout engine.

Resume: the in-flight rounds are saved, not regenerated (regenerating needs the older weights that
sampled them). A checkpoint waits for the rounds the worker has in hand and saves them with the
checkpoint (`async_rounds.pt`: completions, behaviour log-probs, versions); the round being served
mid-way is saved by the rollout buffer as in a synchronous run. A resumed run serves those rounds and
hands the worker the same weights at the same round starts, so it reproduces the uninterrupted run.

Threads: the trainer and the worker split the torch threads (at least one each), fixed, so the run is
reproducible. With `method.args.async_threads=balanced` the trainer also takes the worker's threads
while the worker is idle (its round done before the trainer's step): ablate.rollouts.cores.

Prompts: a round's prompts are needed s rounds before the Trainer's dataloader yields them, so they are
read ahead from the sampler (`prompts_of`); when the dataloader yields the round, its prompts are
checked against them. CPU and one process only (fork; a CUDA context does not survive a fork).
"""

from __future__ import annotations

import hashlib
import logging
import multiprocessing
import os
import signal
import sys
import time
import traceback
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ablate.errors import ConfigError, UserCodeError
from ablate.rollouts.cores import CoreShare

AHEAD_ROUNDS = (
    "async_rounds.pt"  # in each checkpoint of an async run: the rounds sampled but not yet trained on
)

# The behaviour policy's part of a round: (model, prompt ids) -> (completion ids, their log-probs under
# that model (rows, completion width), generation seconds, and what tool calls add: tool mask, messages and
# counts, {} without tools). GRPOTrainer._sample_ahead.
BehaviourFn = Callable[
    [nn.Module, list[list[int]]], tuple[list[list[int]], torch.Tensor, float, dict[str, Any]]
]


def round_seed(seed: int, round_index: int) -> int:
    """The RNG seed round `round_index` is sampled with: a hash of (run seed, round), so rounds are
    independent streams whatever order or process they are sampled in."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{round_index}".encode()).digest()[:8], "little") >> 1


@dataclass
class Sampled:
    """One round as the behaviour policy produced it."""

    round: int  # the round's index (0-based, counted over the whole run)
    policy_version: int  # optimizer steps the sampling weights had taken
    prompt_ids: list[list[int]]  # the prompts it was sampled for (checked against the dataloader's)
    completion_ids: list[list[int]] | None = None  # None until the worker returns it
    old_logps: torch.Tensor | None = None  # (rows, width): log-probs under the sampling weights (pi_old)
    seconds: float = 0.0  # the worker's generation seconds
    turns: dict[str, Any] | None = (
        None  # with tool calls: tool_mask, messages, tool_calls, tool_failures (per row)
    )

    def state_dict(self) -> dict[str, Any]:
        return dict(vars(self))

    @classmethod
    def from_state_dict(cls, saved: dict[str, Any]) -> Sampled:
        return cls(**saved)


class Worker:
    """A forked process that samples rounds with `behaviour`, from its own copy of `model` whose
    trainable parameters are, for each round, one of `slots` shared-memory copies the trainer writes;
    in `dtype` when given (the trainer's copy converts on writing, the worker casts its frozen ones)."""

    def __init__(
        self,
        behaviour: BehaviourFn,
        model: nn.Module,
        slots: int,
        threads: int,
        dtype: torch.dtype | None = None,
        cores: CoreShare | None = None,
        timeout_s: float = 900.0,
    ) -> None:
        # method.args.worker_timeout_s: the longest wait for a round before the worker counts as stalled
        self.timeout_s = timeout_s
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.slots = [
            [p.detach().to(dtype or p.dtype).clone().share_memory_() for p in self.params]
            for _ in range(slots)
        ]
        ctx = multiprocessing.get_context("fork")
        self.conn, child = ctx.Pipe()
        sys.stdout.flush()  # a forked child must not flush the parent's buffered output a second time
        sys.stderr.flush()
        self.process = ctx.Process(
            target=_serve,
            args=(child, behaviour, model, self.params, self.slots, threads, os.getpid(), dtype, cores),
            daemon=True,
            name="ablate-generation",
        )
        self.process.start()
        child.close()  # the parent's copy: the pipe reads EOF once the worker has gone

    def write(self, slot: int, params: list[torch.Tensor]) -> None:
        """Copy the trainer's current trainable parameters into `slot` (no round may be using it), rounded to
        the slot's dtype (round-to-nearest-even, as `Tensor.to`)."""
        with torch.no_grad():
            for dst, src in zip(self.slots[slot], params):
                dst.copy_(src.detach())

    def submit(self, job: Sampled, slot: int, seed: int) -> None:
        try:
            self.conn.send((job.round, slot, seed, job.prompt_ids))
        except (BrokenPipeError, ConnectionResetError, OSError) as e:  # it died since the last round
            raise self.lost() from e

    def receive(self) -> tuple[int, list[list[int]], torch.Tensor, float, dict[str, Any]]:
        """The next finished round: (round, completion ids, behaviour log-probs, seconds, tool calls'
        additions). A worker that died, or sent nothing for `timeout_s` (stopped, hung), is one line
        (UserCodeError)."""
        waited, t0 = 0.0, time.monotonic()
        while not self.conn.poll(min(1.0, max(self.timeout_s - waited, 0.0))):
            waited = time.monotonic() - t0
            if not self.process.is_alive():
                raise self.lost()
            if waited >= self.timeout_s:
                raise self.lost(stalled=waited)
        try:
            kind, *payload = self.conn.recv()
        except (EOFError, ConnectionResetError, OSError) as e:
            raise self.lost() from e
        if kind == "error":
            raise RuntimeError(
                f"the generation worker failed: {payload[0].strip().splitlines()[-1]}\n{payload[0]}"
            )
        k, completion_ids, old_logps, seconds, turns = payload
        return k, completion_ids, torch.from_numpy(old_logps), seconds, turns

    def lost(self, stalled: float | None = None) -> UserCodeError:
        """The error for a worker that died (its signal or exit code) or stalled (killed here): one line,
        and how to go on (the newest checkpoint holds every round the run needs)."""
        pid = self.process.pid
        if stalled is not None:
            state = _state(pid)
            self.process.kill()
            what = (
                f"sent no round for {stalled:.0f} s ({state}; "
                f"method.args.worker_timeout_s={self.timeout_s:g}): "
                "killed it"
            )
        else:
            self.process.join(timeout=5)  # reaped: its exit code
            code = self.process.exitcode
            what = f"died: {_ended(code)}"
        return UserCodeError(
            f"generation worker (PID {pid}) {what}; the run stops here and keeps its newest "
            "checkpoint: resume with the same command (or ablate resume RUN_DIR)"
        )

    def close(self, busy: bool = False) -> None:
        """Stop the process: asked to exit when idle, killed when `busy` (its round is not wanted)."""
        if busy:
            self.process.kill()
        try:
            self.conn.send(None)
        except (BrokenPipeError, OSError):
            pass
        self.process.join(timeout=10)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        self.conn.close()


def _ended(code: int | None) -> str:
    """How a process ended, from multiprocessing's exit code (-N: signal N)."""
    if code is None:
        return "its pipe closed"
    if code < 0:
        name = signal.Signals(-code).name
        why = " (kill -9, or the out-of-memory killer)" if -code == signal.SIGKILL else ""
        return f"killed by {name}{why}"
    return f"exit code {code}"


def _state(pid: int) -> str:
    """What the OS says of a process that sends nothing: stopped (SIGSTOP, Ctrl-Z), sleeping, running."""
    try:
        import psutil

        status = psutil.Process(pid).status()
    except Exception:  # psutil missing, or the process just ended
        return "state unknown"
    return {"stopped": "stopped: SIGSTOP or Ctrl-Z", "tracing-stop": "stopped by a debugger"}.get(
        status, status
    )


def _serve(
    conn: Any,
    behaviour: BehaviourFn,
    model: nn.Module,
    params: list[torch.Tensor],
    slots: list[list[torch.Tensor]],
    threads: int,
    trainer_pid: int,
    dtype: torch.dtype | None,
    cores: CoreShare | None,
) -> None:
    """The worker's loop: point the model at the round's weights, seed, sample, send back."""
    if sys.platform.startswith("linux"):  # die with the trainer, even on kill -9
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != trainer_pid:  # the trainer died before prctl took effect: no signal will come
        os._exit(0)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the trainer's to handle; it closes the worker
    # not the run's interrupt handlers (ablate.process.interrupts)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    torch.set_num_threads(threads)
    # the frozen parameters (LoRA's base) once; buffers (rotary frequencies) stay as they are
    if dtype is not None:
        with torch.no_grad():
            for p in model.parameters():
                if not p.requires_grad:  # the trainable ones are the slots' (already in dtype)
                    p.data = p.data.to(dtype)
    try:
        while (job := conn.recv()) is not None:
            k, slot, seed, prompt_ids = job
            if cores is not None:  # async_threads=balanced: the trainer's share while this round is sampled
                cores.worker_busy(True)
            for p, weights in zip(params, slots[slot]):  # the model computes with the slot itself: no copy
                p.data = weights  # (the trainer writes a slot only while no round in flight uses it)
            torch.manual_seed(seed)
            completion_ids, old_logps, seconds, turns = behaviour(model, prompt_ids)
            if cores is not None and not conn.poll():  # idle until the trainer's next round (none queued)
                cores.worker_busy(False)
            conn.send(("done", k, completion_ids, old_logps.cpu().numpy(), seconds, turns))
    except EOFError:  # the trainer has gone
        pass
    except BaseException:  # reported to the trainer, which raises it
        conn.send(("error", traceback.format_exc()))


class RoundsAhead:
    """What both ways of sampling ahead share (this module's forked worker, ablate.rollouts.engine_ahead's
    engine): the rounds sampled but not yet taken, where a process's first take starts, the check of a
    round's prompts when taken, and the checkpoint file of the rounds sampled ahead."""

    s: int  # method.args.max_staleness
    last_round: int | None  # rounds at or past it are never sampled (set by the trainer from max_steps)
    done: dict[int, Sampled]  # sampled (or loaded from a checkpoint), not yet taken
    next_round: int | None  # the next round to submit (None until this process's first take)

    def _first_take(self, k: int) -> None:
        if self.next_round is None:  # first take of this process: after a resume, past the loaded rounds
            self.next_round = max(self.done) + 1 if self.done else k

    def _taken(self, k: int, prompt_ids: list[list[int]]) -> Sampled:
        sampled = self.done.pop(k)
        if sampled.prompt_ids != prompt_ids:
            raise RuntimeError(
                f"async GRPO: round {k}'s prompts differ from those read ahead from the sampler "
                "(the dataloader's order is not RepeatSampler's); use method.args.max_staleness=0"
            )
        return sampled

    def _end(self) -> int:
        return self.last_round if self.last_round is not None else 1 << 62

    def _save_done(self, folder: str) -> None:
        """Save every round sampled but not yet taken (the caller waits for those in flight first)."""
        torch.save(
            {"max_staleness": self.s, "rounds": [r.state_dict() for r in self.done.values()]},
            os.path.join(folder, AHEAD_ROUNDS),
        )

    def load(self, folder: str) -> None:
        path = os.path.join(folder, AHEAD_ROUNDS)
        if os.path.isfile(path):
            saved = torch.load(path, weights_only=True)
            self.done = {r["round"]: Sampled.from_state_dict(r) for r in saved["rounds"]}


class AheadRounds(RoundsAhead):
    """The trainer's side: which round to sample when, with which weights, and the rounds in flight.

    `take(k, ...)` at the start of round k returns it (sampled earlier, or now at a fresh start) and
    then hands the worker the current weights for round k + s. Rounds at or past
    `last_round` (set by the trainer from max_steps) are never sampled."""

    def __init__(
        self,
        behaviour: BehaviourFn,
        model: nn.Module,
        staleness: int,
        seed: int,
        prompts_of: Callable[[int], list[list[int]]],
        dtype: torch.dtype | None = None,
        balanced: bool = False,
        timeout_s: float = 900.0,
    ) -> None:
        self.timeout_s = timeout_s  # method.args.worker_timeout_s
        # async_threads=balanced: the trainer takes the worker's threads while it idles
        self.balanced = balanced
        self.behaviour, self.model, self.s, self.seed = behaviour, model, staleness, seed
        self.prompts_of = prompts_of
        self.dtype = dtype  # the worker's weights and compute (None: the trainer's)
        self.last_round: int | None = None
        self.worker: Worker | None = None
        self.cores: CoreShare | None = None  # async_threads=balanced: the threads follow who is busy
        self.done: dict[int, Sampled] = {}
        self.pending: deque[tuple[Sampled, int]] = deque()  # submitted, not yet returned: (job, slot)
        self.slot_versions: list[int | None] = [None] * (staleness + 1)  # the version each slot holds
        self.next_round: int | None = None

    def take(self, k: int, prompt_ids: list[list[int]], version: int) -> Sampled:
        """Round k, sampled by the weights of round k - s's start; `version`: the trainer's optimizer
        steps now (the weights it hands the worker for round k + s)."""
        if self.worker is None:
            self._start()
        self._first_take(k)
        # a fresh start: rounds k..k+s-1 by these weights
        while self.next_round < min(k + self.s, self._end()):
            self._submit(self.next_round, version)
        if k not in self.done and not any(job.round == k for job, _ in self.pending):
            self._submit(k, version)  # not sampled ahead (a resume without its rounds): sampled now
        # round k's weights -> round k + s, queued before round k is awaited: the worker goes on to it the
        # moment it has finished round k, so the weights' copy and the hand-over are not on its critical path
        if self.next_round == k + self.s and self.next_round < self._end():
            self._submit(self.next_round, version)
        while k not in self.done:
            self._receive()
        return self._taken(k, prompt_ids)

    def _submit(self, k: int, version: int) -> None:
        """Hand the worker round k with the weights of `version` (the trainer's current ones)."""
        if version in self.slot_versions:
            slot = self.slot_versions.index(version)
        else:
            while (
                slot := self._free_slot()
            ) is None:  # never in steady state: s rounds in flight, s + 1 slots
                self._receive()
            self.worker.write(slot, self.worker.params)
            self.slot_versions[slot] = version
        job = Sampled(round=k, policy_version=version, prompt_ids=self.prompts_of(k))
        # busy from now: the trainer gives its extra threads back at its next layer
        if self.cores is not None:
            self.cores.worker_busy(True)
        self.worker.submit(job, slot, round_seed(self.seed, k))
        self.pending.append((job, slot))
        self.next_round = max(self.next_round, k + 1)

    def _free_slot(self) -> int | None:
        busy = {slot for _, slot in self.pending}
        return next((i for i in range(len(self.slot_versions)) if i not in busy), None)

    def _receive(self) -> None:
        job, _ = self.pending.popleft()
        k, job.completion_ids, job.old_logps, job.seconds, job.turns = self.worker.receive()
        job.turns = job.turns or None
        assert k == job.round, f"the worker returned round {k} for round {job.round}"
        self.done[k] = job

    def _start(self) -> None:
        """Fork the worker; the torch threads are split between it and the trainer (at least 1 each)."""
        threads = self.threads = torch.get_num_threads()
        mine = max(threads - threads // 2, 1)
        self.cores = CoreShare(threads, mine) if self.balanced and threads > 1 else None
        self.worker = Worker(
            self.behaviour,
            self.model,
            slots=len(self.slot_versions),
            threads=max(threads // 2, 1),
            dtype=self.dtype,
            cores=self.cores,
            timeout_s=self.timeout_s,
        )
        torch.set_num_threads(mine)
        if self.cores is not None:
            self.cores.attach(self.model)  # after the fork: the worker's copy of the model has no hooks
        dtype = str(self.dtype or "the trainer's dtype").removeprefix("torch.")
        logging.getLogger("ablate").info(
            "async GRPO: rounds sampled %d ahead by a generation worker (pid %d, %d thread(s), %s); "
            "training on %d thread(s)%s",
            self.s,
            self.worker.process.pid,
            max(threads // 2, 1),
            dtype,
            mine,
            f", {threads} while the worker is idle" if self.cores is not None else "",
        )

    def save(self, folder: str) -> None:
        """Wait for the rounds in flight and save every round sampled but not yet taken."""
        while self.pending:
            self._receive()
        self._save_done(folder)

    def close(self) -> None:
        """Stop the worker and forget the rounds in flight (a later `train()` starts afresh)."""
        if self.worker is not None:
            t0 = time.perf_counter()
            self.worker.close(busy=bool(self.pending))
            if self.cores is not None:
                logging.getLogger("ablate").info(
                    "async GRPO: the trainer changed its thread count %d time(s) (async_threads=balanced)",
                    self.cores.switches,
                )
                self.cores.detach()
                self.cores = None
            torch.set_num_threads(self.threads)  # the trainer's share back to the whole
            logging.getLogger("ablate").debug("generation worker closed in %.2f s", time.perf_counter() - t0)
        self.worker, self.next_round = None, None
        self.done, self.pending = {}, deque()
        self.slot_versions = [None] * (self.s + 1)


def check_async(staleness: int, args: Any, generator: Any) -> None:
    """Asynchronous GRPO's worker is a forked CPU process of a single-process run that samples with the
    trainer's own generator on its copy of the weights: what this run's device, processes and engine
    cannot do is one line (the value itself is checked by its schema, ablate.schema.grpo)."""
    s = f"method.args.max_staleness={staleness}"
    if args.device.type != "cpu":
        raise ConfigError(
            f"{s}: asynchronous generation runs in a forked CPU process, and this run is on "
            f"{args.device.type} (method.args.use_cpu=true)"
        )
    if args.world_size > 1:
        raise ConfigError(f"{s}: asynchronous generation is single-process (this run has {args.world_size})")
    if "fork" not in multiprocessing.get_all_start_methods():
        raise ConfigError(f"{s}: asynchronous generation forks its worker, which this platform cannot")
    # an engine of its own (vLLM): its weights are pushed by the trainer, not forked
    if hasattr(generator, "close"):
        raise ConfigError(
            f"{s}: asynchronous generation samples in a forked copy of the policy, which a generator "
            f"with an engine of its own ({type(generator).__name__}) cannot; use method.args.max_staleness=0 "
            "or no method/rollouts"
        )
