"""The house keeps its shape: no import cycles, imports pointing one way, a short package root and a
train.py that only wires (issue 18). Reads imports as text (ast), lazy ones inside functions included,
as ../shared/tools/import_graph.py does, so a cycle cannot hide behind a function-level import."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "ablate"
# Each package may import only from packages of a lower layer (or its own). Root modules: `train` sits
# above everything it wires; `errors` and `paths` below everything.
LAYERS = [
    {"__main__", "cli"},
    {"train"},
    {"run", "launchers", "analysis", "logger"},
    {"methods", "callbacks"},
    {"rollouts", "speed"},
    {"models", "data", "losses", "rewards", "tools"},
    {"errors", "paths"},
]
LAYER = {name: i for i, layer in enumerate(LAYERS) for name in layer}
# The few edges that point up on purpose, each with its reason.
ALLOWED_UP = {
    ("analysis", "run"): "analysis reads the run dir contract (ablate.run.rundir: names, JSON readers)",
    ("launchers", "run"): "a sweep composes configs and reads run dirs like a run does",
    ("models", "speed"): "the model builders apply the lean layers (until the speed plan owns them)",
}


def modules() -> dict[str, Path]:
    out = {}
    for path in SRC.rglob("*.py"):
        parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(up + ([base] if base else []))
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        for t in targets:
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t != name and t != "ablate":
                found.add(t)
    return found


def graph() -> dict[str, set[str]]:
    """module -> the modules it imports; a package's __init__ importing its own submodules is not a
    cycle of design (as in ../shared/tools/import_graph.py)."""
    mods = modules()
    g = {name: imports(name, path, set(mods)) for name, path in mods.items()}
    return {n: {t for t in ts if not (mods[n].name == "__init__.py" and t.startswith(n + "."))} for n, ts in g.items()}


def cycles(g: dict[str, set[str]]) -> list[set[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in g.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(comp)

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles():
    assert cycles(graph()) == []


def test_a_cycle_is_found():
    """The cycle finder itself can fail: a -> b -> c -> a is one cycle, d is not in it."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]


def test_imports_point_one_way():
    wrong = []
    for src, targets in graph().items():
        a = src.split(".")[1] if "." in src else "ablate"
        for dst in targets:
            b = dst.split(".")[1] if "." in dst else "ablate"
            if a == b or a == "ablate" or b == "ablate":
                continue
            if LAYER[b] < LAYER[a] and (a, b) not in ALLOWED_UP:
                wrong.append(f"{src} -> {dst}")
    assert not wrong, "imports pointing up the layers:\n" + "\n".join(sorted(wrong))


def test_package_root_is_short_and_train_only_wires():
    root = sorted(p.stem for p in SRC.glob("*.py") if p.stem != "__init__")
    assert len(root) <= 6, root
    assert all(p.name in LAYER for p in SRC.iterdir() if p.is_dir() and (p / "__init__.py").is_file())
    assert len((SRC / "train.py").read_text().splitlines()) <= 150


def test_test_files_have_unique_names():
    """tests/ has no __init__.py (rootdir-relative imports), so two test files with one basename in two
    folders make pytest stop collecting with "import file mismatch": CI's run of stop 26 failed so."""
    tests = Path(__file__).resolve().parents[1]
    seen: dict[str, list[str]] = {}
    for p in tests.rglob("test_*.py"):
        seen.setdefault(p.name, []).append(str(p.relative_to(tests)))
    assert not {k: v for k, v in seen.items() if len(v) > 1}
