"""GRPO end to end through the console entry point: `ablate train method=grpo` learns the shipped
task, and `steps_per_generation` divides the number of generation rounds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import ablate, metrics, summary

# One thread: the tiny model's generation is many small ops, which thread contention on a shared
# CPU slows by 10x; the numbers do not depend on it.
ENV = {"OMP_NUM_THREADS": "1"}


def _rewards(run_dir: Path) -> list[float]:
    return [e["reward"] for e in metrics(run_dir) if "reward" in e]


def _train(run_dir: Path, *overrides: str) -> dict:
    r = ablate("train", "method=grpo", *overrides, f"hydra.run.dir={run_dir}", env=ENV)
    assert r.returncode == 0, r.stderr[-3000:]
    (run_dir / "stdout.txt").write_text(r.stdout)
    return summary(run_dir)


def test_default_grpo_run_learns(tmp_path):
    """No data= given: method=grpo selects the shipped prompts + reward. Reward ~0 -> >= 0.9."""
    s = _train(tmp_path / "run")
    assert s["status"] == "completed" and s["method"] == "grpo" and s["global_step"] == 200
    rewards = _rewards(tmp_path / "run")
    assert rewards[0] < 0.1, rewards  # random init: ~1/256 per character
    assert s["metrics"]["reward"] >= 0.9 and max(rewards[-3:]) >= 0.9, rewards
    names = set().union(*metrics(tmp_path / "run"))
    for m in (
        "reward",
        "reward_std",
        "rewards/repeat_fraction/mean",
        "completions/mean_length",
        "completions/clipped_ratio",
        "clip_ratio/region_mean",
        "entropy",
        "timing/generation_seconds",
    ):
        assert m in names, m
    assert "kl" not in names  # beta = 0: no reference model
    assert "never rose" not in (tmp_path / "run" / "stdout.txt").read_text() and "note" not in s  # it learned
    assert s["generation_rounds"] == 200 and s["generation_seconds"] > 0
    # `ablate eval`: the reward of its greedy completions of the held-out prompts
    r = ablate("eval", str(tmp_path / "run"), env=ENV)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads((tmp_path / "run" / "eval.json").read_text())["metrics"]["eval_reward"] >= 0.9


def test_a_short_run_that_learns_nothing_says_why(tmp_path):
    """`max_steps` below what the default task needs (its reward starts rising near step 45 of the default 200):
    the summary says the reward never rose, that the task needs ~80 steps and that max_steps shortened the
    schedule too, on one line under the final table (and in summary.json)."""
    s = _train(
        tmp_path / "run",
        "method.args.max_steps=8",
        "method.args.logging_steps=2",
        "method.args.save_strategy=no",
    )
    out = (tmp_path / "run" / "stdout.txt").read_text().splitlines()
    said = [line for line in out if "never rose" in line]
    assert len(said) == 1 and said[0] == s["note"], out[-5:]
    assert said[0].startswith("reward never rose above its first steps' level (")
    assert said[0].endswith(
        "first and last logged values, over 8 steps): the default task (data=tiny_repeat) "
        "needs ~80 steps of the default 200-step schedule (its reward starts rising near step "
        "45); max_steps also shortens the LR schedule (cosine: it ends at step 8)"
    )
    assert out.index(said[0]) == len(out) - 2 and out[-1].startswith(
        "run dir: "
    )  # under the table, above the dir


def test_spg8_does_8x_fewer_generation_rounds(tmp_path):
    """Same 16 steps: 16 rounds with spg=1, 2 with spg=8. The spg=1 run also exercises the KL term and
    the other loss/scaling variants (they do not change the schedule)."""
    steps = ["method.args.max_steps=16", "method.args.logging_steps=4"]
    one = _train(
        tmp_path / "spg1",
        *steps,
        "method.args.steps_per_generation=1",
        "method.args.beta=0.04",
        "method/grpo_aggregation=dr_grpo",
        "method/grpo_scale_rewards=batch",
    )
    eight = _train(tmp_path / "spg8", *steps, "method.args.steps_per_generation=8")
    assert one["global_step"] == eight["global_step"] == 16
    assert one["generation_rounds"] == 16 and eight["generation_rounds"] == 2
    # the batch geometry table, printed before the first step, says the same
    table = (tmp_path / "spg8" / "stdout.txt").read_text()
    assert "GRPO batch geometry" in table and "generation rounds: 2" in table
    assert "off-policy optimizer steps: 2, 3, 4, 5, 6, 7, 8 of every 8" in table
    assert one["metrics"]["kl"] >= 0 and "kl" not in eight["metrics"]


def test_bad_batch_is_one_line_error(tmp_path):
    r = ablate(
        "train",
        "method=grpo",
        "method.args.per_device_train_batch_size=12",
        f"hydra.run.dir={tmp_path / 'bad'}",
        env=ENV,
    )
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [  # one line, before the run dir exists (run/rules.py)
        "ablate: error: method.args.per_device_train_batch_size=12: must be an integer >= 1 and a multiple of "
        "method.args.num_generations=8 (GRPO's batch counts completions, whole groups)"
    ]
    assert not (tmp_path / "bad").exists()


@pytest.mark.slow
@pytest.mark.parametrize("spg", [2, 4, 8])
def test_every_steps_per_generation_reaches_the_reward_target(tmp_path, spg):
    """spg=1 is the default run above; the default budget (200 steps) is enough for every spg."""
    s = _train(tmp_path / f"spg{spg}", f"method.args.steps_per_generation={spg}")
    assert s["generation_rounds"] == 200 // spg
    assert s["metrics"]["reward"] >= 0.9, _rewards(tmp_path / f"spg{spg}")


@pytest.mark.slow
def test_resume_through_the_run_dir(tmp_path):
    """Crash at step 7 (spg=2), rerun the same command: it resumes from checkpoint-4 (a round
    boundary) with an empty buffer, and reproduces the uninterrupted run's per-step losses and rewards."""
    common = [
        "method.args.max_steps=10",
        "method.args.steps_per_generation=2",
        "method.args.save_steps=4",
        "method.args.logging_steps=1",
        "+callbacks.crash._target_=crashing.CrashAt",
    ]
    a, b = tmp_path / "a", tmp_path / "b"
    assert _train(a, *common)["status"] == "completed"
    crashed = ablate(
        "train", "method=grpo", *common, f"hydra.run.dir={b}", env={**ENV, "ABLATE_TEST_CRASH_AT": "7"}
    )
    assert crashed.returncode != 0 and summary(b)["status"] == "failed"
    s = _train(b, *common)  # same command, same dir -> resume
    assert s["status"] == "completed" and s["global_step"] == 10
    # 5 rounds (steps 1,3,5,7,9), as uninterrupted: 2 before checkpoint-4 (restored) + 3 after it
    assert s["generation_rounds"] == summary(a)["generation_rounds"] == 5
    key = [(e["step"], e["loss"], e.get("reward")) for e in metrics(a) if "loss" in e]
    assert key == [(e["step"], e["loss"], e.get("reward")) for e in metrics(b) if "loss" in e]


