"""The user docs (README.md, docs/**/*.md) hold no unfilled placeholder and cite no internal work a user
cannot look up: no TODO/TBD/XXX/FIXME, no ALL_CAPS_NAME in prose that ablate's code and config never name
(SMOL_RESULTS was one: an environment variable, RUN_DIR or Q4_1 is named by src/ too), and no "issue 33"."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
MARKERS = re.compile(r"\b(TODO|TBD|XXX|FIXME)\b")
CAPS = re.compile(r"\b[A-Z][A-Z0-9]*_[A-Z0-9_]*[A-Z0-9]\b")
OTHERS = ("SLURM_", "MASTER_")  # other programs' environment variables (SLURM's, torchrun's), named in prose
ISSUE = re.compile(r"\b(issues?|PR|pull request)\s*#?\d+|(?<![\w/&])#\d+\b", re.IGNORECASE)


def _prose(text: str) -> str:
    """The text outside code blocks and inline code (a command's placeholder is written in code)."""
    return re.sub(r"`[^`\n]*`", "", re.sub(r"```.*?```", "", text, flags=re.S))


def _named_by_code() -> str:
    files = [*(ROOT / "src").rglob("*.py"), *(ROOT / "conf").rglob("*.yaml")]
    return "\n".join(p.read_text(encoding="utf-8") for p in files)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_placeholder_or_issue_reference(doc: Path) -> None:
    text = doc.read_text(encoding="utf-8")
    prose = _prose(text)
    code = _named_by_code()
    found = [m.group(0) for m in MARKERS.finditer(prose)]
    found += [
        m.group(0)
        for m in CAPS.finditer(prose)
        if m.group(0) not in code and not m.group(0).startswith(OTHERS)
    ]
    found += [
        m.group(0) for m in ISSUE.finditer(text)
    ]  # in code too: a comment citing "issue 33" is no better
    assert not found, f"{doc.relative_to(ROOT)}: {found}"


def test_the_check_finds_what_it_is_for() -> None:
    text = "| run | data | SMOL_RESULTS |\nTBD\nsee issue 33 and Issue 32's catalogue; `ABLATE_CACHE` is code"
    prose = _prose(text)
    assert [m.group(0) for m in CAPS.finditer(prose) if m.group(0) not in _named_by_code()] == [
        "SMOL_RESULTS"
    ]
    assert [m.group(0) for m in MARKERS.finditer(prose)] == ["TBD"]
    assert len(list(ISSUE.finditer(text))) == 2
