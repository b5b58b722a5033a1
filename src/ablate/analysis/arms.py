"""Arms of different methods in one comparison (`ablate compare` on sweeps/preference_methods.yaml: DPO,
KTO and a reward model): each logs its method's metrics (TRL's names), so a metric may exist in some arms
only. The ones every arm has are compared as usual (table, paired differences, verdicts); the others are
listed per arm with their values, apart, since there is nothing to compare them with. A metric every arm
logs but each method defines its own way (`loss`) is in the table and not ranked
(ablate.analysis.comparable)."""

from __future__ import annotations

import statistics

from ablate.analysis.runs import Group


def shared_metrics(groups: list[Group], metrics: list[str]) -> tuple[list[str], dict[str, list[str]]]:
    """Arms of different methods log different metrics (DPO's rewards/accuracies, a reward model's
    accuracy, KTO's kl): the metrics every method logs are compared (table, differences); the others are
    some arms' own, {metric: the arms that have it}, listed apart (`own_lines`). Judged per method (each
    run's summary.json), so an arm that failed or has not logged yet keeps its method's columns, as `-`;
    runs of one method (or of unknown ones) share every metric, as before."""
    logged: dict[str, set[str]] = {}  # method -> the metrics any of its runs has
    for g in groups:
        for r in g.runs:
            method = r.summary.get("method")
            if method is not None:
                logged.setdefault(method, set()).update(m for m in metrics if r.score(m) is not None)
    methods = [have for have in logged.values() if have]
    shared = [m for m in metrics if len(methods) < 2 or all(m in have for have in methods)]
    own = {
        m: [g.label for g in groups if any(r.score(m) is not None for r in g.runs)]
        for m in metrics
        if m not in shared
    }
    return shared, {m: arms for m, arms in own.items() if arms}


def own_lines(groups: list[Group], own: dict[str, list[str]]) -> list[str]:
    """The metrics only some arms log, per arm with their values (not compared: the others have none)."""
    if not own:
        return []
    lines = ["not every arm logs these (listed, not compared):"]
    for g in groups:
        values = [
            f"{m} {_mean_std([v for r in g.runs if (v := r.score(m)) is not None])}"
            for m, arms in own.items()
            if g.label in arms
        ]
        if values:
            lines.append(f"  {g.label}: {', '.join(values)}")
    return lines


def _mean_std(values: list[float]) -> str:
    """`mean ± std` over seeds (the value for one seed)."""
    if len(values) < 2:
        return f"{values[0]:.4g}"
    return f"{statistics.fmean(values):.4g} ± {statistics.stdev(values):.2g}"
