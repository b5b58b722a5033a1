"""`ablate compare DIR...`: read run and sweep directories, group runs, print a table, draw plots.

Reads the run directory contract only (`summary.json`, `run.json`, `metrics.jsonl`, `.hydra/`), so
it never imports torch or transformers and works on a laptop over synced outputs, also on a sweep
that is still running (jobs without a final summary show as `running`, a corrupt one as `unreadable`).

Runs are grouped by the overrides whose values differ between them, ignoring the seed: a 2 losses
x 3 seeds sweep gives two groups of three. Runs from different launches (sweep dirs; a run outside
a sweep is its own launch) are never pooled unless `pool=True` (`--pool`): two launches of the same
seeds would otherwise count every seed twice and understate the spread. Each final metric is shown
as the mean over the group's seeds with a 95% bootstrap interval (ablate/analysis/stats.py; mean ± std below
3 seeds, where no interval is honest), and arms that share seeds get seed-paired differences
against the launch's first arm, with a verdict in words. From stats.MANY_SEEDS seeds in every arm on,
a metric also gets its IQM with a stratified bootstrap interval and each arm's probability of
improvement over the launch's first arm (Agarwal et al. 2021); runs with per-example eval scores
(`ablate eval`'s eval_examples.jsonl) get paired per-example differences (Miller 2024); then a
summary says which differences are clear and which are not (docs/compare.md).
"""

from __future__ import annotations

import csv
import difflib
import re
import statistics
from pathlib import Path
from typing import Any

from ablate.analysis import stats
from ablate.analysis.arms import own_lines, shared_metrics
from ablate.analysis.report import DEFAULT_OUT, DEFAULT_OUT_RULE, default_out
from ablate.analysis.runs import Group, Run, by_method, find_runs, launches, method_names, newest_launches
from ablate.errors import ConfigError
from ablate.run import rundir

# `--metric speed`: what every run logs about its speed (ablate/speed/throughput.py); GRPO's time split when logged.
SPEED_METRICS = ["tokens_per_second", "mfu"]
GRPO_TIME_METRICS = ["time/generation", "time/scoring", "time/training"]
# Overrides that never define a group: seeds are what a group averages over; the rest is bookkeeping.
IGNORED_KEYS = {"seed", "sweep_name", "sweep", "tags", "notes"}


def group_runs(runs: list[Run], pool: bool = False) -> list[Group]:
    """Group by the overrides that differ between runs (seed ignored), and by launch unless `pool`;
    groups in first-seen order."""
    keys = sorted({k for r in runs for k in r.overrides} - IGNORED_KEYS)
    varying = [k for k in keys if len({r.overrides.get(k) for r in runs}) > 1]
    short = _short_names(varying)
    names = launches(runs)
    split = not pool and len(names) > 1
    groups: dict[tuple[str, str], Group] = {}
    for run in runs:
        # the varying keys this run set; one it did not set has the config's value (`defaults`: none set)
        label = ",".join(f"{short[k]}={run.overrides[k]}" for k in varying if k in run.overrides) \
            or ("defaults" if varying else "all")
        launch = names.get(run.launch, "") if split else ""  # type: ignore[arg-type]
        group = Group(f"[{launch}] {label}" if launch else label, [], launch, label)
        groups.setdefault((launch, label), group).runs.append(run)
    return list(groups.values())


def _short_names(keys: list[str]) -> dict[str, str]:
    """`method.args.beta` -> `beta`, `method/loss` -> `loss` where the last part is unambiguous."""
    last = [re.split(r"[./]", k)[-1] for k in keys]
    return {k: (s if last.count(s) == 1 else k) for k, s in zip(keys, last)}


def default_metrics(runs: list[Run]) -> list[str]:
    """The runs' `compare_metrics` (each method's YAML), in order, without repeats."""
    out: list[str] = []
    for run in runs:
        for m in run.default_metrics:
            if m not in out:
                out.append(m)
    return out


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
    counts: dict[str, int] = {}
    for r in runs:
        counts[r.status] = counts.get(r.status, 0) + 1
    return ", ".join(f"{n} {s}" for s, n in counts.items())


