"""`ablate compare`'s table: one row per arm, each metric's mean over seeds with its 95% t interval
(mean ± std below stats.MIN_N seeds), with many seeds its IQM, then runtime and steps; printed with
rich, written as Markdown and CSV."""

from __future__ import annotations

import csv
import statistics
from pathlib import Path
from typing import Any

from ablate.analysis import many_seeds, stats
from ablate.analysis.runs import Group, Run

INTERVAL_NOTE = (
    f"metrics: mean [{stats.T_METHOD}] (with fewer than {stats.MIN_N} seeds: mean ± std, too few for an "
    "interval); runtime (s): mean ± std over seeds, always"
)
CUT_NOTE = (
    "*: the t interval crossed a bound the metric cannot pass (below 0; above 1 for a rate), so it is cut "
    "there (its coverage stays 95%); an interval that needs cutting says the seeds are too few to place "
    "the mean"
)
IQM_NOTE = (
    f"IQM: interquartile mean over seeds, for metrics every arm has ≥ {many_seeds.MANY_SEEDS} seeds of "
    "(Agarwal et al. 2021; robust to one diverged seed; no interval: none covers 95% at 5-10 seeds, "
    "docs/compare.md)"
)


def mean_std(values: list[float]) -> tuple[float | None, float | None]:
    if not values:
        return None, None
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else None)


def fmt(mean: float | None, std: float | None, ci: tuple[float, float] | None = None) -> str:
    """`mean [lo, hi]` with an interval, else `mean ± std` (2 seeds), else the value."""
    if mean is None:
        return "-"
    if ci is not None:
        return f"{mean:.4g} [{ci[0]:.4g}, {ci[1]:.4g}]"
    return f"{mean:.4g}" + (f" ± {std:.2g}" if std is not None else "")


def status_text(runs: list[Run]) -> str:
    """`2 completed, 1 diverged`: a diverged run (NaN or inf) counts as that, whatever its summary says."""
    counts: dict[str, int] = {}
    for r in runs:
        status = "diverged" if r.diverged else r.status
        counts[status] = counts.get(status, 0) + 1
    return ", ".join(f"{n} {s}" for s, n in counts.items())


def table_rows(
    groups: list[Group], metrics: list[str], many: list[str] | None = None
) -> list[dict[str, Any]]:
    """One row per group: label, runs, status, `<metric>` mean and std, n and the t interval of the mean
    over the arm's runs, runtime, steps; for the metrics in `many` also the IQM over seeds."""
    rows = []
    for g in groups:
        row: dict[str, Any] = {"group": g.label, "runs": len(g.runs), "status": status_text(g.runs)}
        for m in metrics:
            values = [v for r in g.runs if (v := r.score(m)) is not None]
            row[f"{m} mean"], row[f"{m} std"] = mean_std(values)
            ci = stats.t_interval(values)
            row[f"{m} n"] = len(values)
            ci, row[f"{m} cut"] = stats.bounded(ci, m) if ci else (None, False)
            row[f"{m} ci_low"], row[f"{m} ci_high"] = ci if ci else (None, None)
            if m in (many or []):
                row[f"{m} iqm"] = many_seeds.iqm(g.seed_scores(m))
        runtimes = [float(r.summary["train_runtime"]) for r in g.runs if "train_runtime" in r.summary]
        row["runtime_s mean"], row["runtime_s std"] = mean_std(runtimes)
        steps = sorted({r.summary.get("global_step") for r in g.runs} - {None})
        row["steps"] = ",".join(map(str, steps)) or "-"
        rows.append(row)
    return rows


def display_table(
    rows: list[dict[str, Any]], metrics: list[str], many: list[str] | None = None
) -> tuple[list[str], list[list[str]]]:
    """Header and string cells as printed (rich) and written (Markdown); a `<metric> IQM` column
    after each metric in `many`."""
    many = many or []
    header = [
        "group",
        "runs",
        "status",
        *(c for m in metrics for c in ([m, f"{m} IQM"] if m in many else [m])),
        "runtime (s)",
        "steps",
    ]
    cells = [
        [
            r["group"],
            str(r["runs"]),
            r["status"],
            *(
                c
                for m in metrics
                for c in [
                    fmt(r[f"{m} mean"], r[f"{m} std"], _ci(r, m)) + ("*" if r[f"{m} cut"] else "") + _of(r, m)
                ]
                + ([f"{r[f'{m} iqm']:.4g}"] if m in many else [])
            ),
            fmt(r["runtime_s mean"], r["runtime_s std"]),
            r["steps"],
        ]
        for r in rows
    ]
    return header, cells


def _of(row: dict[str, Any], metric: str) -> str:
    """` (2 of 3)` where some of the arm's runs have no value of `metric` (not evaluated, diverged, not
    logged yet): the cell's statistics are over fewer runs than the row counts."""
    n = row.get(f"{metric} n", 0)
    return f" ({n} of {row['runs']})" if 0 < n < row["runs"] else ""


def _ci(row: dict[str, Any], metric: str) -> tuple[float, float] | None:
    lo, hi = row.get(f"{metric} ci_low"), row.get(f"{metric} ci_high")
    return (lo, hi) if lo is not None and hi is not None else None


def print_table(header: list[str], cells: list[list[str]], title: str) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=title)
    for i, h in enumerate(header):
        table.add_column(h, justify="left" if i in (0, 2) else "right", overflow="fold")
    for row in cells:
        table.add_row(*(escape(c) for c in row))  # `[launch] arm` and `[lo, hi]` are text, not markup
    # wide enough for every cell: piped output (no terminal) would otherwise wrap at 80 columns
    widths = [max([len(h)] + [len(row[i]) for row in cells]) for i, h in enumerate(header)]
    Console(width=max(120, sum(w + 3 for w in widths) + 4)).print(table)


def write_tables(out: Path, rows: list[dict[str, Any]], header: list[str], cells: list[list[str]]) -> None:
    """`summary.md` (as printed) and `summary.csv` (raw mean and std columns, for further analysis)."""
    md = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    md += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in cells]
    (out / "summary.md").write_text("\n".join(md) + "\n")
    with (out / "summary.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["group"])
        writer.writeheader()
        writer.writerows(rows)
