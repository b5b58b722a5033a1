"""ruff, as CI runs it: `python -m pytest` runs this file, so a line ruff would reformat or a lint error
(pyproject.toml's [tool.ruff]) fails the suite with ruff's own report."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def ruff(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """`python -m ruff ARGS` in cwd, with no cache written (the checkout stays as it was)."""
    found = subprocess.run([sys.executable, "-m", "ruff", "--version"], capture_output=True, text=True)
    if found.returncode != 0:
        pytest.fail("ruff is not installed in this environment: pip install -e '.[dev]' -c constraints.txt")
    return subprocess.run(
        [sys.executable, "-m", "ruff", *args, "--no-cache"], cwd=cwd, capture_output=True, text=True
    )


def test_ruff_check_is_clean():
    out = ruff("check", ".")
    assert out.returncode == 0, out.stdout + out.stderr


def test_ruff_format_leaves_the_code_as_it_is():
    out = ruff("format", "--diff", ".")
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_checks_can_fail(tmp_path: Path):
    """With the project's settings, an unused import, a 111-column line and code ruff would reformat
    are each reported: the two tests above would catch them in src."""
    (tmp_path / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    (tmp_path / "bad.py").write_text("import os\n\nx = [1,2]\n" + "y = '" + "a" * 105 + "'\n")
    check = ruff("check", "--output-format", "concise", ".", cwd=tmp_path)
    assert check.returncode == 1, check.stdout + check.stderr
    assert "bad.py:1:8: F401" in check.stdout and "bad.py:4:111: E501" in check.stdout, check.stdout
    fmt = ruff("format", "--check", ".", cwd=tmp_path)
    assert fmt.returncode == 1 and "bad.py" in fmt.stdout, fmt.stdout + fmt.stderr


def test_no_line_over_the_limit_in_the_formatted_scope():
    """ruff's E501 lets a line run long when only its pragma (`# type: ignore[...]`) passes the limit; the
    formatted scope holds no line longer than `line-length` at all."""
    import tomllib

    settings = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["ruff"]
    limit, left_out = settings["line-length"], [ROOT / p for p in settings.get("extend-exclude", [])]
    long = [
        f"{path.relative_to(ROOT)}:{n}: {len(line)} columns"
        for path in sorted((ROOT / "src").rglob("*.py"))
        if not any(path == p or p in path.parents for p in left_out)
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if len(line) > limit
    ]
    assert not long, "\n".join(long)
