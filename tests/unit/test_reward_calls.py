"""What GRPO holds a reward function to (ablate.rewards.calls, issue 32): each way a user's function
breaks the contract is one line naming it; None/NaN is TRL's "not scored"; a round nothing scores is
said once. End to end, through the CLI: the reward-* cases of tests/integration/test_bad_inputs.py."""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest
import torch

import bad_rewards
from ablate.errors import UserCodeError
from ablate.rewards import calls

KW = {"prompts": ["p"] * 4, "completions": ["a", "bb", "ccc", "dddd"], "completion_ids": [[1]] * 4}


def test_numbers_none_and_nan_pass_through_as_floats():
    def mixed(prompts, completions, **kw):
        return [1, np.float32(0.5), None, math.nan]

    out = calls.score("m", mixed, 4, KW, "log")
    assert out[:2] == [1.0, 0.5] and math.isnan(out[2]) and math.isnan(out[3])
    assert calls.score("arr", lambda **kw: np.array([1.0, 2.0, 3.0, 4.0]), 4, KW, "log") == [
        1.0,
        2.0,
        3.0,
        4.0,
    ]
    assert calls.score("t", lambda **kw: torch.tensor([1.0, 2.0, 3.0, 4.0]), 4, KW, "log") == [
        1.0,
        2.0,
        3.0,
        4.0,
    ]


@pytest.mark.parametrize(
    "fn,says",
    [
        (
            bad_rewards.raises,
            "reward function 'r' (bad_rewards.raises) raised ValueError: my reward broke on purpose "
            "(traceback: the log)",
        ),
        (bad_rewards.one_short, "returned 3 rewards for 4 completions"),
        (bad_rewards.strings, "returned 'good' (str) for completion 0: a reward is a number"),
        (bad_rewards.scalar, "returned a float (1.0), not a list of one reward per completion"),
        (lambda **kw: None, "returned a NoneType (None), not a list"),
        (lambda **kw: {"a": 1}, "returned a dict ({'a': 1}), not a list"),
        (lambda **kw: [[1.0]] * 4, "returned [1.0] (list) for completion 0"),
        (
            bad_rewards.infinite,
            "returned inf for completion 0: rewards must be finite (None or NaN: not scored)",
        ),
        (lambda **kw: [1.0, -math.inf, 1.0, 1.0], "returned -inf for completion 1"),
        (
            bad_rewards.exits,
            "reward function 'r' (bad_rewards.exits) called sys.exit(0): a reward function returns its "
            "rewards, one per completion (traceback: the log)",
        ),
        (bad_rewards.beyond_float32, "returned 1e+39 for completion 0: beyond float32's range (3.4e+38)"),
    ],
    ids=[
        "raises",
        "one-short",
        "strings",
        "scalar",
        "none",
        "dict",
        "nested",
        "inf",
        "minus-inf",
        "sys-exit",
        "beyond-float32",
    ],
)
def test_a_broken_contract_is_one_line_naming_the_function(fn, says):
    with pytest.raises(UserCodeError) as e:
        calls.score("r", fn, 4, KW, "the log")
    assert says in str(e.value) and "\n" not in str(e.value)
    assert str(e.value).startswith("reward function 'r' (")


def test_a_round_no_function_scores_is_said_once(caplog):
    warned: set[str] = set()
    with caplog.at_level(logging.WARNING, logger="ablate"):
        for _ in range(3):
            table = calls.table({"u": bad_rewards.unscored}, KW, 4, warned)
    assert torch.isnan(table).all()
    said = [r.getMessage() for r in caplog.records if "no reward function scored" in r.getMessage()]
    assert len(said) == 1 and "all None or NaN" in said[0], said
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="ablate"):  # one function scores: nothing to say
        calls.table({"u": bad_rewards.unscored, "l": bad_rewards.length}, KW, 4, set())
    assert not caplog.records


def test_signatures_before_the_run_and_columns_when_the_data_is_known():
    assert calls.call_problem(bad_rewards.length) is None
    assert calls.call_problem(bad_rewards.wrong_signature) == "it takes no 'prompts'"
    assert calls.call_problem(bad_rewards.positional_only) == "its 'prompts' is positional-only"
    assert (
        calls.call_problem(bad_rewards.needs_a_column) is None
    )  # 'answer' may be a column: judged with the data
    assert calls.column_problem(bad_rewards.needs_a_column, ["answer"]) is None
    assert calls.column_problem(bad_rewards.needs_a_column, ["letter"]).startswith(
        "needs the column 'answer'"
    )

    def no_kwargs(prompts, completions, completion_ids):
        return []

    assert (
        calls.column_problem(no_kwargs, ["letter"])
        == "takes no 'letter', a column of the data it is given (add **kwargs)"
    )


