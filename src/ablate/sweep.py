"""Sweeps: sweep files (`sweeps/*.yaml`) and the table printed when a multirun ends.

A sweep file is Hydra sweeper params plus fixed overrides::

    name: dpo_loss                 # sweep dir outputs/sweeps/<name>/<date-time>/, W&B group
    params:                        # swept: one job per combination (Hydra sweep syntax)
      method/loss: sigmoid,hinge
      seed: 1,2,3
    overrides:                     # fixed for every job
      method.args.max_steps: 60

`ablate sweep FILE [overrides]` turns it into `ablate train -m sweep_name=<name> k=v ...`; an
override given on the command line replaces the file's value of the same key (`seed=0` shrinks
the sweep to one seed).

Failing jobs: Hydra's launchers run every job of a batch even when one raises, but the sweeper then
re-raises the first failure, so `on_multirun_end` is skipped. `SweepSummary` therefore remembers the
sweep dir when the multirun starts, prints at `on_multirun_end`, and `ablate.cli` calls `finish()`
after Hydra returns or raises, which prints the table if that has not happened yet and tells the
CLI whether to exit non-zero. The table is built from the job dirs' summary.json files, so it is
the same whichever launcher ran the jobs (in-process, joblib processes, SLURM).

No torch import here: this module runs in the launching process.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from ablate import compare

_state: dict[str, Any] = {"sweep_dir": None, "printed": False}


def _value(v: Any) -> str:
    """A YAML value as Hydra override syntax."""
    if isinstance(v, bool):
        return str(v).lower()
    if v is None:
        return "null"
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(_value(x) for x in v) + "]"
    return str(v)


def load_sweep(path: Path) -> tuple[str, dict[str, str]]:
    """`(name, {key: value})` of a sweep file: its fixed overrides, then its params (sweeps)."""
    spec = yaml.safe_load(Path(path).read_text()) or {}
    unknown = set(spec) - {"name", "params", "overrides"}
    if unknown:
        raise ValueError(f"{path}: unknown sweep file key(s) {sorted(unknown)}; expected name, params, overrides")
    merged = {str(k): _value(v) for k, v in (spec.get("overrides") or {}).items()}
    merged.update({str(k): _value(v) for k, v in (spec.get("params") or {}).items()})
    return str(spec.get("name") or Path(path).stem), merged


def sweep_argv(path: Path, cli_overrides: list[str]) -> list[str]:
    """The `ablate train` argv running sweep file `path` with `cli_overrides` on top."""
    name, merged = load_sweep(path)
    items = {"sweep_name": f"sweep_name={name}"}
    items.update({k: f"{k}={v}" for k, v in merged.items()})
    user_keys = {compare.override_key(o) for o in cli_overrides if "=" in o and not o.startswith("-")}
    kept = [o for k, o in items.items() if k not in user_keys]  # same key: the command line wins
    inspecting = any(a in ("--cfg", "-c", "--info", "-i", "--help", "-h", "--hydra-help") for a in cli_overrides)
    # user args first: Hydra's flags (--cfg job) may take a value, so they must not precede overrides
    argv = [*cli_overrides, *kept]
    if not any(a.startswith("hydra.job.config.override_dirname") for a in argv):
        argv.append(_name_jobs_by_swept_keys(argv))
    return [*([] if inspecting else ["-m"]), *argv]


def _name_jobs_by_swept_keys(argv: list[str]) -> str:
    """Job dirs and W&B names show only what varies (`3_method_loss=hinge,seed=2`): the
    fixed overrides, the same for every job, are excluded from Hydra's override_dirname."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    fixed: list[str] = []
    for a in argv:
        if "=" in a and not a.startswith("-") and not a.startswith("hydra"):
            override = parser.parse_override(a)
            if not override.is_sweep_override() and "/" not in override.key_or_group and override.key_or_group not in fixed:
                fixed.append(override.key_or_group)
    return "hydra.job.config.override_dirname.exclude_keys=[" + ",".join(fixed) + "]"


def job_rows(sweep_dir: Path) -> list[dict[str, Any]]:
    """One row per job dir of a sweep: job, overrides (those that vary), status, key metric, run dir, error."""
    rows = []
    runs = compare.find_runs([sweep_dir])
    # what varies between jobs (the fixed overrides are the same on every row); one job: everything
    keys = {k for r in runs for k in r.overrides} - {"sweep_name"}
    varying = [k for k in keys if len(runs) == 1 or len({r.overrides.get(k) for r in runs}) > 1]
    for run in runs:
        key = next((m for m in run.default_metrics if run.final(m) is not None), None)
        value = run.final(key) if key else None
        overrides = [f"{k}={v}" for k, v in run.overrides.items() if k in varying]
        rows.append({"job": run.path.name.split("_")[0], "overrides": " ".join(overrides), "status": run.status,
                     "metric": f"{key}={value:.4g}" if key and value is not None else "-",
                     "run_dir": str(run.path), "error": str(run.summary.get("error", ""))[:160]})
    return rows


def print_summary(sweep_dir: Path) -> int:
    """Print the sweep's job table; returns the number of jobs that did not complete."""
    from rich.console import Console
    from rich.measure import Measurement
    from rich.table import Table

    rows = job_rows(sweep_dir)
    failed = sum(r["status"] != "completed" for r in rows)
    title = f"sweep {sweep_dir}: {len(rows) - failed}/{len(rows)} jobs completed"
    table = Table(title=title, min_width=len(title))  # a title wider than its table would wrap
    for col in ("job", "overrides", "status", "key metric", "run dir", "error"):
        # paths are pasted (ablate resume / compare): never folded; long text columns fold instead
        table.add_column(col, overflow="fold", no_wrap=col == "run dir",
                         max_width=60 if col in ("overrides", "error") else None)
    for r in rows:
        style = "" if r["status"] == "completed" else "red"
        table.add_row(r["job"], r["overrides"], r["status"], r["metric"], r["run_dir"], r["error"], style=style)
    # as wide as the table needs: piped output (no terminal) would otherwise be cut at 80 columns
    console = Console()
    width = Measurement.get(console, console.options.update(max_width=100_000), table).maximum
    Console(width=max(200, width)).print(table)
    if list(sweep_dir.glob("*/wandb/offline-run-*")):
        print(f"W&B (offline): upload every job with `wandb sync {sweep_dir}/*/wandb/offline-run-*`")
    print(f"compare: ablate compare {sweep_dir}")
    return failed if rows else 1


class SweepSummary(Callback):
    """Hydra callback (conf/config.yaml `hydra.callbacks`): the job table at the end of a multirun."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        _state.update(sweep_dir=Path(str(config.hydra.sweep.dir)).resolve(), printed=False, failed=0)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        finish()


def finish() -> int:
    """Print the table of the multirun this process started (once); returns its failed job count
    (0 when no multirun ran)."""
    if _state["sweep_dir"] is None:
        return 0
    if not _state["printed"]:
        _state.update(printed=True, failed=print_summary(_state["sweep_dir"]))
    return int(_state["failed"])