def table_rows(groups: list[Group], metrics: list[str], many: list[str] | None = None) -> list[dict[str, Any]]:
    """One row per group: label, runs, status, `<metric>` mean and std, runtime, steps; for the
    metrics in `many` (many_seed_metrics) also the IQM over seeds and its interval."""
    rows = []
    for g in groups:
        row: dict[str, Any] = {"group": g.label, "runs": len(g.runs), "status": status_text(g.runs)}
        for m in metrics:
            values = [v for r in g.runs if (v := r.final(m)) is not None]
            row[f"{m} mean"], row[f"{m} std"] = mean_std(values)
            ci = stats.bootstrap_ci(values)
            row[f"{m} n"] = len(values)
            row[f"{m} ci_low"], row[f"{m} ci_high"] = ci if ci else (None, None)
            if m in (many or []):
                scores = seed_scores(g, m)
                row[f"{m} iqm"] = stats.iqm(scores)
                row[f"{m} iqm_low"], row[f"{m} iqm_high"] = stats.iqm_ci(scores) or (None, None)
        runtimes = [float(r.summary["train_runtime"]) for r in g.runs if "train_runtime" in r.summary]
        row["runtime_s mean"], row["runtime_s std"] = mean_std(runtimes)
        steps = sorted({r.summary.get("global_step") for r in g.runs} - {None})
        row["steps"] = ",".join(map(str, steps)) or "-"
        rows.append(row)
    return rows


def display_table(rows: list[dict[str, Any]], metrics: list[str],
                  many: list[str] | None = None) -> tuple[list[str], list[list[str]]]:
    """Header and string cells as printed (rich) and written (Markdown); a `<metric> IQM` column
    after each metric in `many`."""
    many = many or []
    header = ["group", "runs", "status", *(c for m in metrics for c in ([m, f"{m} IQM"] if m in many else [m])),
              "runtime (s)", "steps"]
    cells = [[r["group"], str(r["runs"]), r["status"],
              *(c for m in metrics for c in [fmt(r[f"{m} mean"], r[f"{m} std"], _ci(r, m))]
                + ([_iqm_cell(r, m)] if m in many else [])),
              fmt(r["runtime_s mean"], r["runtime_s std"]), r["steps"]] for r in rows]
    return header, cells


def _iqm_cell(row: dict[str, Any], metric: str) -> str:
    lo, hi = row[f"{metric} iqm_low"], row[f"{metric} iqm_high"]
    return f"{row[f'{metric} iqm']:.4g}" + (f" [{lo:.4g}, {hi:.4g}]" if lo is not None else "")


def _ci(row: dict[str, Any], metric: str) -> tuple[float, float] | None:
    lo, hi = row.get(f"{metric} ci_low"), row.get(f"{metric} ci_high")
    return (lo, hi) if lo is not None and hi is not None else None


def _pairs(groups: list[Group]) -> list[tuple[str, Group, Group]]:
    """Within each launch (all runs when pooled), (launch, the launch's first arm, another arm)."""
    by_launch: dict[str, list[Group]] = {}
    for g in groups:
        by_launch.setdefault(g.launch, []).append(g)
    return [(launch, arms[0], other) for launch, arms in by_launch.items() for other in arms[1:]]


def paired_differences(groups: list[Group], metrics: list[str]) -> list[stats.Paired]:
    """Within each launch (all runs when pooled), every arm minus the launch's first arm, per metric,
    paired by seed."""
    out = []
    for launch, base, other in _pairs(groups):
        for m in metrics:
            d = stats.paired(base.arm, _per_seed(base, m), other.arm, _per_seed(other, m), m)
            d.launch = launch
            out.append(d)
    return out


def seed_scores(group: Group, metric: str) -> list[float]:
    """One value per seed (a seed two pooled launches both ran counts once, with its mean): what the
    many-seed statistics resample, so a pooled arm never counts a seed twice."""
    return [statistics.fmean(v) for v in _per_seed(group, metric).values()]