def test_an_async_reward_function_is_awaited():
    """TRL awaits `async def` reward functions; ablate refused them as "returned a coroutine"."""

    async def rew(prompts, completions, **kw):
        return [float(len(c)) for c in completions]

    assert calls.call_problem(rew) is None
    assert calls.score("a", rew, 4, KW, "log") == [1.0, 2.0, 3.0, 4.0]


def test_a_null_reward_function_is_dropped():
    assert calls.usable({"a": None, "b": bad_rewards.length}) == {"b": bad_rewards.length}


def test_a_reward_model_and_an_environment_are_held_to_the_same_contract(tmp_path):
    """Issue 36: what GRPO scores with beside Python functions, a reward model (a class: its instance is called)
    and an environment's get_reward() (named after the user's class), goes through the same checks."""
    import sys

    from conftest import TESTS

    from ablate.rollouts import rewarding
    from ablate.models import tiny
    from ablate.rewards import RewardModel
    from ablate.rollouts.generation import Completions
    from ablate.rollouts.tool_calls import ToolFormat
    from ablate.rollouts.turns import Toolbox

    sys.path.insert(0, str(TESTS / "parity"))
    from test_trl_reward_model import save_reward_model

    tok, _ = tiny()
    box = Toolbox(ToolFormat(tok), [], environment=bad_rewards.WordyEnv)
    funcs, weights = rewarding.gather(
        ["bad_rewards.length", None], None, box
    )  # the short form, a null dropped
    assert list(funcs) == ["length", "WordyEnv"] and weights == [1.0, 1.0]
    rows, out = [{"prompt": "p"}], Completions(ids=[tok("hi", add_special_tokens=False)["input_ids"]])
    with pytest.raises(
        UserCodeError,
        match=r"reward function 'WordyEnv' \(bad_rewards\.WordyEnv\.get_reward\) "
        r"returned 'good' \(str\) for completion 0",
    ):
        rewarding.table(funcs, rows, out, tok, [bad_rewards.WordyEnv()], set())

    def no_kwargs(prompts, completions, completion_ids):  # every function receives environments= (TRL's)
        return [1.0]

    with pytest.raises(
        UserCodeError, match=r"reward function 'strict' \(.*no_kwargs\) takes no 'environments'"
    ):
        rewarding.ready({"strict": no_kwargs}, None, box, "cpu")

    rm = RewardModel(str(save_reward_model(tmp_path / "rm")))
    assert calls.call_problem(RewardModel.__call__) is None and calls.column_problem(rm, ["answer"]) is None
    assert rewarding.table({"rm": rm}, rows, out, tok, None, set()).isfinite().all()
    with torch.no_grad():  # a diverged reward model: an infinite logit
        rm.model.model.norm.weight[0], rm.model.score.weight[0, 0] = 1e30, 1e30
    with pytest.raises(
        UserCodeError,
        match=r"reward function 'rm' \(ablate\.rewards\.reward_model\.RewardModel\) "
        r"returned -?inf for completion 0: rewards must be finite",
    ):
        rewarding.table({"rm": rm}, rows, out, tok, None, set())


def test_rloo_distillation_and_eval_score_through_the_same_checks(tmp_path):
    """GRPO, RLOO (GRPO's trainer), distillation and `ablate eval` build TRL's call in one place
    (ablate.rollouts.evaluate.reward_table), so a broken function is the same one line in each; and
    distillation checks its functions against the data's columns when it is built, as GRPO does."""
    from datasets import Dataset

    from ablate.methods.distill import DistillConfig, DistillTrainer
    from ablate.models import tiny
    from ablate.models.teachers import letter_teacher
    from ablate.rollouts.rewarding import reward_table

    tok, student = tiny()
    rows = [{"prompt": "gggg", "letter": "g"}] * 4
    with pytest.raises(
        UserCodeError, match=r"reward function 'r' \(bad_rewards.one_short\) returned 3 rewards for 4"
    ):
        reward_table({"r": bad_rewards.one_short}, tok, rows, [[1]] * 4)
    assert reward_table({"l": bad_rewards.length}, tok, rows, [[1]] * 4).shape == (4, 1)
    with pytest.raises(UserCodeError, match=r"\(bad_rewards.needs_a_column\) needs the column 'answer'"):
        DistillTrainer(
            model=student,
            teacher=letter_teacher,
            processing_class=tok,
            train_dataset=Dataset.from_list(rows),
            reward_funcs={"mine": bad_rewards.needs_a_column},
            args=DistillConfig(output_dir=str(tmp_path), report_to="none", use_cpu=True),
        )
