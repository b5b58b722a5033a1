"""The methods beyond DPO/SFT/GRPO, end to end through the console entry point on the embedded default
data: `ablate train method=NAME` learns, leaves a run dir of the contract, and `ablate eval` scores it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import ablate, metrics, summary


def _train(tmp_path_factory, name: str, *overrides: str) -> Path:
    run_dir = tmp_path_factory.mktemp(name) / "run"
    r = ablate("train", f"method={name}", *overrides, f"hydra.run.dir={run_dir}")
    assert r.returncode == 0, r.stderr[-3000:]
    return run_dir


def _eval(run_dir: Path, *overrides: str) -> dict:
    r = ablate("eval", str(run_dir), *overrides)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads((run_dir / "eval.json").read_text())


def _values(run_dir: Path, key: str) -> list[float]:
    return [e[key] for e in metrics(run_dir) if key in e]


@pytest.fixture(scope="module")
def reward_run(tmp_path_factory) -> Path:
    return _train(tmp_path_factory, "reward")


def test_reward_model_learns_the_sort_preference(reward_run):
    s = summary(reward_run)
    assert s["status"] == "completed" and s["method"] == "reward"
    assert s["metrics"]["accuracy"] >= 0.9 and s["metrics"]["margin"] > 0
    for name in ("loss", "accuracy", "margin", "mean_reward", "min_reward", "max_reward", "num_tokens"):
        assert name in s["metrics"], name  # TRL's RewardTrainer names
    assert _values(reward_run, "margin")[-1] > _values(reward_run, "margin")[0]


def test_reward_run_dir_is_a_sequence_classifier(reward_run):
    """model/ loads as transformers' sequence classifier (one output): a reward model for other runs."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model = AutoModelForSequenceClassification.from_pretrained(reward_run / "model").eval()
    tok = AutoTokenizer.from_pretrained(reward_run / "model")
    assert model.config.num_labels == 1
    ids = tok(["sort: cab = abc</s>", "sort: cab = bca</s>"], return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        good, bad = model(**ids).logits.squeeze(-1).tolist()
    assert good > bad  # it prefers the sorted answer on a prompt it has not been told about


def test_generate_on_a_reward_model_is_one_line(reward_run):
    r = ablate("generate", str(reward_run), "--prompt", "sort: cba =")
    assert (
        r.returncode == 2 and "is a reward model (method=reward)" in r.stderr and "Traceback" not in r.stderr
    )


def test_reward_eval_held_out_accuracy(reward_run):
    result = _eval(reward_run)
    assert result["method"] == "reward" and result["split"] == "eval"
    assert result["metrics"]["eval_accuracy"] >= 0.9
    rows = [json.loads(line) for line in (reward_run / "eval_examples.jsonl").read_text().splitlines()]
    assert len(rows) == result["examples"] and {"accuracy", "margin"} <= set(rows[0])


def test_lora_reward_model_saves_a_plain_classifier(tmp_path_factory):
    """+peft=lora: the score head trains in full beside the adapters (peft's SEQ_CLS task); model/ is the
    adapter (ablate eval rebuilds base + head + adapter), model/merged/ a plain sequence-classifier dir."""
    from transformers import AutoModelForSequenceClassification

    run_dir = _train(
        tmp_path_factory, "reward", "+peft=lora", "peft.save_merged=true", "method.args.max_steps=5"
    )
    assert (run_dir / "model" / "adapter_config.json").is_file()
    assert (
        AutoModelForSequenceClassification.from_pretrained(run_dir / "model" / "merged").config.num_labels
        == 1
    )
    assert 0 <= _eval(run_dir)["metrics"]["eval_accuracy"] <= 1


@pytest.fixture(scope="module")
def kto_run(tmp_path_factory) -> Path:
    return _train(tmp_path_factory, "kto", "method.args.max_steps=30")


def test_kto_learns_from_the_pairs_unpaired(kto_run):
    """The default data (preference pairs) is unpaired as TRL does: both labels are seen, and the
    implicit reward margin between desirable and undesirable completions grows."""
    s = summary(kto_run)
    assert s["status"] == "completed" and s["method"] == "kto"
    margins = _values(kto_run, "rewards/margins")
    assert margins[-1] > 0 and margins[-1] > margins[0]
    for name in ("kl", "rewards/chosen", "rewards/rejected", "logps/chosen", "logps/rejected", "entropy"):
        assert name in s["metrics"], name


def test_kto_eval(kto_run):
    result = _eval(kto_run)
    assert result["method"] == "kto" and result["metrics"]["eval_rewards/margins"] > 0


# One thread for the runs that generate: the tiny model's decoding is many small ops (tests/integration/test_grpo.py)
ONE_THREAD = {"OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def rloo_run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("rloo") / "run"
    # no KL penalty: TRL's default (0.05) holds the tiny task's random-init policy near its start (docs/methods.md)
    r = ablate(
        "train",
        "method=rloo",
        "method.args.beta=0",
        "method.args.max_steps=60",
        f"hydra.run.dir={run_dir}",
        env=ONE_THREAD,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return run_dir


def test_rloo_learns_the_letter_task(rloo_run):
    """GRPO's rollouts and task, RLOO's estimator (no KL penalty): the reward rises from the random init's ~1/256."""
    s = summary(rloo_run)
    assert s["status"] == "completed" and s["method"] == "rloo" and s["generation_rounds"] == 60
    rewards = _values(rloo_run, "reward")
    assert rewards[0] < 0.05 and rewards[-1] > 5 * rewards[0], rewards  # 60 steps: ~0.007 -> ~0.09
    for name in (
        "reward_std",
        "frac_reward_zero_std",
        "rewards/repeat_fraction/std",
        "clip_ratio/region_mean",
        "entropy",
    ):
        assert name in s["metrics"], name


def test_rloo_eval_is_the_reward_of_its_completions(rloo_run):
    greedy = _eval(rloo_run)
    assert greedy["method"] == "rloo" and greedy["completions"] == "greedy, one per prompt"
    m = greedy["metrics"]
    assert m["eval_reward"] == m["eval_rewards/repeat_fraction/mean"] and 0 < m["eval_reward"] <= 1
    rows = [json.loads(line) for line in (rloo_run / "eval_examples.jsonl").read_text().splitlines()]
    assert len(rows) == greedy["examples"] == 64
    assert sum(r["reward"] for r in rows) / len(rows) == pytest.approx(m["eval_reward"], abs=1e-6)
    assert _eval(rloo_run)["metrics"] == m  # greedy: the same numbers again
    sampled = _eval(rloo_run, "--samples", "2")
    assert sampled["completions"] == "2 sampled per prompt" and 0 <= sampled["metrics"]["eval_reward"] <= 1


@pytest.fixture(scope="module")
def distill_run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("distill") / "run"
    r = ablate("train", "method=distill", f"hydra.run.dir={run_dir}", env=ONE_THREAD)
    assert r.returncode == 0, r.stderr[-3000:]
    return run_dir


def test_distill_student_learns_the_teachers_behaviour(distill_run):
    """The default teacher (the task's scripted one) repeats the prompt's letter: the student's divergence
    from it falls, and the task's reward (logged, not trained on) rises with it."""
    s = summary(distill_run)
    assert s["status"] == "completed" and s["method"] == "distill" and s["generation_rounds"] == 60
    losses, rewards = _values(distill_run, "loss"), _values(distill_run, "reward")
    assert losses[-1] < 0.5 * losses[0], losses
    assert rewards[0] < 0.1 and rewards[-1] >= 0.5, rewards
    assert {"entropy", "completions/mean_length", "num_tokens"} <= set(s["metrics"])


def test_distill_eval(distill_run):
    assert _eval(distill_run)["metrics"]["eval_reward"] >= 0.5


def test_sft_eval_loss_and_token_accuracy(tmp_path_factory):
    run_dir = _train(tmp_path_factory, "sft", "debug=fast")
    m = _eval(run_dir)["metrics"]
    assert m["eval_loss"] > 0 and 0 <= m["eval_mean_token_accuracy"] <= 1


def test_data_preview_shows_each_methods_examples(tmp_path):
    """A reward model's pair is two whole sequences; KTO's pairs become a desirable and an undesirable example."""
    r = ablate("data", "preview", "method=reward", "-n", "1", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "the score is read at the last token" in r.stdout and "--- rejected ---" in r.stdout
    r = ablate("data", "preview", "method=kto", "-n", "2", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.index("label: desirable") < r.stdout.index("label: undesirable")
