"""Reward functions, tools and environments named by a dotted path (ablate.rewards.resolve): every form
`data.reward_funcs` takes, a module found in the current directory (no PYTHONPATH), and each mistake as
one line naming the key and the form."""

from __future__ import annotations

import functools
import sys

import pytest

from ablate.errors import ConfigError
from ablate.rewards import resolve

MODULE = '''
def short(completions, **kwargs):
    """Shorter is better."""
    return [-float(len(c)) for c in completions]


def scaled(completions, scale=1.0, **kwargs):
    return [scale * len(c) for c in completions]
'''


@pytest.fixture
def user_dir(tmp_path, monkeypatch):
    """A directory holding the user's reward module, as the cwd; sys.path and sys.modules restored after."""
    (tmp_path / "myrew_t.py").write_text(MODULE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    yield tmp_path
    sys.modules.pop("myrew_t", None)


def test_a_module_in_the_current_directory_is_found(user_dir):
    fn = resolve.locate("myrew_t.short", "data.reward_funcs[0]")
    assert fn(["ab", "abcd"]) == [-2.0, -4.0]
    assert sys.path[-1] == str(user_dir)  # appended last: an installed module of the same name would win


def test_every_form_of_reward_funcs(user_dir):
    assert list(resolve.reward_funcs(["myrew_t.short"])) == [
        "short"
    ]  # the short form: named after the function
    assert list(resolve.reward_funcs("myrew_t.short")) == ["short"]
    assert list(resolve.reward_funcs({"brief": "myrew_t.short"})) == ["brief"]  # +data.reward_funcs.brief=...
    bound = resolve.reward_funcs({"s": {"_target_": "myrew_t.scaled", "_partial_": True, "scale": 2.0}})["s"]
    assert isinstance(bound, functools.partial) and bound(["abc"]) == [6.0]
    made = functools.partial(len)  # what Hydra makes of a `_partial_: true` node: kept as it is
    assert resolve.reward_funcs({"n": made})["n"] is made
    assert resolve.reward_funcs(None) == {}


@pytest.mark.parametrize(
    "value,says",
    [
        (["myrew_t.shrt"], "data.reward_funcs[0]=myrew_t.shrt: myrew_t has no 'shrt'"),
        (["nosuchmod_x.short"], "no module 'nosuchmod_x' on the import path or in the current directory"),
        (["short"], "not a dotted path MODULE.NAME"),
        (["myrew_t.short", "myrew_t.short"], "two reward functions named 'short'"),
        ({"a": 3}, "data.reward_funcs.a: expected a dotted path to a function"),
        (3, "data.reward_funcs=[MODULE.FUNCTION]"),
    ],
)
def test_mistakes_are_one_line(user_dir, value, says):
    with pytest.raises(ConfigError, match=None) as e:
        resolve.reward_funcs(value)
    assert says in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_a_module_that_fails_to_import_is_one_line(user_dir):
    (user_dir / "broken_t.py").write_text("import nosuchdependency_x\n")
    with pytest.raises(ConfigError, match="importing broken_t failed: No module named 'nosuchdependency_x'"):
        resolve.locate("broken_t.f", "method.args.tools[0]")
    (user_dir / "raising_t.py").write_text("raise RuntimeError('boom')\n")
    with pytest.raises(ConfigError, match="importing raising_t failed: RuntimeError: boom"):
        resolve.locate("raising_t.f", "method.args.tools[0]")
