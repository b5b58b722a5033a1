"""Asynchronous GRPO through a generation engine (`method.args.max_staleness=s` with `method/rollouts=vllm`
or `vllm_server`): the engine is the worker. No process is forked and no copy of the weights is made: a
thread of the trainer hands the engine one round at a time (a colocated engine samples in that thread; a
server, in its own process), while the trainer trains on the round before; so it runs on any device and
under torchrun.

The schedule is the forked worker's (ablate.rollouts.ahead): round k is sampled by the weights the policy
had when round k - s began (rounds 0..s by the initial ones), so a run is reproducible whatever the timing.
Weights move only while the engine is idle: at the start of round k the trainer waits for every round in
flight (round k among them), pushes its current weights (on the main thread: FSDP2's gathers and a server's
transfer are collectives of the trainer's ranks; ablate.rollouts.engine), and hands the engine round k + s.
With s = 1 (verl's one-step-off pipeline) that wait is for round k alone, which the trainer needs anyway; a
larger s samples from older weights at the same overlap. Each row is seeded from (run seed, round) and its
index over all ranks, never from torch's global RNG, which the trainer's thread keeps using (but a
colocated engine's CPU sampler draws from it too, from its thread: with dropout in the trainer, a colocated
async run is not bit-reproducible; a server's is).

pi_old of a round is the engine's own log-prob of each token it sampled (after its temperature / top-k /
top-p, as TRL's importance-sampling correction reads them): the weights that sampled the round are gone by
the time it trains, as in the forked worker's bf16 mode. A checkpoint waits for the rounds in flight and
saves them with the rounds sampled ahead (`async_rounds.pt`), so a resume serves them instead of sampling
again."""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as Timeout
from typing import Any

import torch
from torch import nn

from ablate.errors import ConfigError, PeerLostError
from ablate.rollouts.ahead import RoundsAhead, Sampled, round_seed
from ablate.rollouts.engine import world_size
from ablate.rollouts.generation import right_pad

log = logging.getLogger("ablate")


class EngineRounds(RoundsAhead):
    """The trainer's side of an engine sampling ahead: `take(k, ...)` at the start of round k returns it
    and hands the engine round k + s (module docstring); rounds at or past `last_round` are never sampled."""

    def __init__(
        self, generator: Any, model: nn.Module, args: Any, prompts_of: Any, stops: list[int]
    ) -> None:
        s = args.max_staleness
        if args.generation_dtype is not None or args.async_threads != "split":
            raise ConfigError(
                "method.args.generation_dtype / async_threads set the forked worker's dtype and threads; "
                f"{type(generator).__name__} samples in its own engine (method.rollouts.dtype)"
            )
        if getattr(generator, "toolbox", None) is not None:
            raise ConfigError(
                f"method.args.max_staleness={s} with tools: rounds sampled ahead through an engine do not "
                "run tool calls; use max_staleness=0"
            )
        self.generator, self.model, self.s, self.seed = generator, model, s, args.seed
        self.prompts_of, self.stops, self.timeout_s = prompts_of, stops, args.worker_timeout_s
        self.last_round: int | None = None
        self.done: dict[int, Sampled] = {}
        self.pending: dict[int, tuple[Sampled, Future]] = {}  # handed to the engine, in order
        self.next_round: int | None = None
        self.pool: ThreadPoolExecutor | None = None

    def take(self, k: int, prompt_ids: list[list[int]], version: int) -> Sampled:
        """Round k, sampled by the weights of round k - s's start; `version`: the trainer's optimizer steps
        now (the weights it pushes for round k + s)."""
        if self.pool is None:
            self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ablate-rollouts")
            log.info(
                "async GRPO: rounds sampled %d ahead by the engine (%s)",
                self.s,
                type(self.generator).__name__,
            )
        self._first_take(k)
        self._drain()  # the engine idle: its weights may change
        ahead = range(self.next_round, min(k + self.s, self._end() - 1) + 1)
        # round k itself when it was not sampled ahead (a fresh start; a resume without its rounds)
        wanted = sorted(({k} - set(self.done)) | set(ahead))
        if wanted:
            self.generator.ready(self.model)  # this version's weights, pushed (every rank: collectives)
        for r in wanted:
            self._submit(r, version)
        if k in self.pending:
            self._wait(k)
        return self._taken(k, prompt_ids)

    def _submit(self, k: int, version: int) -> None:
        job = Sampled(round=k, policy_version=version, prompt_ids=self.prompts_of(k))
        rows = len(job.prompt_ids) * world_size()
        base = round_seed(self.seed, k) % (
            2**31 - rows
        )  # the round's own seed: timing never changes a sample
        self.pending[k] = (job, self.pool.submit(self._sample, job.prompt_ids, base))
        self.next_round = max(self.next_round, k + 1)

    def _sample(self, prompt_ids: list[list[int]], base: int) -> tuple[Any, float]:
        t0 = time.perf_counter()
        out = self.generator.generate(prompt_ids, base, self.stops)
        return out, time.perf_counter() - t0

    def _wait(self, k: int) -> None:
        job, future = self.pending.pop(k)
        try:
            out, job.seconds = future.result(timeout=self.timeout_s)
        except Timeout:
            raise PeerLostError(
                f"the generation engine returned no round for {self.timeout_s:g} s "
                f"(method.args.worker_timeout_s); the run stops here and keeps its newest checkpoint: resume "
                "with the same command (or ablate resume RUN_DIR)"
            ) from None
        job.completion_ids = out.ids
        job.old_logps = right_pad(out.logps, 0.0, torch.float32)[0]  # the engine's: pi_old (module docstring)
        self.done[k] = job

    def _drain(self) -> None:
        for k in sorted(self.pending):
            self._wait(k)

    def save(self, folder: str) -> None:
        """Wait for the rounds in flight and save every round sampled but not yet taken."""
        self._drain()
        self._save_done(folder)

    def close(self) -> None:
        """Forget the rounds in flight (a later `train()` starts afresh); the engine is the generator's to
        close."""
        if self.pool is not None:
            for _, future in self.pending.values():
                future.cancel()
            self.pool.shutdown(wait=True)
        self.pool, self.next_round, self.done, self.pending = None, None, {}, {}
