"""`ablate compare --out DIR` writes DIR/report.html: one self-contained file (plots embedded as
base64 PNGs, no scripts, no external CSS) that opens from a laptop with no server. It holds the
comparison table, the seed-paired differences, the config keys whose values differ between arms,
and every run's overrides, git sha and library versions: what a reader needs to trust the numbers.
"""

from __future__ import annotations

import base64
import html
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

if TYPE_CHECKING:
    from ablate.analysis.runs import Group, Run
    from ablate.analysis.stats import Paired

_CSS = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px}
table{border-collapse:collapse;margin:1em 0;font-size:0.9em}td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}
th{background:#f3f3f3}code{font-size:0.9em}img{max-width:100%;margin:0.5em 0}"""


def _table(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def flat_config(run: Run) -> dict[str, Any]:
    """The run's composed config (.hydra/config.yaml) as `{dotted.key: value}`; {} when absent."""
    path = run.path / ".hydra" / "config.yaml"
    try:
        cfg = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError):
        return {}
    out: dict[str, Any] = {}

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, dict) and node:
            for k, v in node.items():
                walk(v, f"{prefix}.{k}" if prefix else str(k))
        else:
            out[prefix] = node

    walk(cfg, "")
    return out


def differing_keys(groups: list[Group]) -> tuple[list[str], list[list[str]]]:
    """Config keys whose value differs between arms (keys that vary only within an arm, the seed,
    are left out): header `key, arm1, arm2, ...` and one row per key."""
    per_arm: list[dict[str, set[str]]] = []
    for g in groups:
        values: dict[str, set[str]] = {}
        for r in g.runs:
            for k, v in flat_config(r).items():
                values.setdefault(k, set()).add(repr(v))
        per_arm.append(values)
    keys = sorted({k for arm in per_arm for k in arm})
    rows = []
    for k in keys:
        cells = [arm.get(k, {"(absent)"}) for arm in per_arm]
        if any(len(c) > 1 for c in cells) or len({next(iter(c)) for c in cells}) < 2:
            continue
        rows.append([k, *(next(iter(c)) for c in cells)])
    return ["config key", *(g.label for g in groups)], rows


def run_rows(groups: list[Group]) -> tuple[list[str], list[list[str]]]:
    header = ["arm", "run dir", "status", "overrides", "git sha", "versions"]
    rows = []
    for g in groups:
        for r in g.runs:
            versions = r.summary.get("versions") or {}
            rows.append([g.label, str(r.path), r.status, " ".join(f"{k}={v}" for k, v in r.overrides.items()),
                         str(r.summary.get("git_sha") or "-"), ", ".join(f"{k} {v}" for k, v in versions.items())])
    return header, rows


def write_html(out: Path, groups: list[Group], header: list[str], cells: list[list[str]], notes: list[str],
               diffs: list[Paired], plots: list[Path]) -> Path:
    """Write `out/report.html` and return its path."""
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>ablate compare</title><style>{_CSS}</style>"
             "</head><body><h1>ablate compare</h1>", _table(header, cells)]
    parts += [f"<p>{html.escape(n)}</p>" for n in notes]
    if diffs:
        parts.append("<h2>Seed-paired differences</h2><p>Each arm minus its launch's first arm, one difference "
                     "per seed both ran; 95% bootstrap interval over those differences.</p><ul>")
        parts += [f"<li>{html.escape((f'[{d.launch}] ' if d.launch else '') + d.verdict())}</li>" for d in diffs]
        parts.append("</ul>")
    if plots:
        parts.append("<h2>Curves</h2>")
        for p in plots:
            data = base64.b64encode(p.read_bytes()).decode()
            parts.append(f"<div><img alt='{html.escape(p.stem)}' src='data:image/png;base64,{data}'></div>")
    key_header, key_rows = differing_keys(groups)
    parts.append("<h2>Config keys that differ between arms</h2>")
    parts.append(_table(key_header, key_rows) if key_rows else "<p>none (only the seed differs)</p>")
    run_header, runs = run_rows(groups)
    parts += ["<h2>Runs</h2>", _table(run_header, runs), "</body></html>"]
    path = out / "report.html"
    path.write_text("\n".join(parts))
    return path
