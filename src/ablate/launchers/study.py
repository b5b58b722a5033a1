"""Studies: what `hydra/sweeper=optuna` (hydra_plugins/ablate_sweepers) needs that is not Hydra.

A study is a sweep file whose `hydra.sweeper.params` is a search space instead of a grid, in Hydra's
own override grammar (the same file format as every sweep):

    hydra:
      sweeper:
        params:
          method.args.beta: tag(log, interval(0.01, 1.0))   # float, log-uniform in [0.01, 1.0]
          optimizer.optimizer.lr: interval(1e-4, 1e-2)    # float, uniform
          method.args.max_steps: tag(int, interval(8, 32))  # int, uniform (both ends included)
          method.args.gradient_accumulation_steps: range(1, 5)  # int in 1..4 (Hydra's range: end excluded)
          method/dpo_loss: sigmoid,hinge                        # categorical (also choice(sigmoid,hinge))
          seed: 1                                           # not a sweep: fixed for every trial

The study lives in `<sweep dir>/study.db` (SQLite through Optuna's RDBStorage: a real database that
a killed driver leaves consistent, readable by optuna-dashboard). Each trial is one ordinary ablate
run; its objective is read from its run dir (summary.json, or metrics.jsonl at a step), so a trial
run by any launcher (in-process, joblib processes, SLURM) is scored the same way.

Optuna is imported only inside functions: this module runs in the launching process, and Hydra
imports the sweeper plugin at every start-up.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ablate.errors import ConfigError
from ablate.record import rundir
from ablate.record.studies import require_optuna

DB = "study.db"


def check_study(sweep_dir: Path) -> None:
    """`<sweep dir>/study.db`, if there, is a whole Optuna database (SQLite's quick_check, read-only):
    a truncated or corrupt one is refused in one line before anything is written (Optuna would fail
    with two tracebacks after the launch had rewritten multirun.yaml)."""
    import sqlite3

    path = Path(sweep_dir) / DB
    if not path.exists():
        return
    try:
        with sqlite3.connect(f"file:{path.resolve()}?mode=ro", uri=True) as db:
            check = db.execute("PRAGMA quick_check").fetchone()[0]
            tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        db.close()
    except sqlite3.Error as e:
        check, tables = str(e), set()
    why = None if check == "ok" else check.splitlines()[0]
    why = why or (None if "studies" in tables else "no Optuna tables in it")
    if why is not None:
        raise ConfigError(
            f"{path} is not a readable Optuna study ({why}); nothing was changed: restore it from a "
            "copy, or start the study again in another hydra.sweep.dir"
        )


def storage_url(sweep_dir: Path) -> str:
    return f"sqlite:///{(Path(sweep_dir) / DB).resolve()}"


def distribution(override: Any) -> Any:
    """The Optuna distribution of one swept override of Hydra's grammar (see the module docstring)."""
    from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep, RangeSweep

    optuna = require_optuna()
    d = optuna.distributions
    value = override.value()
    tags = set(getattr(value, "tags", None) or ())
    if isinstance(value, IntervalSweep):
        if "int" in tags:
            return d.IntDistribution(int(value.start), int(value.end), log="log" in tags)
        return d.FloatDistribution(float(value.start), float(value.end), log="log" in tags)
    if isinstance(value, RangeSweep) and all(
        isinstance(x, int) for x in (value.start, value.stop, value.step or 1)
    ):
        # Hydra's range excludes its end: the last value is the highest the trial may get
        step = value.step or 1
        return d.IntDistribution(
            value.start, value.start + (value.stop - 1 - value.start) // step * step, step=step
        )
    if isinstance(value, (ChoiceSweep, RangeSweep)):
        # the choices as the override grammar writes them: a trial's override is `key=<choice>`
        return d.CategoricalDistribution(list(override.sweep_string_iterator()))
    raise ConfigError(
        f"hydra.sweeper.params: {override.input_line} is not a search space "
        "(interval(a,b), tag(log, interval(a,b)), tag(int, interval(a,b)), range(a,b), a,b,c)"
    )


def search_space(params: dict[str, Any], arguments: list[str]) -> tuple[dict[str, Any], list[str]]:
    """(the search space {key: distribution}, the fixed overrides) of the config's
    `hydra.sweeper.params` with the command line's overrides on top (a key given on both: the
    command line's wins, as with Hydra's BasicSweeper)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    lines = [f"{k}={v}" for k, v in (params or {}).items()]
    parsed = OverridesParser.create().parse_overrides([*lines, *arguments])
    last = {o.get_key_element(): o for o in parsed}  # later wins
    space = {k: distribution(o) for k, o in last.items() if o.is_sweep_override()}
    fixed = [o.input_line for k, o in last.items() if not o.is_sweep_override()]
    if not space:
        raise ConfigError(
            "hydra/sweeper=optuna: hydra.sweeper.params holds no search space (e.g. "
            "optimizer.optimizer.lr: tag(log, interval(1e-4, 1e-2)))"
        )
    return space, fixed


def trial_overrides(params: dict[str, Any]) -> list[str]:
    """A trial's sampled values as overrides (a float in full: the override reproduces the trial)."""
    return [f"{k}={v!r}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items()]


def objective(run_dir: Path, metric: str, step: int | None = None) -> float | None:
    """The trial's score: `metric` from its summary.json (the last logged value), or the last value
    logged at or before `step` in metrics.jsonl; None when the run never logged it."""
    if step is None:
        value = ((rundir.read_json(run_dir / rundir.SUMMARY) or {}).get("metrics") or {}).get(metric)
        if value is None:  # e.g. an eval metric logged only mid-run and dropped from the final ones
            step = 1 << 62
        else:
            return float(value)
    events = [e for e in rundir.read_metrics(run_dir) if metric in e and e.get("step", 0) <= step]
    return float(events[-1][metric]) if events else None
