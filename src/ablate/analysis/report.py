"""`ablate compare --out DIR` writes DIR/report.html: one self-contained file (plots embedded as
base64 PNGs, no scripts, no external CSS) that opens from a laptop with no server. It holds the
comparison table, the seed-paired differences, with many seeds the probability of improvement and
performance profiles, per-example differences on a shared eval set, a summary in words of which
differences are clear, the config keys whose values differ between arms, and every run's overrides,
git sha and library versions: what a reader needs to trust the numbers.
"""

from __future__ import annotations

import base64
import html
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ablate.analysis import many_seeds, stats

if TYPE_CHECKING:
    from ablate.analysis.many_seeds import Improvement
    from ablate.analysis.per_example import ExamplePaired
    from ablate.analysis.runs import Group, Run
    from ablate.analysis.stats import Paired


MARKER = ".ablate-report"  # written first into an --out dir: a later compare may rewrite what is there


def check_out(out: Path) -> None:
    """`--out` is a new dir, an empty one, or one an earlier `ablate compare --out` wrote (its marker):
    a folder of other things (a report.html of the user's) is never written over (ConfigError)."""
    from ablate.errors import ConfigError

    if out.exists() and not out.is_dir():
        raise ConfigError(
            f"--out {out} is a file: give a directory (it gets "
            "report.html, summary.md, summary.csv and PNG plots)"
        )
    held = sorted(p.name for p in out.iterdir()) if out.is_dir() else []
    if held and MARKER not in held:
        shown = ", ".join(held[:3]) + (", ..." if len(held) > 3 else "")
        raise ConfigError(
            f"--out {out} holds files that are not an ablate report ({shown}): give a new or empty "
            "dir; nothing was written"
        )


def claim_out(out: Path) -> None:
    """Create `out` (checked by `check_out`) and mark it as a report dir of ablate's."""
    out.mkdir(parents=True, exist_ok=True)
    (out / MARKER).write_text("written by `ablate compare --out`: a later one may replace these files\n")


DEFAULT_OUT = Path("<default>")  # `--out` given without a dir
DEFAULT_OUT_RULE = "a sweep launch's own report/, else outputs/reports/<date_time>/"


def default_out(runs: list[Run], paths: list[Path]) -> Path:
    """Where `--out` alone writes: `<launch>/report/` when one sweep launch is compared, named by its dir
    or its sweep's folder (the sweep dir is ablate's; no run dir is written into), else
    `outputs/reports/<date_time>/` under the cwd."""
    import time

    launched = {r.launch for r in runs}
    launch = next(iter(launched)) if len(launched) == 1 else None
    given = {p.resolve() for p in paths}
    if (
        launch is not None
        and all(r.launch != r.path.resolve() for r in runs)
        and {launch, launch.parent} & given
    ):
        return launch / "report"
    return Path("outputs") / "reports" / time.strftime("%Y-%m-%d_%H-%M-%S")


@dataclass
class ManySeeds:
    """What the report shows beyond the table and seed-paired differences (empty: nothing more)."""

    improvements: list[Improvement] = field(default_factory=list)
    examples: list[ExamplePaired] = field(default_factory=list)
    profiles: list[Path] = field(default_factory=list)  # PNGs from write_profiles
    words: list[str] = field(default_factory=list)  # words.in_words


