"""The evaluation backends (ablate.evaluation) piece by piece: the win rates against hand-computed values, lm-eval's
output read into eval.json's names, ablate's shipped lm-eval tasks loaded by lm-eval itself offline, the
one-line refusals (unknown task, missing extra, the hub needed offline, no judge), what eval.json keeps when one
backend runs again, and the judge on the tiny model (the same model against itself: every answer ties)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from ablate.config.compose import register_resolvers
from ablate.errors import ConfigError
from ablate.evaluation import harness, results, winrate
from ablate.evaluation.base import Evaluand, Result
from ablate.paths import conf_dir


def composed(*overrides: str):
    register_resolvers()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=conf_dir(), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


# --- win rates ---------------------------------------------------------------------------------------------


def test_win_rate_counts_ties_half() -> None:
    assert winrate.wins([2.0, 1.0, 1.0, 0.0], [1.0, 1.0, 2.0, 0.0]) == [1.0, 0.5, 0.0, 0.5]
    out = winrate.summary([2.0, 1.0, 1.0, 0.0], [1.0, 1.0, 2.0, 0.0], [3, 3, 3, 3], [3, 3, 3, 3])
    assert out["judge/win_rate"] == 0.5 and out["judge/score_diff"] == 0.0
    assert out["judge/score"] == 1.0 and out["judge/length"] == 3.0


def test_length_controlled_win_rate_hand_values() -> None:
    """Equal lengths: σ(θ) is the win rate (0.75); wins exactly where the policy was longer: by symmetry θ = 0,
    LC 0.5; a judge that rewards length (the long answers win 2 of 3, the short ones 1 of 3: raw 0.5) reads
    the same at equal length; long answers winning more than short ones lift the raw rate above the LC one."""
    assert winrate.length_controlled([1, 0, 1, 1], [0, 0, 0, 0]) == pytest.approx(0.75, abs=1e-4)
    assert winrate.length_controlled([1, 1, 0, 0], [5, 5, -5, -5]) == pytest.approx(0.5, abs=1e-9)
    assert winrate.length_controlled([1, 1, 0, 1, 0, 0], [5, 5, 5, -5, -5, -5]) == pytest.approx(
        0.5, abs=1e-9
    )
    # 4 long answers (3 wins), 2 short (1 win): raw 4/6; at equal length the win rate is lower
    lc = winrate.length_controlled([1, 1, 1, 0, 1, 0], [4, 4, 4, 4, -8, -8])
    assert lc < 4 / 6 and lc > 0.5


# --- lm-eval ----------------------------------------------------------------------------------------------


def test_lm_eval_output_becomes_eval_json_names() -> None:
    out = {
        "results": {
            "ablate_sort": {"alias": "ablate_sort", "exact_match,none": 0.75, "exact_match_stderr,none": 0.25},
            "gsm8k": {"exact_match,strict-match": 0.5, "exact_match_stderr,strict-match": "N/A"},
        },
        "samples": {
            "ablate_sort": [
                {"doc_hash": "ab" * 32, "metrics": ["exact_match"], "exact_match": 1.0, "filter": "none",
                 "arguments": [["sort: cba =", {}]], "filtered_resps": [" abc"], "target": " abc"},
            ]
        },
    }  # fmt: skip
    metrics, rows = harness.results(out)
    assert metrics == {
        "lm_eval/ablate_sort/exact_match": 0.75,
        "lm_eval/ablate_sort/exact_match_stderr": 0.25,
        "lm_eval/gsm8k/exact_match/strict-match": 0.5,  # a filter other than none: appended; N/A: left out
    }
    assert rows == [
        {
            "id": "lm_eval/ablate_sort/" + "ab" * 8,
            "lm_eval/ablate_sort/exact_match": 1.0,
            "prompt": "sort: cba =",
            "response": "[' abc']",
            "target": " abc",
        }
    ]


def test_the_shipped_tasks_load_in_lm_eval_offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """lm-eval itself builds ablate's two tasks from their YAML, over the local JSONL, with the hub off."""
    pytest.importorskip("lm_eval")
    from lm_eval.tasks import TaskManager, get_task_dict

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    assert set(harness.shipped()) == {"ablate_sort", "ablate_sort_choice"}
    configs = [harness.shipped_config(t) for t in harness.shipped()]
    for c in configs:
        assert all(Path(f).is_file() for f in c["dataset_kwargs"]["data_files"].values())
    tasks = get_task_dict(configs, TaskManager(include_defaults=False))
    assert {t.config.output_type for t in tasks.values()} == {"generate_until", "multiple_choice"}
    assert [len(t.test_docs()) for t in tasks.values()] == [64, 64]


class _Index:
    """lm-eval's task index, cut to one hub task."""

    task_index = {"gsm8k": SimpleNamespace(cfg={"dataset_path": "openai/gsm8k"})}


