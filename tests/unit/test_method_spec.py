"""A method's facts are declared once, in its YAML, and read through ablate.schema.method.MethodSpec: no code
tests a method by its name (the way ORPO's plan came out at half its memory), and each fact reads as the
trainer runs (tests/unit/test_memory_plan.py trains every shipped method against its plan)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from ablate.config.compose import register_resolvers
from ablate.errors import ConfigError
from ablate.paths import conf_dir
from ablate.schema.method import MethodSpec

SRC = Path(__file__).resolve().parents[2] / "src"
METHODS = sorted(p.stem for p in (Path(conf_dir()) / "method").glob("*.yaml"))


def _strings(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [s for e in node.elts for s in _strings(e)]
    return []


def name_switches(tree: ast.AST) -> list[str]:
    """Comparisons of something named like a method (`name`, `cfg.method...`) with a shipped method's name."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        names = {s for o in operands for s in _strings(o)} & set(METHODS)
        about = [ast.unparse(o) for o in operands if not _strings(o)]
        if names and any("method" in a or "name" in a for a in about):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_code_tests_a_method_by_its_name():
    hits = [
        f"{path.relative_to(SRC)}:{hit}"
        for path in sorted(SRC.rglob("*.py"))
        for hit in name_switches(ast.parse(path.read_text(encoding="utf-8")))
    ]
    assert not hits, "a method's facts belong in its YAML (ablate.schema.method), not in:\n" + "\n".join(hits)


@pytest.mark.parametrize(
    "code",
    ['if name in ("dpo", "reward"): pass', 'x = cfg.method.name == "grpo"', 'if "orpo" != method: pass'],
)
def test_the_scan_finds_a_switch(code):
    assert name_switches(ast.parse(code))


def _method(*overrides: str):
    register_resolvers()
    with initialize_config_dir(str(conf_dir()), version_base=None):
        return compose("config", list(overrides)).method


@pytest.mark.parametrize(
    "method, rows, reference, generates",
    [
        ("dpo", "pairs", "precomputed", False),
        ("orpo", "pairs", "none", False),  # inherits DPO's pairs, declares no reference
        ("simpo", "pairs", "none", False),
        ("reward", "pairs", "none", False),
        ("sft", "singles", "none", False),  # MethodSpec's defaults
        ("kto", "singles", "precomputed", False),
        ("rloo", "singles", "kl", True),  # GRPO's
        ("distill", "singles", "teacher", True),
    ],
)
def test_each_methods_facts(method, rows, reference, generates):
    spec = MethodSpec.of(_method(f"method={method}"))
    assert (spec.name, spec.rows, spec.reference, spec.generates) == (method, rows, reference, generates)


def test_what_a_reference_costs_follows_the_arguments():
    dpo, grpo = MethodSpec.of({"reference": "precomputed"}), MethodSpec.of({"reference": "kl"})
    assert not dpo.scores_reference({"precompute_ref_log_probs": True})
    assert dpo.scores_reference({"precompute_ref_log_probs": False})
    assert dpo.scores_reference({"precompute_ref_log_probs": True}, ref_model=True)
    assert not dpo.reference_copy({"precompute_ref_log_probs": False}, ref_model=False, adapters=True)
    assert not grpo.scores_reference({"beta": 0.0}) and grpo.scores_reference({"beta": 0.04})
    teacher = MethodSpec.of({"reference": "teacher"})
    assert teacher.reference_copy({}, ref_model=False, adapters=True)  # a model of its own, adapters or not
    assert MethodSpec.of({"rows": "pairs"}).sequences(8) == 16 and MethodSpec.of({}).sequences(8) == 8


def test_a_wrong_fact_is_one_line():
    with pytest.raises(ConfigError, match=r"^method.rows=triples: must be pairs \(chosen and rejected"):
        MethodSpec.of({"rows": "triples"}).check()