def many_seed_metrics(groups: list[Group], metrics: list[str]) -> list[str]:
    """The metrics of which every arm has at least stats.MANY_SEEDS seeds: these get the IQM, the
    probability of improvement and a performance profile; the others are shown as before."""
    return [m for m in metrics if groups and all(len(_per_seed(g, m)) >= stats.MANY_SEEDS for g in groups)]


def improvements(groups: list[Group], many: list[str]) -> list[stats.Improvement]:
    """P(arm better than its launch's first arm) per metric in `many`, over their seeds."""
    out = []
    for launch, base, other in _pairs(groups):
        for m in many:
            i = stats.improvement(base.arm, seed_scores(base, m), other.arm, seed_scores(other, m), m)
            i.launch = launch
            out.append(i)
    return out


def example_differences(groups: list[Group], metrics: list[str]) -> list[stats.ExamplePaired]:
    """Per-example paired differences, every arm minus its launch's first arm, on the examples both
    scored (eval_examples.jsonl), for the compared metrics the files hold (all they share when they
    hold none of them)."""
    out = []
    for launch, base, other in _pairs(groups):
        a, b = _per_example(base), _per_example(other)
        shared = [m for m in a if m in b]
        for m in [m for m in metrics if m in shared] or sorted(shared):
            d = stats.paired_examples(base.arm, a[m], other.arm, b[m], m)
            d.launch = launch
            out.append(d)
    return out


def _per_example(group: Group) -> dict[str, dict[str, list[float]]]:
    """{metric: {example id: [score of each run that scored it]}}."""
    out: dict[str, dict[str, list[float]]] = {}
    for r in group.runs:
        for example, scores in r.examples.items():
            for m, v in scores.items():
                out.setdefault(m, {}).setdefault(example, []).append(v)
    return out


def _per_seed(group: Group, metric: str) -> dict[str, list[float]]:
    values: dict[str, list[float]] = {}
    for r in group.runs:
        if (v := r.final(metric)) is not None:
            values.setdefault(r.seed, []).append(v)
    return values


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


# x axes of the curves: `--x step,time,tokens`; the event field each one reads, and its label.
X_AXES = {"step": ("step", "step"), "time": ("time", "wall-clock (s)"),
          "tokens": ("num_input_tokens_seen", "tokens seen")}


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


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)


def write_plots(out: Path, groups: list[Group], metrics: list[str], x_axes: list[str] | None = None) -> list[Path]:
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
                line, = ax.plot(xs, means, marker="o", markersize=3, label=f"{g.label} (n={len(g.runs)})")
                ax.fill_between(xs, [m - s for m, s in zip(means, stds)], [m + s for m, s in zip(means, stds)],
                                color=line.get_color(), alpha=0.2)
            if drawn:
                ax.set(xlabel=xlabel, ylabel=metric, title=f"{metric} vs {xlabel} (mean ± std over seeds)")
                if x == "step":
                    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
                ax.grid(alpha=0.3)
                ax.legend(fontsize=8)
                path = out / f"{_safe(metric)}_vs_{x}.png"
                fig.tight_layout()
                fig.savefig(path, dpi=120)
                written.append(path)
            plt.close(fig)
        logged = any(isinstance(e.get(metric), (int, float)) for g in groups for r in g.runs for e in r.events)
        if metric.startswith(("timing/", "time/")) or not logged:  # timings, and run-level totals: bars
            written += _bar_plot(plt, out, groups, metric, per_event=logged)
    return written


def _bar_plot(plt: Any, out: Path, groups: list[Group], metric: str, per_event: bool) -> list[Path]:
    """Per group, the mean over seeds of each run's value (`per_event`: the mean over its logged
    events; else its final value, e.g. summary.json's generation_seconds), std as error bar."""
    labels, means, stds = [], [], []
    for g in groups:
        if per_event:
            per_run = [statistics.fmean(v) for r in g.runs
                       if (v := [float(e[metric]) for e in r.events if isinstance(e.get(metric), (int, float))])]
        else:
            per_run = [v for r in g.runs if (v := r.final(metric)) is not None]
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
    path = out / f"{_safe(metric)}_by_group.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return [path]


