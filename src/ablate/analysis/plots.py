"""`ablate compare --out`'s PNG plots: each metric's curves against step, wall-clock or tokens seen (mean
± std band over an arm's seeds), and bars for timings and run-level totals."""

from __future__ import annotations

import re
import statistics
from pathlib import Path
from typing import Any

from ablate.analysis.runs import Group, Run
from ablate.analysis.table import mean_std

# x axes of the curves: `--x step,time,tokens`; the event field each one reads, and its label.
X_AXES = {
    "step": ("step", "step"),
    "time": ("time", "wall-clock (s)"),
    "tokens": ("num_input_tokens_seen", "tokens seen"),
}


def _curve(runs: list[Run], metric: str, x: str) -> tuple[list[float], list[float], list[float]]:
    """Mean and std of `metric` over the runs at each step; x = the step, or the runs' mean
    wall-clock (`time`) or tokens seen (`tokens`) at that step, so seeds stay aligned by step on
    every axis."""
    field_name = X_AXES[x][0]
    values: dict[int, list[float]] = {}
    at: dict[int, list[float]] = {}
    for r in runs:
        for e in r.events:
            if isinstance(e.get(metric), (int, float)) and isinstance(e.get(field_name), (int, float)):
                values.setdefault(e["step"], []).append(float(e[metric]))
                at.setdefault(e["step"], []).append(float(e[field_name]))
    steps = sorted(values)
    xs = [statistics.fmean(at[s]) for s in steps]
    means = [statistics.fmean(values[s]) for s in steps]
    stds = [statistics.stdev(values[s]) if len(values[s]) > 1 else 0.0 for s in steps]
    return xs, means, stds


def safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)


def write_plots(
    out: Path, groups: list[Group], metrics: list[str], x_axes: list[str] | None = None
) -> list[Path]:
    """PNG plots: each metric vs each of `x_axes` (default: step, and for `reward` also wall-clock;
    mean +- std band over seeds, one line per group); each `timing/*` metric as mean seconds per
    group (bars); each `time/*` (GRPO's seconds per step) as curves and bars. An axis no run
    logged (tokens seen, with include_num_input_tokens_seen=no) is skipped."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    written = []
    for metric in metrics:
        wanted = x_axes or ["step"] + (["time"] if metric.split("/")[-1] == "reward" else [])
        for x in wanted:
            xlabel = X_AXES[x][1]
            fig, ax = plt.subplots(figsize=(7, 4.5))
            drawn = False
            for g in groups:
                xs, means, stds = _curve(g.runs, metric, x)
                if not xs:
                    continue
                drawn = True
                (line,) = ax.plot(xs, means, marker="o", markersize=3, label=f"{g.label} (n={len(g.runs)})")
                ax.fill_between(
                    xs,
                    [m - s for m, s in zip(means, stds)],
                    [m + s for m, s in zip(means, stds)],
                    color=line.get_color(),
                    alpha=0.2,
                )
            if drawn:
                ax.set(xlabel=xlabel, ylabel=metric, title=f"{metric} vs {xlabel} (mean ± std over seeds)")
                if x == "step":
                    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
                ax.grid(alpha=0.3)
                ax.legend(fontsize=8)
                path = out / f"{safe(metric)}_vs_{x}.png"
                fig.tight_layout()
                fig.savefig(path, dpi=120)
                written.append(path)
            plt.close(fig)
        logged = any(
            isinstance(e.get(metric), (int, float)) for g in groups for r in g.runs for e in r.events
        )
        if metric.startswith(("timing/", "time/")) or not logged:  # timings, and run-level totals: bars
            written += _bar_plot(plt, out, groups, metric, per_event=logged)
    return written


def _bar_plot(plt: Any, out: Path, groups: list[Group], metric: str, per_event: bool) -> list[Path]:
    """Per group, the mean over seeds of each run's value (`per_event`: the mean over its logged
    events; else its final value, e.g. summary.json's generation_seconds), std as error bar."""
    labels, means, stds = [], [], []
    for g in groups:
        if per_event:
            per_run = [
                statistics.fmean(v)
                for r in g.runs
                if not r.diverged
                and (v := [float(e[metric]) for e in r.events if isinstance(e.get(metric), (int, float))])
            ]
        else:
            per_run = [v for r in g.runs if (v := r.score(metric)) is not None]
        if per_run:
            labels.append(g.label)
            m, s = mean_std(per_run)
            means.append(m)
            stds.append(s or 0.0)
    if not labels:
        return []
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.bar(range(len(labels)), means, yerr=stds, capsize=4)
    ax.set_xticks(range(len(labels)), labels, rotation=20, ha="right", fontsize=8)
    ax.set(ylabel=f"{metric} (mean per log event)" if per_event else metric, title=f"{metric} per group")
    fig.tight_layout()
    path = out / f"{safe(metric)}_by_group.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return [path]
