"""Every `_target_` of a config, checked before anything is imported or built: a typo names the closest name,
and a user's module that is not importable (a forgotten PYTHONPATH) says how to make it so.

The check reads source files, it does not import them (no torch in the launching process): the
module part of a target is found on the import path as Python would find it, and the name after
it must be defined at the module's top level (a def, a class, an assignment or an import). Where
the source cannot tell (a compiled module, a lazy `__getattr__` module such as transformers', a
`from x import *`) the target is left to Hydra, which imports it at run time.
"""

from __future__ import annotations

import ast
import difflib
import functools
import importlib.machinery
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

from ablate.errors import ConfigError

# keys whose functions and classes ablate imports itself (ablate.rewards.resolve), from the current
# directory too: a reward function, tool or environment in the user's own file needs no PYTHONPATH
FROM_CWD = ("data.reward_funcs", "method.args.tools", "method.args.environment")


def check_target(key: str, target: str) -> None:
    """Raise ConfigError when `target` (the value of config key `key`) cannot be located."""
    parts = target.split(".")
    module, spec = _longest_module(parts, cwd=key.startswith(FROM_CWD))
    if spec is None:
        raise ConfigError(_not_importable(key, target, parts[0]))
    names = module.count(".") + 1
    if names == len(parts):  # a module itself as the target: Hydra calls it only if it is callable
        return
    defined = _top_level_names(spec)
    name = parts[names]
    if defined is None or name in defined:
        return
    hint = difflib.get_close_matches(name, sorted(defined), n=1)
    meant = f"did you mean {module}.{hint[0]}?" if hint else f"{module} defines no '{name}'"
    raise ConfigError(f"{key}={target}: no '{name}' in module {module} ({meant})")


def _longest_module(parts: list[str], cwd: bool = False) -> tuple[str, Any]:
    """The longest importable module prefix of `parts` and its spec, found without importing it
    (only the top-level package's spec is asked of the import system: editable installs hook in
    there; with `cwd`, then the current directory); (parts[0], None) when not even the top-level
    name is importable."""
    top = parts[0]
    spec = _spec(top)
    if spec is None and cwd:
        spec = importlib.machinery.PathFinder.find_spec(top, [os.getcwd()])
        if spec is not None and os.getcwd() not in sys.path:  # so Hydra's instantiate finds it too
            sys.path.append(os.getcwd())  # last: installed packages keep their names (ablate.rewards.resolve)
    if spec is None:
        return top, None
    name = top
    for part in parts[1:]:
        locations = spec.submodule_search_locations
        if not locations:
            break
        sub = importlib.machinery.PathFinder.find_spec(f"{name}.{part}", list(locations))
        if sub is None:
            break
        name, spec = f"{name}.{part}", sub
    return name, spec


def _spec(top: str) -> Any:
    if top in sys.modules:
        return getattr(sys.modules[top], "__spec__", None) or importlib.machinery.ModuleSpec(top, None)
    try:
        return importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None


@functools.lru_cache(maxsize=256)
def _names_in(path: str) -> frozenset[str] | None:
    try:
        text = Path(path).read_text(encoding="utf-8")
        tree = ast.parse(text)
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return None
    if "_LazyModule" in text or "def __getattr__" in text:
        return None  # attributes made on demand (PEP 562, transformers' _LazyModule)
    names: set[str] = set()
    for node in _statements(tree.body):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            if any(alias.name == "*" for alias in node.names):
                return None  # star import: the source cannot tell
            names |= {alias.asname or alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return frozenset(names)


def _statements(body: list[ast.stmt]) -> list[ast.stmt]:
    """Top-level statements, those inside `if`/`try`/`with` blocks included (a name defined in any
    branch counts: this check only refuses what cannot exist)."""
    out: list[ast.stmt] = []
    for node in body:
        out.append(node)
        for block in ("body", "orelse", "finalbody"):
            if isinstance(node, (ast.If, ast.Try, ast.With)) and getattr(node, block, None):
                out += _statements(getattr(node, block))
        for handler in getattr(node, "handlers", []) if isinstance(node, ast.Try) else []:
            out += _statements(handler.body)
    return out


def _top_level_names(spec: Any) -> frozenset[str] | None:
    """Names defined at the top of the module `spec` (a package: its __init__.py, and its submodules),
    or None when its source cannot tell (no .py source, lazy attributes, star imports)."""
    origin = getattr(spec, "origin", None)
    if not origin or not str(origin).endswith(".py"):
        return None
    names = _names_in(str(origin))
    subs = {
        p.stem
        for loc in spec.submodule_search_locations or []
        for p in Path(loc).iterdir()
        if p.suffix == ".py" or (p / "__init__.py").is_file()
    } - {"__init__", "__main__"}
    return None if names is None else names | subs


def _not_importable(key: str, target: str, top: str) -> str:
    """Hydra says only `Error locating target`: say that the module is not on the import path, and how."""
    here = Path.cwd()
    local = [p for p in (here / f"{top}.py", here / top) if p.exists()]
    if key.startswith(FROM_CWD):
        return (
            f"{key}={target}: no module '{top}' on the import path or in the current directory ({here}); "
            f"put {top}.py there (the short form: data.reward_funcs=[{top}.FUNCTION])"
        )
    if local:
        return (
            f"{key}={target}: module '{top}' is in the current directory ({local[0].name}), which the "
            f"`ablate` command does not import from; run it as PYTHONPATH=. ablate ... "
            f"(or PYTHONPATH=/path/to/its/folder)"
        )
    path = os.environ.get("PYTHONPATH", "")
    where = f" (PYTHONPATH={path})" if path else " (PYTHONPATH is not set)"
    return (
        f"{key}={target}: module '{top}' is not importable{where}; put the folder holding {top}.py (or the "
        f"package {top}/) on PYTHONPATH: PYTHONPATH=/path/to/that/folder ablate ..., or pip install it"
    )