def compare(paths: list[Path], metrics: list[str] | None = None, out: Path | None = None, pool: bool = False,
            xs: list[str] | None = None, tags: list[str] | None = None,
            all_launches: bool = False) -> list[dict[str, Any]]:
    """Print the comparison table and seed-paired differences of the runs under `paths` (only those
    carrying every tag in `tags`, from run.json); with `out`, also write plots, tables and a
    self-contained report.html. Returns the table rows (raw numbers).

    A sweep's folder holding several launches gives its newest launch only, unless `all_launches`
    (each launch kept apart) or `pool` (launches pooled); the output says which were left out."""
    if all_launches or pool:
        runs, left_out = find_runs(paths), []
    else:
        runs, left_out = newest_launches(paths)
    if tags:
        runs = [r for r in runs if set(tags) <= set(map(str, (rundir.read_json(r.path / rundir.RUN) or {}).get("tags") or []))]
    if not runs:
        raise FileNotFoundError(f"no run directories under {', '.join(map(str, paths))}" + (f" tagged {tags}" if tags else ""))
    if metrics:
        check_metrics(metrics, runs, paths)
    if out == DEFAULT_OUT:
        out = default_out(runs, paths)
        from ablate.analysis.report import check_out

        check_out(out)  # a launch's report/ of the user's own is not written over either
        print(f"report dir: {out} (--out without a dir: {DEFAULT_OUT_RULE})")
    # one sweep comparing methods on purpose (preference_methods, grpo_vs_rloo): one table, the shared
    # metrics side by side; runs gathered from several launches: a table per method family
    families = [runs] if metrics or len(launches(runs)) == 1 else by_method(runs)
    if out is not None and len(families) > 1:  # a folder per method: the top one is ablate's too (a later --out)
        from ablate.analysis.report import claim_out

        claim_out(out)
    rows = []
    for i, family in enumerate(families):
        where = out / _safe(method_names(family)) if out is not None and len(families) > 1 else out
        title = f"{method_names(family)}: " if len(families) > 1 else ""
        if i:
            print()
        rows += _compare_runs(family, metrics, where, pool, xs, left_out if i == 0 else [], title)
    return rows


def _compare_runs(runs: list[Run], metrics: list[str] | None, out: Path | None, pool: bool, xs: list[str] | None,
                  left_out: list[str], title: str) -> list[dict[str, Any]]:
    """compare()'s table, notes, differences and files for one family of runs."""
    groups = group_runs(runs, pool=pool)
    plotted = expand_metrics(metrics or default_metrics(runs), runs)
    # methods logging different metrics: of the defaults the shared ones compared; --metric's as asked (`-`: none)
    metrics, own = shared_metrics(groups, plotted) if not metrics else (plotted, {})
    many = many_seed_metrics(groups, metrics)
    rows = table_rows(groups, metrics, many)
    header, cells = display_table(rows, metrics, many)
    notes = [*left_out, launch_note(runs, pool), INTERVAL_NOTE] + ([IQM_NOTE] if many else []) + own_lines(groups, own, metrics)
    print_table(header, cells, title=f"{title}{len(runs)} runs in {len(groups)} groups")
    for note in notes:
        if note:
            print(note)
    diffs = paired_differences(groups, metrics)
    if diffs:
        print("seed-paired differences (each arm minus its launch's first arm):")
        for d in diffs:
            print(f"  [{d.launch}] {d.verdict()}" if d.launch else f"  {d.verdict()}")
    better = improvements(groups, many)
    examples = example_differences(groups, metrics)
    words = stats.in_words(diffs, better, examples) if better or examples else []
    for title, found in ((IMPROVEMENT_TITLE, better), (EXAMPLES_TITLE, examples)):
        if found:
            print(title + ":")
            for d in found:
                print(f"  [{d.launch}] {d.verdict()}" if d.launch else f"  {d.verdict()}")
    if words:
        print(WORDS_TITLE + ":")
        for line in words:
            print(f"  {line}")
    from ablate.analysis.study import print_studies

    if out is not None:
        from ablate.analysis import report

        report.claim_out(out)  # checked before any run was read (the default dir: in compare)
    study_plots = print_studies(runs, print_table, out)  # a study's launch (study.db): trials, best trial, plots
    if out is not None:
        from ablate.analysis import report

        out.mkdir(parents=True, exist_ok=True)
        write_tables(out, rows, header, cells)
        plots = write_plots(out, groups, plotted, xs)  # every metric's curves: an arm without it has no line
        profiles = report.write_profiles(out, [(g.label, {m: seed_scores(g, m) for m in many}) for g in groups], many)
        for p in plots + profiles + study_plots:
            print(f"wrote {p}")
        html = report.write_html(out, groups, header, cells, [n for n in notes if n], diffs, plots,
                                 many=report.ManySeeds(better, examples, profiles, words))
        print(f"wrote {out / 'summary.md'}, {out / 'summary.csv'} and {html}")
    return rows


