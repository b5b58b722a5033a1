"""Asynchronous GRPO through an engine (ablate.rollouts.engine_ahead.EngineRounds), without vLLM: a fake engine
records its pushes and rounds. Round k is sampled by the weights of round k - s's start (the Schedule's
policy_version), the weights move only while no round is in flight, each round's seed is its own (so a run does not
depend on timing), pi_old is the engine's log-probs, and a checkpoint's saved rounds are served, not sampled again."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest
import torch

from ablate.errors import ConfigError, PeerLostError
from ablate.rollouts.ahead import round_seed
from ablate.rollouts.engine_ahead import EngineRounds
from ablate.rollouts.generation import Completions
from ablate.rollouts.schedule import Schedule


class FakeEngine:
    """Pushes when its version moved; samples in whatever thread calls it; notes both, and who was in flight."""

    gathers_weights = True

    def __init__(self, delay: float = 0.05) -> None:
        self.version, self.pushed, self.delay = 0, None, delay
        self.events: list[tuple] = []
        self.busy = threading.Event()

    def ready(self, model) -> None:
        assert not self.busy.is_set(), "weights pushed while a round was being sampled"
        if self.pushed != self.version:
            self.events.append(("push", self.version))
            self.pushed = self.version

    def generate(self, prompt_ids, base, stops) -> Completions:
        self.busy.set()
        try:
            time.sleep(self.delay)
            self.events.append(("sample", prompt_ids[0][0], self.pushed, base))
            return Completions(
                ids=[[base % 5, *stops]] * len(prompt_ids), logps=[[-0.5, -0.25]] * len(prompt_ids)
            )
        finally:
            self.busy.clear()


def _args(s: int = 1, **kw) -> SimpleNamespace:
    base = dict(max_staleness=s, generation_dtype=None, async_threads="split", seed=3, worker_timeout_s=30.0)
    return SimpleNamespace(**{**base, **kw})


def _prompts(k: int) -> list[list[int]]:
    return [[k, 9], [k, 9]]


def _train(rounds: EngineRounds, engine: FakeEngine, ks: range, schedule: Schedule) -> list:
    taken = []
    for k in ks:  # spg 1, accumulation 1: round k starts after k optimizer steps
        engine.version = k
        taken.append(rounds.take(k, _prompts(k), k))
        time.sleep(0.01)  # training the round, while the engine samples the next
    return taken


@pytest.mark.parametrize("s", [1, 2])
def test_round_k_is_sampled_by_the_weights_of_round_k_minus_s_and_weights_move_only_when_idle(s):
    engine, schedule = FakeEngine(), Schedule(batch_size=2, num_generations=2, staleness=s)
    rounds = EngineRounds(engine, None, _args(s), _prompts, [7])
    rounds.last_round = 6
    try:
        taken = _train(rounds, engine, range(6), schedule)
    finally:
        rounds.close()
    assert [t.policy_version for t in taken] == [schedule.policy_version(k) for k in range(6)]
    samples = {e[1]: e for e in engine.events if e[0] == "sample"}
    assert sorted(samples) == list(range(6))  # every round once, none past last_round
    for k, (_, _, pushed, base) in samples.items():
        assert pushed == schedule.policy_version(k)  # the engine held those weights when it sampled round k
        assert base == round_seed(3, k) % (2**31 - 2)  # the round's own seed
    pushes = [e[1] for e in engine.events if e[0] == "push"]
    assert pushes == sorted(set(pushes)) and pushes[0] == 0
    t = taken[2]
    assert t.completion_ids == [[t.completion_ids[0][0], 7]] * 2 and t.prompt_ids == _prompts(2)
    assert torch.equal(t.old_logps, torch.tensor([[-0.5, -0.25]] * 2))  # pi_old: the engine's own


def test_a_checkpoint_saves_the_rounds_in_flight_and_a_resume_serves_them(tmp_path):
    schedule = Schedule(batch_size=2, num_generations=2, staleness=1)
    engine = FakeEngine()
    rounds = EngineRounds(engine, None, _args(), _prompts, [7])
    rounds.last_round = 5
    first = _train(rounds, engine, range(3), schedule)  # round 3 in flight after the third take
    rounds.save(str(tmp_path))
    rounds.close()
    uninterrupted_engine = FakeEngine()
    uninterrupted = EngineRounds(uninterrupted_engine, None, _args(), _prompts, [7])
    uninterrupted.last_round = 5
    whole = _train(uninterrupted, uninterrupted_engine, range(5), schedule)
    uninterrupted.close()

    resumed_engine = FakeEngine()
    resumed = EngineRounds(resumed_engine, None, _args(), _prompts, [7])
    resumed.last_round = 5
    resumed.load(str(tmp_path))
    rest = _train(resumed, resumed_engine, range(3, 5), schedule)
    resumed.close()
    assert 3 not in [e[1] for e in resumed_engine.events if e[0] == "sample"]  # served from the checkpoint
    got = [(t.round, t.policy_version, t.completion_ids) for t in first + rest]
    assert got == [(t.round, t.policy_version, t.completion_ids) for t in whole]


def test_an_engine_that_returns_no_round_is_one_line():
    engine = FakeEngine(delay=2.0)
    rounds = EngineRounds(engine, None, _args(worker_timeout_s=0.2), _prompts, [7])
    with pytest.raises(PeerLostError, match="returned no round for 0.2 s .* resume"):
        rounds.take(0, _prompts(0), 0)
    rounds.close()


@pytest.mark.parametrize(
    "kw,words",
    [
        ({"generation_dtype": "bfloat16"}, "generation_dtype / async_threads set the forked worker"),
        ({"async_threads": "balanced"}, "generation_dtype / async_threads set the forked worker"),
    ],
)
def test_the_forked_workers_options_are_refused_with_an_engine(kw, words):
    with pytest.raises(ConfigError, match=words):
        EngineRounds(FakeEngine(), None, _args(**kw), _prompts, [7])


def test_tool_calls_are_refused_in_one_line():
    engine = FakeEngine()
    engine.toolbox = object()  # a ToolGenerator around the engine exposes its toolbox
    with pytest.raises(ConfigError, match="with tools: rounds sampled ahead through an engine"):
        EngineRounds(engine, None, _args(), _prompts, [7])