def test_lm_eval_refusals_are_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(harness, "_library_tasks", lambda: _Index())
    harness.LmEval(["ablate_sort", "ablate_sort_choice"]).check()  # ablate's own: nothing to refuse
    with pytest.raises(
        ConfigError, match=r"no lm-eval task 'gsm9k' \(did you mean gsm8k\? ablate's: ablate_sort"
    ):
        harness.LmEval(["gsm9k"]).check()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(harness, "_cached", lambda repo: False)
    with pytest.raises(ConfigError) as e:
        harness.LmEval(["gsm8k"]).check()
    assert str(e.value) == (
        "eval.lm_eval.tasks: gsm8k reads its data (openai/gsm8k) from the Hugging Face hub, which cannot be "
        "reached here (HF_HUB_OFFLINE=1), and no copy is cached; run it where the hub can be reached, or pick "
        "ablate's local tasks (ablate_sort, ablate_sort_choice)"
    )
    monkeypatch.setattr(harness, "_cached", lambda repo: True)
    harness.LmEval(["gsm8k"]).check()  # cached: lm-eval reads it offline
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "lm_eval" else real(name, *a)
    )
    with pytest.raises(
        ConfigError,
        match=r"needs the optional package 'lm_eval', not installed: pip install 'ablate\[eval\]'",
    ):
        harness.LmEval(["ablate_sort"]).check()


def test_a_judge_is_required_and_its_path_checked(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^eval=judge needs a judge: judge=reward_model judge.path=DIR"):
        results.check(composed("eval=judge"))
    with pytest.raises(ConfigError, match=r"^RewardModel: path .*nowhere does not exist"):
        results.check(composed("eval=judge", "judge=reward_model", f"judge.path={tmp_path / 'nowhere'}"))
    with pytest.raises(ConfigError, match=r"^eval.judge.vs=.*: no model there"):
        results.check(composed("eval=judge", "judge=reward_funcs", f"eval.judge.vs={tmp_path}"))


# --- what eval.json keeps ----------------------------------------------------------------------------------


def test_running_one_backend_again_keeps_the_others() -> None:
    before = {
        "evals": ["heldout", "lm_eval"],
        "split": "eval",
        "examples": 4,
        "lm_eval": {"tasks": ["ablate_sort"]},
        "metrics": {"eval_loss": 0.5, "lm_eval/ablate_sort/exact_match": 0.25},
    }
    rows = [{"id": "a", "eval": "heldout", "loss": 0.5}, {"id": "lm_eval/t/x", "eval": "lm_eval", "m": 0.0}]
    new = {
        "lm_eval": Result(
            {"lm_eval/ablate_sort/exact_match": 1.0}, [{"id": "lm_eval/t/x", "m": 1.0}], {"tasks": ["x"]}
        )
    }
    record, out = results.merged(before, rows, new, "dpo", ["eval=lm_eval"])
    assert record["evals"] == ["heldout", "lm_eval"] and record["split"] == "eval" and record["examples"] == 4
    assert record["metrics"] == {"eval_loss": 0.5, "lm_eval/ablate_sort/exact_match": 1.0}
    assert record["lm_eval"] == {"tasks": ["x"]} and record["overrides"] == ["eval=lm_eval"]
    assert out == [
        {"id": "a", "eval": "heldout", "loss": 0.5},
        {"id": "lm_eval/t/x", "m": 1.0, "eval": "lm_eval"},
    ]
    cfg = composed("eval=[heldout,lm_eval,judge]", "judge=reward_funcs")
    assert results.pending(cfg, record) == ["judge"] and results.pending(cfg, {}) == [
        "heldout",
        "lm_eval",
        "judge",
    ]
    assert results.done({"split": "eval", "metrics": {"eval_loss": 1.0}}) == ["heldout"]  # an older eval.json


# --- the judge on the tiny model -----------------------------------------------------------------------------


def test_the_judge_scores_both_models_alike(tmp_path: Path) -> None:
    """The tiny model judged against itself by the data's reward function (tiny_repeat: how much of the answer
    repeats the letter; the untrained tiny model copies it, scoring 1): the same greedy answers, every pair a
    tie, win rate and LC win rate 0.5, difference 0. With its final norm negated it repeats nothing: it loses
    every pair, 0 against 1."""
    import torch
    from hydra.utils import instantiate

    from ablate.evaluation.judged import Judged

    cfg = composed("method=grpo", "data=tiny_repeat", "eval=judge", "judge=reward_funcs")
    tokenizer, model = instantiate(cfg.model)
    judge = Judged(max_new_tokens=8, limit=6)
    same = judge(Evaluand(cfg, tmp_path, model, tokenizer))
    assert same.metrics["judge/win_rate"] == 0.5 and same.metrics["judge/lc_win_rate"] == pytest.approx(0.5)
    assert same.metrics["judge/score_diff"] == 0.0 and len(same.examples) == 6
    assert all(r["completion"] == r["baseline"] and r["judge/win_rate"] == 0.5 for r in same.examples)
    with torch.no_grad():  # the final norm negated: the logits reversed, the letter no longer repeated
        model.model.norm.weight.mul_(-1)
    other = judge(Evaluand(cfg, tmp_path, model, tokenizer))
    assert all(r["score"] == 0.0 and r["baseline_score"] == 1.0 for r in other.examples)
    assert other.metrics["judge/win_rate"] == 0.0 and other.metrics["judge/score_diff"] == -1.0
    assert other.metrics["judge/lc_win_rate"] < 0.01  # every length equal: the win rate, up to the ridge
    assert other.facts["judge"] == "reward_funcs" and other.facts["prompts"] == 6