def check_metrics(metrics: list[str], runs: list[Run], paths: list[Path]) -> None:
    """A `--metric` no run has (a typo) is refused, naming the ones they do have: a column of `-`
    would read as "not logged yet"."""
    for m in metrics:
        if m != "speed" and all(r.final(m) is None for r in runs):
            known = sorted({k for r in runs for k in [*r.summary.get("metrics", {}), *(k for e in r.events for k in e)]}
                           - {"step", "time"})
            hint = difflib.get_close_matches(m, known, n=1)
            meant = f"did you mean --metric {hint[0]}? " if hint else ""
            raise ConfigError(f"--metric {m}: no run under {', '.join(map(str, paths))} has it ({meant}metrics: "
                              f"{', '.join(known) or 'none logged yet'})")


def expand_metrics(metrics: list[str], runs: list[Run]) -> list[str]:
    """`speed` stands for tokens/s and MFU (each run's mean over its training steps, from summary.json;
    per log window in the curves), plus GRPO's time per step in generation, scoring and training."""
    out: list[str] = []
    for m in metrics:
        if m != "speed":
            out.append(m)
            continue
        logged = {k for r in runs for e in r.events for k in e}
        out += SPEED_METRICS + [t for t in GRPO_TIME_METRICS if t in logged]
    return list(dict.fromkeys(out))


INTERVAL_NOTE = (f"metrics: mean [95% bootstrap interval over seeds] (with fewer than {stats.MIN_N} seeds: mean ± std, "
                 "too few for an interval); runtime (s): mean ± std over seeds, always")


IQM_NOTE = (f"IQM: interquartile mean over seeds [95% stratified bootstrap interval], for metrics every arm "
            f"has ≥ {stats.MANY_SEEDS} seeds of (Agarwal et al. 2021)")
IMPROVEMENT_TITLE = (f"probability of improvement (Agarwal et al. 2021; ≥ {stats.MANY_SEEDS} seeds per arm), "
                     "each arm vs its launch's first arm")
WORDS_TITLE = "in words (clear: the 95% interval excludes no difference, 0 or a probability of 0.5)"
EXAMPLES_TITLE = ("per-example paired differences on the eval set (Miller 2024; eval_examples.jsonl), "
                  "each arm minus its launch's first arm, mean [± 1.96 SE]")


def launch_note(runs: list[Run], pool: bool) -> str:
    """Say how launches were treated, when there is more than one."""
    names = launches(runs)
    if len(names) < 2:
        return ""
    if pool:
        return f"pooled {len(names)} launches (--pool): runs with the same overrides count as one arm"
    listed = f" ({', '.join(names.values())})" if len(names) <= 4 else " (each run outside a sweep is one)"
    return (f"{len(names)} launches kept apart{listed}; "
            "--pool pools runs with the same overrides across launches")