_CSS = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px}
table{border-collapse:collapse;margin:1em 0;font-size:0.9em}
td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}
th{background:#f3f3f3}code{font-size:0.9em}img{max-width:100%;margin:0.5em 0}"""


def _table(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def flat_config(run: Run) -> dict[str, Any]:
    """The run's composed config (.hydra/config.yaml) as `{dotted.key: value}`; {} when absent."""
    return run.config


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
            rows.append(
                [
                    g.label,
                    str(r.path),
                    r.status,
                    " ".join(f"{k}={v}" for k, v in r.overrides.items()),
                    str(r.summary.get("git_sha") or "-"),
                    ", ".join(f"{k} {v}" for k, v in versions.items()),
                ]
            )
    return header, rows


def write_profiles(
    out: Path, arms: list[tuple[str, dict[str, list[float]]]], metrics: list[str]
) -> list[Path]:
    """`<metric>_profile.png` for each metric: one step line per arm (label, {metric: one score per
    seed}), the fraction of its seeds scoring above each threshold tau (below it when lower is
    better; many_seeds.performance_profile), tau spanning every arm's scores. A curve lying above
    another everywhere is stochastically better (Agarwal et al. 2021, sec. 4.2)."""
    if not metrics:
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for m in metrics:
        taus = many_seeds.tau_grid([scores[m] for _, scores in arms])
        higher = many_seeds.higher_is_better(m)
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for label, scores in arms:
            ax.step(
                taus,
                many_seeds.performance_profile(scores[m], taus, higher),
                where="post",
                label=f"{label} (n={len(scores[m])})",
            )
        ax.set(
            xlabel=f"threshold τ on {m}",
            ylabel=f"fraction of seeds with {m} {'>' if higher else '<'} τ",
            title=f"{m}: performance profile ({'higher' if higher else 'lower'} is better)",
            ylim=(-0.03, 1.03),
        )
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = out / f"{re.sub(r'[^A-Za-z0-9._-]', '_', m)}_profile.png"
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)
    return written


def _image(path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    return f"<div><img alt='{html.escape(path.stem)}' src='data:image/png;base64,{data}'></div>"


def _verdicts(items: list[Any]) -> list[str]:
    return [
        "<ul>",
        *(f"<li>{html.escape((f'[{d.launch}] ' if d.launch else '') + d.verdict())}</li>" for d in items),
        "</ul>",
    ]


def _many_seeds(many: ManySeeds) -> list[str]:
    """The sections on probability of improvement, performance profiles, per-example differences and
    the summary in words (docs/compare.md has every formula)."""
    parts = []
    if many.improvements:
        parts.append(
            f"<h2>Probability of improvement</h2><p>With ≥ {many_seeds.MANY_SEEDS} seeds in every arm "
            "(Agarwal et al. 2021): P(arm better than its launch's first arm) is the chance that a "
            "random seed of the arm beats a random seed of the first arm (ties count half). Clear when "
            "the exact Mann-Whitney test of P = 0.5 gives p &lt; 0.05 (it assumes only independent "
            "seeds).</p>"
        )
        parts += _verdicts(many.improvements)
    if many.profiles:
        parts.append(
            "<h2>Performance profiles</h2><p>For each threshold τ, the fraction of an arm's seeds "
            "scoring better than τ: a curve above another everywhere is better at every threshold, not "
            "just on average.</p>"
        )
        parts += [_image(p) for p in many.profiles]
    if many.examples:
        parts.append(
            "<h2>Per-example paired differences (eval)</h2><p>On the eval examples both arms scored "
            "(eval_examples.jsonl from <code>ablate eval</code>; an example's score in an arm is its mean "
            "over the arm's runs): mean difference ± t<sub>0.975, n−1</sub> paired standard errors, "
            "sd(d)/√n (Miller 2024); the unpaired SE shows what pairing saves. Clear when the interval "
            "excludes 0.</p>"
        )
        parts += _verdicts(many.examples)
    if many.words:
        parts.append(
            "<h2>In words</h2><p>One verdict per metric and pair of arms: its tests' smallest p-value, "
            "Holm-adjusted over its tests (seed-paired t; Mann-Whitney from 5 seeds; per example) and "
            "Benjamini-Hochberg-adjusted over the metrics ranked, below 0.05 is clear, so two identical arms "
            "are called different in at most 5% of comparisons however many tests and metrics; not clear: "
            "more seeds or examples may tell.</p><ul>"
        )
        parts += [f"<li>{html.escape(w)}</li>" for w in many.words] + ["</ul>"]
    return parts


def write_html(
    out: Path,
    groups: list[Group],
    header: list[str],
    cells: list[list[str]],
    notes: list[str],
    diffs: list[Paired],
    plots: list[Path],
    many: ManySeeds | None = None,
) -> Path:
    """Write `out/report.html` and return its path."""
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>ablate compare</title><style>{_CSS}</style>"
        "</head><body><h1>ablate compare</h1>",
        _table(header, cells),
    ]
    parts += [f"<p>{html.escape(n)}</p>" for n in notes]
    if diffs:
        parts.append(
            f"<h2>Seed-paired differences</h2><p>Each arm minus its launch's first arm, one difference "
            f"per seed both ran; {html.escape(stats.PAIRED_METHOD)}.</p><ul>"
        )
        parts += [
            f"<li>{html.escape((f'[{d.launch}] ' if d.launch else '') + d.verdict())}"
            + (f"<br>{html.escape(d.power_line())}" if d.tellable and d.power_line() else "")
            + "</li>"
            for d in diffs
        ]
        parts.append("</ul>")
    parts += _many_seeds(many or ManySeeds())
    if plots:
        parts.append("<h2>Curves</h2>")
        parts += [_image(p) for p in plots]
    key_header, key_rows = differing_keys(groups)
    parts.append("<h2>Config keys that differ between arms</h2>")
    parts.append(_table(key_header, key_rows) if key_rows else "<p>none (only the seed differs)</p>")
    run_header, runs = run_rows(groups)
    parts += ["<h2>Runs</h2>", _table(run_header, runs), "</body></html>"]
    path = out / "report.html"
    path.write_text("\n".join(parts))
    return path
