"""`ablate compare DIR...`: read run and sweep directories, group runs, print a table, draw plots.

Reads the run directory contract only (`summary.json`, `run.json`, `metrics.jsonl`, `eval.json`,
`.hydra/`), so it never imports torch or transformers and works on a laptop over synced outputs, also
on a sweep that is still running (jobs without a final summary show as `running`, a corrupt one as
`unreadable`).

Runs are grouped by the overrides whose values differ between them, ignoring the seed: a 2 losses
x 3 seeds sweep gives two groups of three. Runs from different launches (sweep dirs; a run outside
a sweep is its own launch) are never pooled unless `pool=True` (`--pool`): two launches of the same
seeds would otherwise count every seed twice and understate the spread. The metrics are the method's
`compare_metrics`, each replaced by its held-out namesake (`eval_*`, from `ablate eval`'s eval.json)
when every run has one, or `--metric`'s. Each is shown as the mean over the group's seeds with a 95% t
interval (ablate/analysis/table.py; mean ± std below 3 seeds, where no interval is honest), and arms
that share seeds get seed-paired differences against the launch's first arm, with a verdict in words
and, when not clear, how many seeds would make it clear (ablate/analysis/stats.py). A metric whose
definition differs between two arms (two losses' `loss`) is not ranked between them
(ablate/analysis/comparable.py). From many_seeds.MANY_SEEDS seeds in every arm on, a metric also gets
its IQM and each arm's probability of improvement over the launch's first arm (Agarwal et al. 2021);
runs with per-example eval scores (`ablate eval`'s eval_examples.jsonl) get paired per-example
differences (Miller 2024); then a summary says which differences are clear and which are not
(docs/compare.md).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ablate.analysis import comparable, many_seeds, stats
from ablate.analysis.arms import own_lines, shared_metrics
from ablate.analysis.choose import check_metrics, default_metrics, expand_metrics, prefer_held_out
from ablate.analysis.per_example import ExamplePaired, paired_examples
from ablate.analysis.plots import safe, write_plots
from ablate.analysis.report import DEFAULT_OUT, DEFAULT_OUT_RULE, default_out
from ablate.analysis.runs import Group, Run, by_method, find_runs, launches, method_names, newest_launches
from ablate.analysis.table import (
    CUT_NOTE,
    INTERVAL_NOTE,
    IQM_NOTE,
    display_table,
    print_table,
    table_rows,
    write_tables,
)
from ablate.analysis.words import TITLE as WORDS_TITLE
from ablate.analysis.words import in_words
from ablate.record import rundir

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
        label = ",".join(f"{short[k]}={run.overrides[k]}" for k in varying if k in run.overrides) or (
            "defaults" if varying else "all"
        )
        launch = names.get(run.launch, "") if split else ""  # type: ignore[arg-type]
        group = Group(f"[{launch}] {label}" if launch else label, [], launch, label)
        groups.setdefault((launch, label), group).runs.append(run)
    return list(groups.values())


def _short_names(keys: list[str]) -> dict[str, str]:
    """`method.args.beta` -> `beta`, `method/dpo_loss` -> `dpo_loss` where the last part is unambiguous."""
    last = [re.split(r"[./]", k)[-1] for k in keys]
    return {k: (s if last.count(s) == 1 else k) for k, s in zip(keys, last)}


def _pairs(groups: list[Group]) -> list[tuple[str, Group, Group]]:
    """Within each launch (all runs when pooled), (launch, the launch's first arm, another arm)."""
    by_launch: dict[str, list[Group]] = {}
    for g in groups:
        if any(not r.diverged for r in g.runs):  # an arm whose every run diverged has nothing to compare
            by_launch.setdefault(g.launch, []).append(g)
    return [(launch, arms[0], other) for launch, arms in by_launch.items() for other in arms[1:]]


# (launch, its first arm, another arm, a metric both define alike)
Ranked = list[tuple[str, Group, Group, str]]
# metric -> comparable.differing(...) of each pair left out
Skipped = dict[str, list[dict[str, tuple[str, str]]]]


def ranked_pairs(groups: list[Group], metrics: list[str]) -> tuple[Ranked, Skipped]:
    """Every arm against its launch's first arm on every metric, but a metric whose definition differs
    between the two (comparable.differing), which is left out and said why."""
    ranked: Ranked = []
    skipped: Skipped = {}
    for launch, base, other in _pairs(groups):
        for m in metrics:
            why = comparable.differing(m, base, other)
            if why:
                skipped.setdefault(m, []).append(why)
            else:
                ranked.append((launch, base, other, m))
    return ranked, skipped


def paired_differences(ranked: Ranked) -> list[stats.Paired]:
    """Each ranked (arm, first arm, metric), paired by seed."""
    out = []
    for launch, base, other, m in ranked:
        d = stats.paired(base.arm, base.per_seed(m), other.arm, other.per_seed(m), m)
        d.launch = launch
        out.append(d)
    return out


def many_seed_metrics(groups: list[Group], metrics: list[str]) -> list[str]:
    """The metrics of which every arm has at least MANY_SEEDS seeds: these get the IQM, the probability
    of improvement and a performance profile; the others are shown as before."""
    return [m for m in metrics if groups and all(len(g.per_seed(m)) >= many_seeds.MANY_SEEDS for g in groups)]


def improvements(ranked: Ranked, many: list[str]) -> list[many_seeds.Improvement]:
    """P(arm better than its launch's first arm) per metric in `many`, over their seeds."""
    out = []
    for launch, base, other, m in ranked:
        if m in many:
            i = many_seeds.improvement(base.arm, base.seed_scores(m), other.arm, other.seed_scores(m), m)
            i.launch = launch
            out.append(i)
    return out


def example_differences(groups: list[Group], metrics: list[str]) -> tuple[list[ExamplePaired], Skipped]:
    """Per-example paired differences, every arm minus its launch's first arm, on the examples both
    scored (eval_examples.jsonl), for the compared metrics the files hold (all they share when they
    hold none of them), but those whose definition differs between the two arms."""
    out: list[ExamplePaired] = []
    skipped: Skipped = {}
    wanted = [comparable.bare(m) for m in metrics]
    for launch, base, other in _pairs(groups):
        a, b = _per_example(base), _per_example(other)
        shared = [m for m in a if m in b]
        for m in [m for m in wanted if m in shared] or sorted(shared):
            if why := comparable.differing(m, base, other):
                skipped.setdefault(f"{comparable.HELD_OUT}{m}", []).append(why)  # as the seed-paired one
                continue
            d = paired_examples(base.arm, a[m], other.arm, b[m], m)
            d.launch = launch
            out.append(d)
    return out, skipped


def _per_example(group: Group) -> dict[str, dict[str, list[float]]]:
    """{metric: {example id: [score of each run that scored it]}}."""
    out: dict[str, dict[str, list[float]]] = {}
    for r in group.runs:
        if r.diverged:  # left out, as from every other statistic
            continue
        for example, scores in r.examples.items():
            for m, v in scores.items():
                out.setdefault(m, {}).setdefault(example, []).append(v)
    return out


def compare(
    paths: list[Path],
    metrics: list[str] | None = None,
    out: Path | None = None,
    pool: bool = False,
    xs: list[str] | None = None,
    tags: list[str] | None = None,
    all_launches: bool = False,
    verbose: bool = False,
    outcomes: list[dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """Print the comparison table and seed-paired differences of the runs under `paths` (only those
    carrying every tag in `tags`, from run.json); with `out`, also write plots, tables and a
    self-contained report.html. Returns the table rows (raw numbers); `outcomes` (a list) gets each
    table's runs, cells, differences and verdicts (what `ablate compare --wandb` logs). `verbose`: every
    difference too few seeds can tell on its own line (else one line counts them; report.html lists them).

    A sweep's folder holding several launches gives its newest launch only, unless `all_launches`
    (each launch kept apart) or `pool` (launches pooled); the output says which were left out."""
    if all_launches or pool:
        runs, left_out = find_runs(paths), []
    else:
        runs, left_out = newest_launches(paths)
    if tags:
        runs = [
            r
            for r in runs
            if set(tags) <= set(map(str, (rundir.read_json(r.path / rundir.RUN) or {}).get("tags") or []))
        ]
    if not runs:
        raise FileNotFoundError(
            f"no run directories under {', '.join(map(str, paths))}" + (f" tagged {tags}" if tags else "")
        )
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
    # a folder per method: the top one is ablate's too (a later --out)
    if out is not None and len(families) > 1:
        from ablate.analysis.report import claim_out

        claim_out(out)
    rows = []
    for i, family in enumerate(families):
        where = out / safe(method_names(family)) if out is not None and len(families) > 1 else out
        title = f"{method_names(family)}: " if len(families) > 1 else ""
        if i:
            print()
        rows += _compare_runs(
            family, metrics, where, Options(pool, xs, verbose, outcomes), left_out if i == 0 else [], title
        )
    return rows


@dataclass
class Options:
    """compare()'s switches that reach each family's comparison."""

    pool: bool = False
    xs: list[str] | None = None
    verbose: bool = False
    outcomes: list[dict[str, Any]] | None = None  # each table's outcome is appended (compare --wandb)


def _compare_runs(
    runs: list[Run], asked: list[str] | None, out: Path | None, opts: Options, left_out: list[str], title: str
) -> list[dict[str, Any]]:
    """compare()'s table, notes, differences and files for one family of runs."""
    groups = group_runs(runs, pool=opts.pool)
    chosen, held_note = (asked, "") if asked else prefer_held_out(default_metrics(runs), runs)
    plotted = expand_metrics(chosen, runs)
    # methods logging different metrics: of the defaults the shared ones compared; --metric's as asked (`-`:
    # none)
    metrics, own = shared_metrics(groups, plotted) if not asked else (plotted, {})
    many = many_seed_metrics(groups, metrics)
    rows = table_rows(groups, metrics, many)
    header, cells = display_table(rows, metrics, many)
    ranked, skipped = ranked_pairs(groups, metrics)
    diffs = paired_differences(ranked)
    better = improvements(ranked, many)
    examples, skipped_examples = example_differences(groups, metrics)
    words = in_words(diffs, better, examples) if any(d.tellable for d in diffs) or better or examples else []
    not_ranked = comparable.not_compared_line(
        {**skipped, **skipped_examples}, list(dict.fromkeys(r[3] for r in ranked)), bool(asked)
    )
    notes = (
        [*left_out, launch_note(runs, opts.pool), INTERVAL_NOTE, held_note, diverged_line(groups)]
        + [CUT_NOTE if any(r.get(f"{m} cut") for r in rows for m in metrics) else ""]
        + [r.not_numbers for r in runs]
        + [not_ranked]
        + ([IQM_NOTE] if many else [])
        + own_lines(groups, own)
    )
    print_table(header, cells, title=f"{title}{len(runs)} runs in {len(groups)} groups")
    for note in notes:
        if note:
            print(note)
    print_differences(diffs, better, examples, words, opts.verbose, out is not None)
    if opts.outcomes is not None:
        opts.outcomes.append(
            {
                "runs": [r.path for r in runs],
                "header": header,
                "cells": cells,
                "differences": [d.verdict() for d in [*diffs, *better, *examples]],
                "words": words,
            }
        )
    from ablate.analysis.study import print_studies

    if out is not None:
        from ablate.analysis import report

        report.claim_out(out)  # checked before any run was read (the default dir: in compare)
    # a study's launch (study.db): trials, best trial, plots
    study_plots = print_studies(runs, print_table, out)
    if out is not None:
        from ablate.analysis import report

        out.mkdir(parents=True, exist_ok=True)
        write_tables(out, rows, header, cells)
        # every metric's curves: an arm without it has no line
        plots = write_plots(out, groups, plotted, opts.xs)
        profiles = report.write_profiles(
            out, [(g.label, {m: g.seed_scores(m) for m in many}) for g in groups], many
        )
        for p in plots + profiles + study_plots:
            print(f"wrote {p}")
        html = report.write_html(
            out,
            groups,
            header,
            cells,
            [n for n in notes if n],
            diffs,
            plots,
            many=report.ManySeeds(better, examples, profiles, words),
        )
        print(f"wrote {out / 'summary.md'}, {out / 'summary.csv'} and {html}")
    return rows


def print_differences(
    diffs: list[stats.Paired],
    better: list[many_seeds.Improvement],
    examples: list[ExamplePaired],
    words: list[str],
    verbose: bool,
    report: bool,
) -> None:
    """The seed-paired differences (those too few seeds can tell: one line, unless `verbose`), the
    probabilities of improvement, the per-example differences and the summary in words."""

    def where(d: Any) -> str:
        return f"[{d.launch}] " if d.launch else ""

    untold = [d for d in diffs if not d.tellable]
    folded = not verbose and len(untold) > 1  # one line counts them
    if folded and len(untold) == len(diffs):
        print(f"seed-paired differences: {few_seeds_line(untold, report)}")
    elif diffs:
        print(
            f"seed-paired differences (each arm minus its launch's first arm; {stats.PAIRED_METHOD}; each "
            "test on its own: the summary below adjusts for the several tests and metrics):"
        )
        for d in [d for d in diffs if d.tellable] if folded else diffs:
            print(f"  {where(d)}{d.verdict()}")
            if d.tellable and d.power_line():
                print(f"    {d.power_line()}")
        if folded:
            print(f"  {few_seeds_line(untold, report)}")
    for title, found in ((IMPROVEMENT_TITLE, better), (EXAMPLES_TITLE, examples)):
        if found:
            print(title + ":")
            for d in found:
                print(f"  {where(d)}{d.verdict()}")
    if words:
        print(WORDS_TITLE + ":")
        for line in words:
            print(f"  {line}")


def few_seeds_line(untold: list[stats.Paired], report: bool) -> str:
    """`not enough seeds to tell for 30 differences (1 pair each; a verdict needs 3): ...`, one line."""
    pairs = sorted({d.n for d in untold})
    each = f"{pairs[0]}" if len(pairs) == 1 else f"{pairs[0]}-{pairs[-1]}"
    needed = sorted(max(n, stats.MIN_N) for d in untold if (n := d.seeds_needed()) is not None)
    plan = (
        f"about {needed[0]}"
        + (f"-{needed[-1]}" if needed[-1] != needed[0] else "")
        + " seeds per arm would make "
        f"differences of these sizes clear at {stats.POWER:.0%} power (rough: each spread comes from "
        f"{pairs[-1]} pairs)"
        if needed
        else f"run at least {stats.MIN_N} seeds per arm"
    )
    listed = "--verbose lists each" + ("; so does report.html" if report else "")
    return (
        f"not enough seeds to tell for {len(untold)} differences ({each} pair{'s' if each != '1' else ''} "
        f"each; a verdict needs {stats.MIN_N}): {plan}; {listed}"
    )


IMPROVEMENT_TITLE = (
    f"probability of improvement (Agarwal et al. 2021; ≥ {many_seeds.MANY_SEEDS} seeds per arm), "
    "each arm vs its launch's first arm; exact Mann-Whitney test (assumes independent seeds)"
)
EXAMPLES_TITLE = (
    "per-example paired differences on the eval set (Miller 2024; eval_examples.jsonl), "
    "each arm minus its launch's first arm, mean [95% t interval over the examples]"
)


def diverged_line(groups: list[Group]) -> str:
    """One line naming the runs that diverged (NaN or inf), which the statistics leave out, and the arms
    left with no run to compare; "" when none diverged."""
    gone = [r for g in groups for r in g.runs if r.diverged]
    if not gone:
        return ""
    named = "; ".join(f"{r.path.name} ({r.diverged})" for r in gone)
    empty = [g.label for g in groups if all(r.diverged for r in g.runs)]
    return f"diverged (NaN or inf), left out of the statistics: {named}" + (
        f"; not compared (no run left): {', '.join(empty)}" if empty else ""
    )


def launch_note(runs: list[Run], pool: bool) -> str:
    """Say how launches were treated, when there is more than one."""
    names = launches(runs)
    if len(names) < 2:
        return ""
    if pool:
        return f"pooled {len(names)} launches (--pool): runs with the same overrides count as one arm"
    listed = f" ({', '.join(names.values())})" if len(names) <= 4 else " (each run outside a sweep is one)"
    return (
        f"{len(names)} launches kept apart{listed}; --pool pools runs with the same overrides across launches"
    )
