"""`ablate compare` on a study's sweep dir (hydra/sweeper=optuna, `<sweep dir>/study.db`): the trials
table (best first), the best trial's overrides as a command that reproduces it, and with `--out` the
optimization history and the parameter importances (Optuna's fANOVA evaluator; Hutter et al. 2014)."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ablate.analysis.runs import Run

DB = "study.db"


def study_dirs(runs: list[Run]) -> list[Path]:
    """The launch dirs of `runs` that hold a study, in order."""
    return list(dict.fromkeys(r.path.parent for r in runs if (r.path.parent / DB).is_file()))


def load(sweep_dir: Path) -> Any:
    from ablate.record.studies import require_optuna, storage

    optuna = require_optuna()
    url = f"sqlite:///{(sweep_dir / DB).resolve()}"
    names = optuna.study.get_all_study_names(storage=storage(url))
    return optuna.load_study(study_name=names[0], storage=storage(url))


def trial_rows(study: Any) -> list[list[str]]:
    """One row per trial: number, state (pruned at step N), value, overrides, run dir; best first
    (complete trials by value in the study's direction, then the rest by number)."""
    sign = -1 if study.direction.name == "MAXIMIZE" else 1
    complete = [t for t in study.trials if t.state.name == "COMPLETE" and t.value is not None]
    done = sorted(complete, key=lambda t: sign * t.value)
    rest = [t for t in study.trials if t not in complete]
    rows = []
    for t in done + rest:
        state, value = t.state.name.lower(), "-" if t.value is None else f"{t.value:.6g}"
        if state == "pruned" and t.intermediate_values:  # its value: the last one it reported
            step = max(t.intermediate_values)
            state, value = f"pruned at step {step}", f"{t.intermediate_values[step]:.6g} (step {step})"
        rows.append(
            [
                str(t.number),
                state,
                value,
                str(t.user_attrs.get("overrides", "")),
                Path(str(t.user_attrs.get("run_dir", "-"))).name,
            ]
        )
    return rows


def best_command(study: Any, sweep_dir: Path) -> str | None:
    """`ablate train` with the launch's fixed overrides and the best trial's sampled ones."""
    try:
        best = study.best_trial
    except ValueError:
        return None
    from omegaconf import OmegaConf

    task = (
        list(OmegaConf.load(sweep_dir / "multirun.yaml").hydra.overrides.task)
        if (sweep_dir / "multirun.yaml").is_file()
        else []
    )
    keys = set(study.best_trial.params)
    fixed = [o for o in task if o.split("=", 1)[0].lstrip("+") not in keys and not o.startswith("hydra.")]
    return " ".join(["ablate train", *fixed, str(best.user_attrs.get("overrides", ""))])


def print_studies(runs: list[Run], print_table: Callable[..., None], out: Path | None = None) -> list[Path]:
    """For each study among `runs`' launches: its trials and best trial (`print_table`: compare's);
    the plots with `out`."""
    written: list[Path] = []
    for sweep_dir in study_dirs(runs):
        try:
            study = load(sweep_dir)
        except ValueError as e:  # optuna missing: one line, the rest of compare stands
            print(f"{sweep_dir / DB}: {e}")
            continue
        direction = study.direction.name.lower()
        print_table(
            ["trial", "state", "value", "overrides", "run dir"],
            trial_rows(study),
            title=f"study {study.study_name} ({sweep_dir / DB}): {len(study.trials)} trials, {direction}",
        )
        command = best_command(study, sweep_dir)
        if command:
            print(
                f"best trial {study.best_trial.number} "
                f"({study.best_trial.value:.6g}); reproduce it: {command}"
            )
        if out is not None:
            written += write_plots(out, study)
    return written


def write_plots(out: Path, study: Any) -> list[Path]:
    """history.png (each trial's value and the best so far) and, with >= 2 complete trials, importance.png."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = [
        t
        for t in study.trials
        if t.state.name == "COMPLETE" and t.value is not None and math.isfinite(t.value)
    ]
    if not done:
        return []
    out.mkdir(parents=True, exist_ok=True)
    pick = max if study.direction.name == "MAXIMIZE" else min
    best = [pick(t.value for t in done[: i + 1]) for i in range(len(done))]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([t.number for t in done], [t.value for t in done], "o", label="trial")
    ax.step([t.number for t in done], best, where="post", label="best so far")
    pruned = [t for t in study.trials if t.state.name == "PRUNED" and t.intermediate_values]
    if pruned:  # where each pruned trial stood when it was stopped
        ax.plot(
            [t.number for t in pruned],
            [t.intermediate_values[max(t.intermediate_values)] for t in pruned],
            "x",
            color="grey",
            label="pruned (its last report)",
        )
    ax.set(xlabel="trial", ylabel="objective", title=f"study {study.study_name}: optimization history")
    ax.legend()
    paths = [out / f"study_{study.study_name}_history.png"]
    fig.savefig(paths[0], dpi=100, bbox_inches="tight")
    plt.close(fig)
    if len(done) >= 2:
        from optuna.importance import get_param_importances

        try:
            imp = get_param_importances(study)
        except (RuntimeError, ValueError):  # e.g. every trial had the same parameters
            return paths
        fig, ax = plt.subplots(figsize=(6, 1 + 0.5 * len(imp)))
        ax.barh(list(imp)[::-1], list(imp.values())[::-1])
        ax.set(xlabel="importance (fANOVA)", title=f"study {study.study_name}: parameter importance")
        paths.append(out / f"study_{study.study_name}_importance.png")
        fig.savefig(paths[1], dpi=100, bbox_inches="tight")
        plt.close(fig)
    return paths
