"""ablate.config reads a config mistake from typed facts (exception classes and their attributes, the overrides as
Hydra's override parser reads them, the config composed without the refused one), never from the wording of
Hydra's or OmegaConf's messages: a new release that rewords them must not turn a one-line answer into a
traceback. The scan below fails on a message fragment of theirs in a string of src/ablate/config."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

CONFIG = Path(__file__).resolve().parents[2] / "src" / "ablate" / "config"
# words of Hydra's and OmegaConf's error messages (hydra/_internal/config_loader_impl.py, omegaconf/errors.py)
FRAGMENTS = (
    "not in struct",
    "could not override",
    "no match in the defaults list",
    "to append to your",
    "could not append to config",
    "an item is already at",
    "either remove + prefix",
    "error merging",
    "cannot merge",
    "could not be converted",
    "value '",
    "could not load",
    "could not find",
    "available options in",
    "missing mandatory value",
    "raised while composing",
    "use \\+",
    "use +",
)


def fragments_in(source: str) -> list[str]:
    """Hydra/OmegaConf message fragments in `source`'s string constants (docstrings, which describe, aside)."""
    tree = ast.parse(source)
    docs = {
        id(n.body[0].value)
        for n in ast.walk(tree)
        if isinstance(n, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        and n.body
        and isinstance(n.body[0], ast.Expr)
        and isinstance(n.body[0].value, ast.Constant)
    }
    found = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs:
            found += [f"{n.lineno}: {f!r}" for f in FRAGMENTS if f in n.value.lower()]
    return found


def test_the_scan_finds_a_wording_match():
    planted = 'def f(e):\n    """Not in struct."""\n    return "not in struct" in str(e) or re.search(r"use \\+(\\S+)", s)\n'
    assert len(fragments_in(planted)) == 2  # the test and the regex, not the docstring


@pytest.mark.parametrize("path", sorted(CONFIG.glob("*.py")), ids=lambda p: p.name)
def test_no_module_reads_hydra_s_wording(path):
    assert fragments_in(path.read_text()) == [], path


def test_a_refused_override_of_the_command_itself_is_named():
    """`ablate serve-rollouts` adds `method/rollouts=vllm_server` to the user's overrides: the line names it,
    read from the overrides given, not from the command line."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from ablate.config.compose import register_resolvers
    from ablate.config.hints import one_line
    from ablate.paths import conf_dir

    register_resolvers()
    for overrides, says in [
        (
            ["method=dpo", "method/rollouts=vllm_server"],
            "method/rollouts=vllm_server: this config has no config ",
        ),
        (
            ["+seed=3"],
            "+seed: seed is already a key of this config (its default is declared): set it without the +, ",
        ),
        (["method.args.beta=abc"], "method.args.beta=abc: must be a number > 0"),
        (
            ["method=grpo", "data.reward_funcs=[m.f]"],
            "add yours, +data.reward_funcs.f=m.f, or replace them all",
        ),
    ]:
        GlobalHydra.instance().clear()
        with pytest.raises(Exception) as e, initialize_config_dir(config_dir=conf_dir(), version_base="1.3"):
            compose("config", overrides=overrides)
        assert says in (one_line(e.value, overrides) or ""), (overrides, one_line(e.value, overrides))
    GlobalHydra.instance().clear()
