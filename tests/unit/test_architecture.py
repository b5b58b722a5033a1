"""The house keeps its shape: no import cycles, imports pointing one way, a short package root and a
train.py that only wires (issue 18). Reads imports as text (ast), lazy ones inside functions included,
as ../shared/tools/import_graph.py does, so a cycle cannot hide behind a function-level import."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "ablate"
# Layers, top first. A package may import its own modules and those of a lower layer, never one of a
# higher layer nor another package of its own layer (packages side by side know nothing of each other).
# Root modules: `train` wires everything below it; `errors` and `paths` sit below everything.
LAYERS = [
    {"__main__"},
    {"cli"},  # the `ablate` command
    {"train"},  # one run: wiring
    {"launchers"},  # where a sweep's jobs run (reads runs as analysis does)
    {"analysis", "config", "logger"},  # after a run / before it / beside it
    {"record"},  # the run record: the run-dir contract analysis reads
    {"process"},  # this process: signals, threads, memory, console
    {
        "methods",
        "callbacks",
        "evaluation",
    },  # trainers and their args; callbacks a user selects; eval backends
    {"speed"},  # speed paths, the speed plan
    {"rollouts"},  # GRPO's generation engines
    {"data"},  # datasets, tokenizing, the reuse cache (its key reads the device's TF32: models)
    {
        "models",
        "losses",
        "rewards",
        "tools",
    },  # tools: functions a GRPO policy may call (ablate.tools.calculator)
    {"schema"},  # what each config node may hold, checked once (no torch)
    {"errors", "paths"},
]
LAYER = {name: i for i, layer in enumerate(LAYERS) for name in layer}


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
    return {
        n: {t for t in ts if not (mods[n].name == "__init__.py" and t.startswith(n + "."))}
        for n, ts in g.items()
    }


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


def package(module: str) -> str:
    """`ablate.record.rundir` -> `record`; a root module is its own package (`ablate.train` -> `train`)."""
    return module.split(".")[1] if "." in module else "ablate"


def wrong_way(g: dict[str, set[str]]) -> list[str]:
    """Edges that point up the layers, or sideways between two packages of one layer."""
    out = []
    for src, targets in g.items():
        a = package(src)
        for dst in targets:
            b = package(dst)
            if a != b and "ablate" not in (a, b) and LAYER[b] <= LAYER[a]:
                out.append(f"{src} -> {dst}")
    return sorted(out)


def test_imports_point_one_way():
    wrong = wrong_way(graph())
    assert not wrong, "imports pointing up the layers or sideways:\n" + "\n".join(wrong)


def test_a_wrong_way_import_is_found():
    """The layer check itself can fail: the record importing the analysis (up), the analysis importing
    the config (sideways), a loss importing a trainer (up); downward edges pass."""
    g = {
        "ablate.record.rundir": {"ablate.analysis.runs"},
        "ablate.analysis.runs": {"ablate.config.checks"},
        "ablate.losses.dpo": {"ablate.methods.dpo"},
        "ablate.cli.train": {"ablate.record.rundir", "ablate.train"},
        "ablate.config.validate": {"ablate.record.rundir", "ablate.errors"},
    }
    assert wrong_way(g) == [
        "ablate.analysis.runs -> ablate.config.checks",
        "ablate.losses.dpo -> ablate.methods.dpo",
        "ablate.record.rundir -> ablate.analysis.runs",
    ]


def test_every_package_is_placed_and_none_is_a_catch_all():
    """Each subpackage has its layer; the rooms that run/ was split into hold one concept each, at most
    8 modules."""
    packages = [p for p in SRC.iterdir() if p.is_dir() and (p / "__init__.py").is_file()]
    assert all(p.name in LAYER for p in packages), [p.name for p in packages if p.name not in LAYER]
    assert not (SRC / "run").exists()
    big = {
        p.name: n
        for p in packages
        if p.name in ("config", "record", "process", "schema")
        and (n := len([m for m in p.glob("*.py") if m.name != "__init__.py"])) > 8
    }
    assert not big, big


def test_package_root_is_short_and_train_only_wires():
    root = sorted(p.stem for p in SRC.glob("*.py") if p.stem != "__init__")
    assert len(root) <= 6, root
    assert len((SRC / "train.py").read_text().splitlines()) <= 150


def test_test_files_have_unique_names():
    """tests/ has no __init__.py (rootdir-relative imports), so two test files with one basename in two
    folders make pytest stop collecting with "import file mismatch": CI's run of stop 26 failed so."""
    tests = Path(__file__).resolve().parents[1]
    seen: dict[str, list[str]] = {}
    for p in tests.rglob("test_*.py"):
        seen.setdefault(p.name, []).append(str(p.relative_to(tests)))
    assert not {k: v for k, v in seen.items() if len(v) > 1}
