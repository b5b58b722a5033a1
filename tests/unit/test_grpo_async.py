"""Asynchronous GRPO (`max_staleness`, ablate.rollouts.ahead): the version schedule by hand, the
geometry table, the prompts read ahead, and exactness: an async run's per-step losses equal those of
a synchronous run that samples each round from the recorded older weights with the round's seed
(the worker's log-probs of its samples are that run's pi_old), also across a resume with rounds in
flight."""

from __future__ import annotations

import copy
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from datasets import Dataset
from transformers import TrainerCallback

from ablate.errors import ConfigError, UserCodeError
from ablate.methods.grpo import GRPOConfig, GRPOTrainer, RepeatSampler
from ablate.models import tiny
from ablate.rollouts.ahead import AHEAD_ROUNDS, AheadRounds, round_seed
from ablate.rollouts.geometry import batch_geometry
from ablate.rollouts.schedule import Schedule
from tiny_setups import grpo_config, numbered_prompts


@pytest.fixture(autouse=True)
def one_thread():
    """Bitwise comparisons across processes: one torch thread in the trainer and in the worker."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def id_reward(completion_ids: list[list[int]], **_: Any) -> list[float]:
    """Varies between the completions of a group (non-zero advantages at every step)."""
    return [float(sum(c) % 7) for c in completion_ids]


class Record(TrainerCallback):
    """Per optimizer step: the weights after it (v = global_step), and the versions served."""

    def __init__(self) -> None:
        self.weights: dict[int, dict[str, torch.Tensor]] = {}

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kw: Any) -> None:
        self.weights.setdefault(state.global_step, copy.deepcopy(model.state_dict()))

    def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **kw: Any) -> None:
        self.weights[state.global_step] = copy.deepcopy(model.state_dict())


class StopAt(TrainerCallback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        control.should_training_stop = state.global_step >= self.step


def _trainer(path: Path, cls: type = GRPOTrainer, **overrides: Any) -> GRPOTrainer:
    """16 prompts p00..p15, groups of 2, 4 completions per micro-step, real sampling (the default
    generator draws from torch's RNG), constant lr high enough that every step moves the policy."""
    torch.manual_seed(0)
    tok, model = tiny(hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32)
    kw = dict(steps_per_generation=1, max_steps=6, learning_rate=3e-2, lr_scheduler_type="constant")
    trainer = cls(
        model=model,
        args=grpo_config(path, **(kw | overrides)),
        train_dataset=numbered_prompts(16),
        processing_class=tok,
        reward_funcs={"ids": id_reward},
    )
    trainer.served_versions = []  # type: ignore[attr-defined]
    compute_loss = trainer.compute_loss

    def recording(model: Any, inputs: Any, *a: Any, **k: Any) -> torch.Tensor:
        trainer.served_versions.append((trainer.rollouts.micro_step, inputs.policy_version))
        return compute_loss(model, inputs, *a, **k)

    trainer.compute_loss = recording
    return trainer


def _losses(trainer: GRPOTrainer) -> dict[int, float]:
    return {e["step"]: e["loss"] for e in trainer.state.log_history if "loss" in e}


def _round_versions(trainer: GRPOTrainer) -> dict[int, int]:
    """The policy version of each round, as the rollouts served recorded it."""
    m = trainer.schedule.micro_steps_per_round
    return {micro // m: v for micro, v in trainer.served_versions}


class SampledFromRecordedWeights(GRPOTrainer):
    """The synchronous reference: each round is sampled, and its pi_old taken from the sampling logits
    (as the worker does), by a copy of the policy holding the weights this run itself had at the version
    the async run recorded for that round, with the round's seed; nothing else differs from a synchronous run."""

    versions: dict[int, int] = {}
    record: Record
    dtype: torch.dtype | None = None  # the worker's (generation_dtype): the copy's parameters cast to it

    def _behaviour(self, model: Any, prompt_ids: list[list[int]], keep_old: bool) -> Any:
        if not self.model.training:
            return super()._behaviour(model, prompt_ids, keep_old)
        k = self.schedule.round_of(self.rollouts.micro_step)
        old = copy.deepcopy(self.accelerator.unwrap_model(model))
        old.load_state_dict(self.record.weights[self.versions[k]])
        for p in old.parameters() if self.dtype else ():
            p.data = p.data.to(self.dtype)
        with torch.random.fork_rng():
            torch.manual_seed(round_seed(self.args.seed, k))
            return super()._behaviour(
                old, prompt_ids, True, old_from_sampling=True
            )  # as the worker scores it


def _reference(
    path: Path, versions: dict[int, int], dtype: torch.dtype | None = None, **overrides: Any
) -> GRPOTrainer:
    cls = type(
        "Ref", (SampledFromRecordedWeights,), {"versions": versions, "record": Record(), "dtype": dtype}
    )
    ref = _trainer(path, cls=cls, **overrides)
    ref.add_callback(cls.record)
    return ref


def test_versions_by_hand():
    """s=1, spg=1: round k by the weights after k-1 steps (rounds 0, 1 by the initial ones).
    s=2, spg=2 (a round = 2 steps): round k by round k-2's start = step 2(k-2); rounds 0..2 by v0.
    s=1, spg=1, ga=4: 4 rounds per step; round k by round k-1's start, after (k-1)//4 steps.
    s=0 is the synchronous schedule: round k by its own start's weights."""
    s1 = Schedule(batch_size=4, num_generations=2, staleness=1)
    assert [s1.policy_version(k) for k in range(6)] == [0, 0, 1, 2, 3, 4]
    assert [s1.step_versions(t) for t in range(1, 5)] == [[0], [0], [1], [2]]
    assert s1.stale_steps(5) == [2, 3, 4, 5] and s1.keeps_old_logps
    s2 = Schedule(batch_size=4, num_generations=2, steps_per_generation=2, staleness=2)
    assert [s2.policy_version(k) for k in range(6)] == [0, 0, 0, 2, 4, 6]
    assert [s2.step_versions(t)[0] for t in range(1, 11)] == [0, 0, 0, 0, 0, 0, 2, 2, 4, 4]
    ga4 = Schedule(batch_size=4, num_generations=2, accumulation=4, staleness=1)
    assert [ga4.policy_version(k) for k in range(10)] == [0, 0, 0, 0, 0, 1, 1, 1, 1, 2]
    assert ga4.step_versions(2) == [0, 1]  # round 4 (by round 3's start, v0) and rounds 5-7 (v1)
    s0 = Schedule(batch_size=4, num_generations=2, steps_per_generation=2, accumulation=3)
    assert [s0.policy_version(k) for k in range(5)] == [
        0,
        0,
        1,
        2,
        2,
    ]  # round starts 0, 2, 4, 6, 8 micro-steps
    assert not Schedule(batch_size=4, num_generations=2).keeps_old_logps


class FakeWorker:
    """`Worker`'s interface, in process: records the calls; returns the oldest round submitted."""

    def __init__(self) -> None:
        self.params = [torch.zeros(2)]
        self.calls: list[tuple] = []
        self.queue: list[tuple[int, int]] = []  # (round, slot) submitted, not yet returned

    def write(self, slot: int, params: list[torch.Tensor]) -> None:
        self.calls.append(("write", slot))

    def submit(self, job: Any, slot: int, seed: int) -> None:
        self.calls.append(("submit", job.round, job.policy_version, slot))
        self.queue.append((job.round, slot))

    def receive(self) -> tuple[int, list[list[int]], torch.Tensor, float, dict]:
        k, _ = self.queue.pop(0)
        self.calls.append(("receive", k))
        return k, [[1]], torch.zeros(1, 1), 0.0, {}


@pytest.mark.parametrize("s", [1, 2])
def test_the_next_round_is_queued_before_this_one_is_awaited(s):
    """At round k's start the trainer queues round k + s with its current weights (in a slot no round in
    flight uses) before it waits for round k: the worker never waits for the hand-over. Steady state:
    s rounds in flight, each with its own slot, and a free (s+1)-th slot for the new weights."""
    ahead = AheadRounds(behaviour=None, model=None, staleness=s, seed=0, prompts_of=lambda k: [[k]])
    ahead.worker = worker = FakeWorker()
    ahead.last_round = 6
    for k in range(6):  # version k at round k's start: one optimizer step per round
        worker.calls.clear()
        in_flight = dict(worker.queue)  # round -> slot
        assert ahead.take(k, [[k]], version=k).round == k
        submits = [c for c in worker.calls if c[0] == "submit"]
        if k == 0:  # a fresh start: rounds 0..s by the initial weights, one slot, written once
            assert [c[1:3] for c in submits] == [(r, 0) for r in range(s + 1)] and len(
                {c[3] for c in submits}
            ) == 1
            assert [c for c in worker.calls if c[0] == "write"] == [("write", submits[0][3])]
        elif k + s < 6:
            assert sorted(in_flight) == list(range(k, k + s))  # s rounds in flight
            ((_, r, v, slot),) = submits
            assert (r, v) == (k + s, k) and ("write", slot) in worker.calls
            assert slot not in in_flight.values() and slot <= s  # a slot no round in flight uses, of s + 1
            assert worker.calls.index(submits[0]) < worker.calls.index(("receive", k))
        else:
            assert submits == []  # past the last round: nothing more to sample
    assert ahead.done == {} and not ahead.pending


def test_geometry_table_names_the_version_feeding_each_step():
    args = GRPOConfig(
        output_dir="/tmp/unused",
        per_device_train_batch_size=16,
        num_generations=4,
        max_staleness=1,
        use_cpu=True,
        report_to="none",
    )
    table = batch_geometry(args, world_size=1, max_steps=10)
    assert "off-policy optimizer steps: every step from step 2 on" in table
    assert "round k sampled by a worker with the weights of round k-1's start" in table
    assert "1: v0, 2: v0, 3: v1, 4: v2, 5: v3, 6: v4, 7: v5, 8: v6, ... (lag <= 1 step)" in table
    sync = batch_geometry(
        GRPOConfig(
            output_dir="/tmp/unused",
            per_device_train_batch_size=16,
            num_generations=4,
            use_cpu=True,
            report_to="none",
        ),
        world_size=1,
        max_steps=10,
    )
    assert "async" not in sync and "off-policy optimizer steps: none" in sync


def test_round_indices_are_the_iterated_chunks():
    """10 items, 3 prompts per chunk -> 3 chunks per epoch (the 10th item dropped); chunk k over
    epochs is what iterating epoch k // 3 yields for it."""
    s = RepeatSampler(list(range(10)), num_generations=2, prompts=3, repeat=1, seed=5)
    iterated = []
    for epoch in range(3):
        s.set_epoch(epoch)
        rows = list(s)
        iterated += [rows[i : i + 6] for i in range(0, len(rows), 6)]
    assert [s.round_indices(k) for k in range(9)] == iterated


def test_max_staleness_0_is_the_synchronous_trainer(tmp_path):
    trainer = _trainer(tmp_path, max_steps=2)
    assert trainer.ahead is None
    trainer.train()
    assert not any("sample/staleness_mean" in e for e in trainer.state.log_history)
    with pytest.raises(ConfigError, match=r"method.args.max_staleness=-1: must be an integer >= 0"):
        GRPOConfig(
            output_dir=str(tmp_path),
            per_device_train_batch_size=4,
            num_generations=2,
            max_staleness=-1,
            report_to="none",
        )


@pytest.mark.parametrize("dtype", [None, "bfloat16"])
def test_an_engine_of_its_own_samples_ahead_itself_no_worker_forked(tmp_path, dtype):
    """A vLLM engine (method/rollouts=vllm), whose weights the trainer pushes, cannot be forked: it is the worker
    (ablate.rollouts.engine_ahead; no engine is built here, that happens at the first round), and the forked
    worker's own options are one line."""
    import functools

    from ablate.rollouts.engine_ahead import EngineRounds
    from ablate.rollouts.vllm import VLLMGenerator

    tok, model = tiny(hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32)
    args = GRPOConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        num_generations=2,
        max_staleness=1,
        generation_dtype=dtype,
        report_to="none",
        use_cpu=True,
    )
    build = functools.partial(
        GRPOTrainer,
        model=model,
        args=args,
        train_dataset=Dataset.from_dict({"prompt": ["ab"] * 4}),
        processing_class=tok,
        reward_funcs={"ids": id_reward},
        generator=functools.partial(VLLMGenerator, kv_cache_gib=0.125),
    )
    if dtype is not None:
        with pytest.raises(ConfigError, match=r"generation_dtype / async_threads set the forked worker"):
            build()
        return
    trainer = build()
    assert isinstance(trainer.ahead, EngineRounds) and trainer.ahead.s == 1 and trainer.generator.llm is None


def test_more_than_one_process_is_refused():
    """The worker forks one process's policy: under DDP or FSDP (distributed=fsdp needs >= 2 ranks) each
    rank would fork a copy of its own shard or replica and the ranks' rounds would not line up: one line."""
    import types

    import torch

    from ablate.rollouts.ahead import check_async

    args = types.SimpleNamespace(device=torch.device("cpu"), world_size=2)
    with pytest.raises(
        ConfigError, match=r"max_staleness=1: asynchronous generation is single-process \(this run has 2\)"
    ):
        check_async(1, args, None)
    check_async(1, types.SimpleNamespace(device=torch.device("cpu"), world_size=1), None)


@pytest.mark.parametrize(("s", "spg", "mu", "steps"), [(1, 1, 1, 6), (2, 2, 1, 10), (1, 1, 2, 6)])
def test_async_losses_equal_sync_sampling_from_recorded_older_weights(tmp_path, s, spg, mu, steps):
    """The async run's rounds carry the schedule's versions (round k by round k-s's start), and its
    per-step losses equal, bit for bit, those of the synchronous reference sampling round k from the
    weights it had itself at that version with round k's seed. The plain synchronous run differs (the
    test can fail)."""
    overrides = dict(steps_per_generation=spg, num_iterations=mu, max_steps=steps)
    run = _trainer(tmp_path / "async", max_staleness=s, **overrides)
    run.train()
    versions = _round_versions(run)
    schedule = run.schedule
    assert versions == {k: schedule.policy_version(k) for k in versions} and len(versions) == steps // (
        spg * mu
    )
    assert versions[s + 1] > 0  # off-policy rounds happened
    losses = _losses(run)
    assert len(losses) == steps and run.rollout_stats().rounds == len(versions)
    assert sum(abs(v) for v in losses.values()) > 0
    staleness = [e["sample/staleness_mean"] for e in run.state.log_history if "loss" in e]
    assert staleness == [t - schedule.step_versions(t + 1)[0] for t in range(steps)]
    ref = _reference(tmp_path / "ref", versions, **overrides)
    ref.train()
    assert _losses(ref) == losses
    plain = _trainer(tmp_path / "plain", **overrides)
    plain.train()
    assert _losses(plain) != losses


