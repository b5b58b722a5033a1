"""The calculator task end to end, as docs/methods.md gives it (issue 36): SFT on tool-use demonstrations, then
GRPO whose rollouts call the calculator over several turns; then the same with a TRL-style environment. Through
the CLI, on the tiny model, from a scratch directory."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from conftest import ROOT, ablate, metrics, summary

pytestmark = pytest.mark.slow


def _mean(events: list[dict], key: str) -> float:
    values = [e[key] for e in events if key in e]
    return sum(values) / len(values)


@pytest.fixture(scope="module")
def sft(tmp_path_factory) -> Path:
    """Step 1: `ablate train +experiment=calc_tools_sft`: the model learns the call format and to copy."""
    cwd = tmp_path_factory.mktemp("calc")
    r = ablate("train", "+experiment=calc_tools_sft", "hydra.run.dir=outputs/calc_sft", cwd=cwd, timeout=1800)
    assert r.returncode == 0, r.stderr[-3000:]
    assert summary(cwd / "outputs/calc_sft")["status"] == "completed"
    return cwd


def test_grpo_with_the_calculator(sft):
    """Step 2: every round's rollouts call the tool (tools/call_frequency > 0 at every step), the calls run (few
    fail), and GRPO raises the reward: calling the calculator pays, answering from memory does not."""
    r = ablate(
        "train",
        "+experiment=calc_tools",
        "model.path=outputs/calc_sft/model",
        "hydra.run.dir=outputs/calc_grpo",
        cwd=sft,
        timeout=3600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    run = sft / "outputs/calc_grpo"
    assert summary(run)["status"] == "completed"
    events = [e for e in metrics(run) if "reward" in e]
    assert len(events) == 30
    assert all(e["tools/call_frequency"] > 0 for e in events), [e["tools/call_frequency"] for e in events]
    assert _mean(events, "tools/failure_frequency") < 0.2
    first, last = events[:5], events[-10:]  # measured (2026-12-04): reward 1.28 -> 1.63, calls 0.74 -> 0.92
    assert _mean(last, "reward") > _mean(first, "reward") + 0.15, [round(e["reward"], 3) for e in events]
    assert _mean(last, "tools/call_frequency") > _mean(first, "tools/call_frequency") + 0.08
    assert _mean(last, "rewards/correct/mean") > _mean(first, "rewards/correct/mean")


def test_an_environment_scores_its_episodes(sft):
    """docs/methods.md's environment (examples/grpo_own_code/my_env.py, found in the current directory): one
    instance per rollout, its calculator method the model's tool, its get_reward() a reward column."""
    shutil.copy(ROOT / "examples/grpo_own_code/my_env.py", sft / "my_env.py")
    r = ablate(
        "train",
        "+experiment=calc_tools",
        "model.path=outputs/calc_sft/model",
        "method.args.tools=[]",
        "method.args.environment={_target_:my_env.OneCall}",
        "method.args.max_steps=2",
        "hydra.run.dir=outputs/calc_env",
        cwd=sft,
        timeout=1800,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    events = [e for e in metrics(sft / "outputs/calc_env") if "reward" in e]
    assert len(events) == 2 and all(e["tools/call_frequency"] > 0 for e in events)
    assert all(0 < e["rewards/OneCall/mean"] <= 1 for e in events)  # calls made once score 1, none score 0