def test_fast_generation_and_scoring_switch_off_to_the_same_run(tmp_path):
    """The default (shared-prompt generator, length-grouped scoring) and the plain path picked by config
    (`speed.shared_prefill=false`: `model.generate` via HFGenerator; whole-batch scoring) sample the same
    completions and train the same: equal rewards and losses step for step."""
    steps = ["method.args.max_steps=4", "method.args.logging_steps=1"]
    _train(tmp_path / "fast", *steps)
    _train(tmp_path / "plain", *steps, "speed.shared_prefill=false", "speed.length_groups=false")
    plans = [
        json.loads((tmp_path / run / "run.json").read_text())["speed_plan"]["policy"]["paths"]
        for run in ("fast", "plain")
    ]
    assert [p["shared_prefill"]["on"] for p in plans] == [True, False]
    assert [p["length_groups"]["on"] for p in plans] == [True, False]
    fast, plain = metrics(tmp_path / "fast"), metrics(tmp_path / "plain")
    pick = lambda rows, k: [e[k] for e in rows if k in e and "train_runtime" not in e]  # noqa: E731
    assert len(pick(fast, "reward")) == 4
    assert pick(fast, "reward") == pick(plain, "reward")
    assert pick(fast, "completions/mean_length") == pick(plain, "completions/mean_length")
    assert pick(fast, "loss") == pytest.approx(pick(plain, "loss"), rel=1e-5, abs=1e-7)


def _prompt_file(path: Path, long: int, short: int) -> None:
    """`long` prompts of 41 characters (41 tokens of the byte tokenizer) and `short` of 4, with the columns
    the shipped task's reward reads."""
    rows = [
        {"prompt": "b" * 41 if i < long else "bbbb", "letter": "b", "length": 8} for i in range(long + short)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.mark.parametrize("limit", [None, 30], ids=["whole-prompts", "max_prompt_length"])
def test_long_prompts_are_kept_whole_or_cut_and_counted(tmp_path, limit):
    """Your prompts, from a scratch dir: whole by default, as TRL 1.16 (no line about it, run.json's `prompts_cut`
    counts 0); with method.args.max_prompt_length=30 the 3 of 16 longer ones are cut to their last 30 tokens, one
    warning line says so and run.json counts them."""
    _prompt_file(tmp_path / "my_prompts.jsonl", long=3, short=13)
    overrides = [
        "data=local",
        "data.train_path=my_prompts.jsonl",
        "data.reward_funcs=[ablate.rewards.letters.repeat_fraction]",
        "method.args.max_steps=2",
        "method.args.per_device_train_batch_size=16",
        "hydra.run.dir=run",
        *([f"method.args.max_prompt_length={limit}"] if limit else []),
    ]
    r = ablate("train", "method=grpo", *overrides, cwd=tmp_path, env=ENV)
    assert r.returncode == 0, r.stderr[-3000:]
    assert summary(tmp_path / "run")["status"] == "completed"
    cut = json.loads((tmp_path / "run" / "run.json").read_text())["prompts_cut"]
    lines = [x for x in (r.stdout + r.stderr).splitlines() if "max_prompt_length" in x]
    assert cut == {"max_prompt_length": limit, "train": {"rows": 16, "cut": 3 if limit else 0, "longest": 41}}
    if limit is None:
        assert lines == [], lines
    else:
        assert len(lines) == 1 and lines[0].endswith(
            "3 of 16 train prompts are longer than method.args.max_prompt_length=30: cut to their last 30 tokens "
            "(null keeps whole prompts, as TRL 1.16)"
        ), lines