def test_a_bf16_worker_samples_with_the_weights_rounded_to_bf16(tmp_path):
    """generation_dtype=bfloat16: the worker samples round k, and takes its pi_old, with the recorded
    weights rounded to bf16 (its frozen and trainable parameters; buffers as they are), so the losses
    equal, bit for bit, those of the reference sampling from a bf16 copy; the trainer's own weights stay
    fp32. The fp32 worker's losses differ (the cast happened)."""
    run = _trainer(tmp_path / "bf16", max_staleness=1, generation_dtype="bfloat16")
    run.train()
    assert {p.dtype for p in run.model.parameters()} == {torch.float32}
    losses = _losses(run)
    assert len(losses) == 6 and sum(abs(v) for v in losses.values()) > 0
    ref = _reference(tmp_path / "ref", _round_versions(run), dtype=torch.bfloat16, max_staleness=0)
    ref.train()
    assert _losses(ref) == losses
    fp32 = _trainer(tmp_path / "fp32", max_staleness=1)
    fp32.train()
    assert _losses(fp32) != losses


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        (
            dict(max_staleness=0, generation_dtype="bfloat16"),
            "generation_dtype=bfloat16: must be null, float32 or bfloat16, "
            "with method.args.max_staleness > 0",
        ),
        (
            dict(max_staleness=1, generation_dtype="bf16"),
            "generation_dtype=bf16: must be null, float32 or bfloat16",
        ),
        (
            dict(max_staleness=0, async_threads="balanced"),
            "async_threads=balanced: must be split, or balanced with method.args.max_staleness > 0",
        ),
        (dict(max_staleness=1, async_threads="shared"), "async_threads=shared: must be split, or balanced"),
    ],
)
def test_async_options_are_checked(tmp_path, kw, message):
    """generation_dtype and async_threads (tests/unit/test_async_cores.py) are the async worker's."""
    with pytest.raises(ConfigError, match=message):
        GRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", **kw)


