"""Which metrics `ablate compare` shows and ranks: the method's `compare_metrics` (its YAML, recorded in
summary.json), each with its held-out namesake (`eval_<m>`, from eval.json or an eval during training),
then what the evaluation backends wrote to eval.json (`lm_eval/<task>/<metric>`, `judge/...`); or
`--metric`'s, checked against what the runs have."""

from __future__ import annotations

import difflib
from pathlib import Path

from ablate.analysis import comparable
from ablate.analysis.runs import Run
from ablate.errors import ConfigError

# `--metric speed`: what every run logs about its speed (ablate/speed/throughput.py); GRPO's time split when
# logged.
SPEED_METRICS = ["tokens_per_second", "mfu"]
GRPO_TIME_METRICS = ["time/generation", "time/scoring", "time/training"]
STDERR = "_stderr"  # lm-eval's standard error of a task metric, beside it in eval.json: not ranked
JUDGED = ("judge/win_rate", "judge/lc_win_rate", "judge/score_diff")  # eval=judge: against the baseline


def default_metrics(runs: list[Run]) -> list[str]:
    """The runs' `compare_metrics` (each method's YAML), in order, without repeats."""
    out: list[str] = []
    for run in runs:
        for m in run.default_metrics:
            if m not in out:
                out.append(m)
    return out


def prefer_held_out(metrics: list[str], runs: list[Run]) -> tuple[list[str], str]:
    """The default metrics, each replaced by its held-out namesake (`eval_<m>`) when every run has it, or
    shown beside it when only some runs do (their cells marked `(k of n)`); then the metrics of the other
    evaluation backends in any run's eval.json. A note says when only some runs were evaluated, or when
    their eval.json files scored different data (then the held-out namesakes are not shown)."""
    evaluated = [r for r in runs if r.held_out]
    if not evaluated:
        return metrics, ""
    scored = sorted(
        {
            f"{e.get('split')} split, {e.get('examples')} examples"
            if (e := r.evaluation)
            else "the eval during training"
            for r in evaluated
        }
    )
    if len(scored) > 1:
        return metrics + backend_metrics(runs), (
            f"held-out metrics not ranked: the runs' eval.json scored different data ({' vs '.join(scored)})"
        )
    out: list[str] = []
    for m in metrics:
        held = f"{comparable.HELD_OUT}{m}"
        have = sum(held in r.held_out for r in runs)
        out += [held] if have == len(runs) else [m, held] if have else [m]
    note = (
        f"held-out metrics (eval.json) in {len(evaluated)} of {len(runs)} runs: shown beside the training "
        "ones, each cell over the runs that have it; `ablate eval RUN_DIR` on the others fills them"
        if len(evaluated) < len(runs)
        else ""
    )
    return out + backend_metrics(runs), note


def backend_metrics(runs: list[Run]) -> list[str]:
    """What evaluation backends other than the method's own wrote to eval.json (`lm_eval/sort/exact_match`,
    `judge/win_rate`), in first-seen order: every lm-eval task metric (not its standard error), and the
    judge's comparisons (JUDGED; its raw scores and lengths, and the baseline's, stay in eval.json)."""
    out: dict[str, None] = {}
    for r in runs:
        for m in r.held_out:
            if (m.startswith("lm_eval/") and STDERR not in m) or m in JUDGED:
                out[m] = None
    return list(out)


def check_metrics(metrics: list[str], runs: list[Run], paths: list[Path]) -> None:
    """A `--metric` no run has (a typo) is refused, naming the ones they do have: a column of `-`
    would read as "not logged yet"."""
    for m in metrics:
        if m != "speed" and all(r.final(m) is None for r in runs):
            known = sorted(
                {
                    k
                    for r in runs
                    for k in [*r.summary.get("metrics", {}), *r.held_out, *(k for e in r.events for k in e)]
                }
                - {"step", "time"}
            )
            hint = difflib.get_close_matches(m, known, n=1)
            meant = f"did you mean --metric {hint[0]}? " if hint else ""
            raise ConfigError(
                f"--metric {m}: no run under {', '.join(map(str, paths))} has it ({meant}metrics: "
                f"{', '.join(known) or 'none logged yet'})"
            )


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
