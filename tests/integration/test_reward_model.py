"""A learned reward model as GRPO's reward through the CLI (issue 36): `+data.reward_funcs.rm={_target_:
ablate.rewards.RewardModel, path: DIR}` with DIR a sequence-classification model dir; the reward model is
loaded on the trainer's device, scores every round, and is logged as rewards/rm/mean beside a plain function."""

from __future__ import annotations

import sys

from conftest import TESTS, ablate, metrics, summary

sys.path.insert(0, str(TESTS / "parity"))
from test_trl_reward_model import save_reward_model  # noqa: E402


def test_grpo_against_a_reward_model_dir(tmp_path):
    rm = save_reward_model(tmp_path / "rm")
    r = ablate(
        "train",
        "method=grpo",
        "data=tiny_prefs",
        f"+data.reward_funcs.rm={{_target_:ablate.rewards.RewardModel,path:{rm}}}",
        "+data.reward_funcs.one_word=ablate.rewards.format.one_word",
        "method.args.reward_weights=[1.0,0.5]",
        "method.args.max_steps=2",
        "method.args.logging_steps=1",
        f"hydra.run.dir={tmp_path}/run",
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert summary(tmp_path / "run")["status"] == "completed"
    events = [e for e in metrics(tmp_path / "run") if "reward" in e]
    assert len(events) == 2
    for e in events:  # the weighted sum of both columns is the reward
        assert (
            e["rewards/rm/mean"] != 0.0
            and abs(e["reward"] - (e["rewards/rm/mean"] + 0.5 * e["rewards/one_word/mean"])) < 1e-5
        )


def test_train_a_reward_model_then_grpo_against_it(tmp_path):
    """The documented pipeline (docs/methods.md, "A learned reward model"): `ablate train method=reward`, then GRPO
    on the same pairs' prompts scored by that run dir (its model/), through the CLI from a scratch dir."""
    r = ablate("train", "method=reward", "method.args.max_steps=20", "hydra.run.dir=outputs/rm", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert summary(tmp_path / "outputs/rm")["status"] == "completed"
    assert (tmp_path / "outputs/rm/model/config.json").is_file()
    r = ablate(
        "train",
        "method=grpo",
        "data=tiny_prefs",
        "+data.reward_funcs.rm={_target_:ablate.rewards.RewardModel,path:outputs/rm}",
        "method.args.max_steps=2",
        "method.args.logging_steps=1",
        "hydra.run.dir=outputs/grpo",
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert summary(tmp_path / "outputs/grpo")["status"] == "completed"
    events = [e for e in metrics(tmp_path / "outputs/grpo") if "reward" in e]
    assert len(events) == 2
    for e in (
        events
    ):  # the reward model is the only reward: its score is the reward, and it tells completions apart
        assert abs(e["reward"] - e["rewards/rm/mean"]) < 1e-5 and e["reward_std"] > 0