@pytest.mark.parametrize(
    ("s", "spg", "stop", "dtype"), [(1, 2, 3, None), (2, 1, 2, None), (1, 1, 3, "bfloat16")]
)
def test_resume_with_rounds_in_flight_reproduces_the_losses(tmp_path, s, spg, stop, dtype):
    """Checkpoint at step `stop` (s=1, spg=2: mid-round; s=2, spg=1: a round boundary; a bf16 worker): the
    rounds sampled ahead are awaited and saved with it; the resumed run serves them, hands the worker the
    same weights at the same rounds, and logs the uninterrupted run's losses."""
    full = _trainer(
        tmp_path / "full", max_staleness=s, steps_per_generation=spg, max_steps=8, generation_dtype=dtype
    )
    full.train()
    first = _trainer(
        tmp_path / "run",
        max_staleness=s,
        steps_per_generation=spg,
        max_steps=8,
        generation_dtype=dtype,
        save_strategy="steps",
        save_steps=stop,
    )
    first.add_callback(StopAt(stop))  # as if killed right after the checkpoint
    first.train()
    ckpt = tmp_path / "run" / "out" / f"checkpoint-{stop}"
    saved = torch.load(ckpt / AHEAD_ROUNDS, weights_only=True)
    next_round = -(-stop // spg)  # the first round not started yet
    assert [r["round"] for r in saved["rounds"]] == list(range(next_round, next_round + s))
    resumed = _trainer(
        tmp_path / "run", max_staleness=s, steps_per_generation=spg, max_steps=8, generation_dtype=dtype
    )
    resumed.train(resume_from_checkpoint=str(ckpt))
    after = {k: v for k, v in _losses(full).items() if k > stop}
    assert len(after) == 8 - stop and {k: _losses(resumed)[k] for k in after} == after


def test_worker_failure_is_raised_in_the_trainer(tmp_path):
    trainer = _trainer(tmp_path, max_staleness=1, max_steps=2)

    def broken(model: Any, prompt_ids: list[list[int]]) -> list[list[int]]:
        raise ValueError("no completions today")

    trainer.generator = broken
    with pytest.raises(RuntimeError, match="generation worker failed.*no completions today"):
        trainer.train()
    assert trainer.ahead.worker is None  # closed with the failed train()


def test_prompts_read_ahead_are_checked_against_the_dataloader(tmp_path):
    trainer = _trainer(tmp_path, max_staleness=1, max_steps=2)
    trainer.ahead.prompts_of = lambda k: [[7]] * 4  # not what the sampler yields
    with pytest.raises(RuntimeError, match="round 0's prompts differ"):
        trainer.train()


class SignalWorkerAt(TrainerCallback):
    """Sends the generation worker `sig` at the end of optimizer step `step` (as kill -9, the OOM killer
    or Ctrl-Z would), remembering its pid."""

    def __init__(self, trainer: GRPOTrainer, step: int, sig: int) -> None:
        self.trainer, self.step, self.sig, self.pid = trainer, step, sig, None

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if state.global_step == self.step:
            self.pid = self.trainer.ahead.worker.process.pid
            os.kill(self.pid, self.sig)


def test_a_killed_worker_is_one_line_and_the_run_resumes(tmp_path):
    """Issue 32: kill -9 of the worker ended the trainer with a BrokenPipeError page. Now one line naming
    the worker and its signal; the checkpoint before it is whole, and resuming from it gives the
    uninterrupted run's losses."""
    full = _trainer(tmp_path / "full", max_staleness=1, max_steps=4)
    full.train()
    run = _trainer(tmp_path / "run", max_staleness=1, max_steps=4, save_strategy="steps", save_steps=1)
    kill = SignalWorkerAt(run, 2, signal.SIGKILL)
    run.add_callback(kill)
    with pytest.raises(UserCodeError) as e:
        run.train()
    assert str(e.value).startswith(
        f"generation worker (PID {kill.pid}) died: killed by SIGKILL (kill -9, or the "
        "out-of-memory killer); the run stops here and keeps its newest checkpoint: resume"
    )
    assert run.ahead.worker is None  # closed with the failed train()
    resumed = _trainer(tmp_path / "run", max_staleness=1, max_steps=4)
    resumed.train(resume_from_checkpoint=str(tmp_path / "run" / "out" / "checkpoint-1"))
    assert {k: v for k, v in _losses(resumed).items() if k > 1} == {
        k: v for k, v in _losses(full).items() if k > 1
    }


def test_a_stalled_worker_times_out_in_one_line(tmp_path):
    """SIGSTOP of the worker hung the run with no output; now method.args.worker_timeout_s bounds the wait."""
    import psutil

    run = _trainer(tmp_path, max_staleness=1, max_steps=4, worker_timeout_s=2)
    stop = SignalWorkerAt(run, 1, signal.SIGSTOP)
    run.add_callback(stop)
    t0 = time.monotonic()
    with pytest.raises(
        UserCodeError,
        match=r"generation worker \(PID \d+\) sent no round for 2 s \(stopped: SIGSTOP "
        r"or Ctrl-Z; method.args.worker_timeout_s=2\): killed it; the run stops here",
    ):
        run.train()
    assert time.monotonic() - t0 < 60
    assert not psutil.pid_exists(stop.pid) or psutil.Process(stop.pid).status() == psutil.STATUS_ZOMBIE
    with pytest.raises(ConfigError, match="method.args.worker_timeout_s=0: must be a number > 0"):
        GRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", worker_timeout_s=0)
