"""Sweeps: sweep files (`sweeps/*.yaml`, the group `sweep`) and the table printed when a multirun ends.

A sweep is a config in Hydra's own format (`# @package _global_`): its fixed values as config, its
swept keys under `hydra.sweeper.params` (Hydra >= 1.2 reads them from there)::

    defaults:
      - override /method: dpo
    sweep_name: dpo_loss           # sweep dir outputs/sweeps/<sweep_name>/<date-time>/, W&B group
    method:
      args:
        beta: 0.1                  # fixed for every job
    hydra:
      sweeper:
        params:                    # swept: one job per combination
          method/dpo_loss: sigmoid,hinge
          seed: 1,2,3

`ablate sweep dpo_loss [overrides]` is `ablate train -m +sweep=dpo_loss [overrides]`; an override
given on the command line replaces the config's value of the same key (`seed=0` shrinks the sweep
to one seed: Hydra's sweeper keeps the last value of a key).

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

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from ablate.analysis.runs import find_runs
from ablate.record import rundir, sweep_dirs

# a job that ended as it should: a study's pruner stopping a trial is no failure
DONE = ("completed", "pruned")
_state: dict[str, Any] = {"sweep_dir": None, "printed": False, "plan": None}


def detached(sweep_dir: Path, job_ids: list[str]) -> None:
    """`--detach`: the jobs were submitted, not run; the end of the multirun says where to look."""
    _state.setdefault("detached", []).extend(job_ids)


def set_plan(actions: dict[str, str]) -> None:
    """A resumed sweep: what this launch does to each job (job number -> skipped / resumed / new),
    shown in the end-of-sweep table."""
    _state["plan"] = actions


def sweep_argv(name: str, cli_overrides: list[str]) -> list[str]:
    """The `ablate train` argv running sweep config `name` with `cli_overrides` on top."""
    inspecting = any(
        a in ("--cfg", "-c", "--info", "-i", "--help", "-h", "--hydra-help") for a in cli_overrides
    )
    # user args after +sweep: Hydra's flags (--cfg job) may take a value, so they must not precede overrides
    return [*([] if inspecting else ["-m"]), f"+sweep={name}", *cli_overrides]


DIRNAME_KEY = "hydra.job.config.override_dirname.exclude_keys"


def exclude_keys_override(task_overrides: list[str], base: list[str]) -> str:
    """The hydra override that names a multirun's job dirs (and W&B runs) by what varies
    (`3_dpo_loss-hinge_seed-2-<hash>`, ablate.config.compose.dirname_suffix): `base` (the config's
    exclude_keys: the sweep's name, tags, notes) plus every command-line override that sweeps nothing,
    the same for every job.
    `task_overrides`: the multirun's command line as Hydra records it (sweep syntax unexpanded)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    fixed = list(base)
    for a in task_overrides:
        override = parser.parse_override(a)
        key = override.key_or_group
        # group choices with a `/` (method/dpo_loss=hinge) stay in the name, as they always have
        if not override.is_sweep_override() and "/" not in key and key not in fixed:
            fixed.append(key)
    return f"{DIRNAME_KEY}=[" + ",".join(fixed) + "]"


class NameJobsByWhatVaries(Callback):
    """Hydra callback (conf/config.yaml `hydra.callbacks`): every multirun's job dirs leave out its
    fixed overrides, whichever entry point launched it (`ablate sweep NAME ...` or `ablate train -m
    +sweep=NAME ...`), so the same command gives the same job dirs and `--resume` finds them. The
    override is added to the multirun's hydra overrides, which Hydra composes into every job's config
    (in this process or a launcher's worker) and records in multirun.yaml."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        hydra_overrides = config.hydra.overrides.hydra
        if any(str(o).startswith("hydra.job.config.override_dirname") for o in hydra_overrides):
            return  # the user's own naming (or a resumed launch's recorded one) wins
        base = list(config.hydra.job.config.override_dirname.exclude_keys)
        hydra_overrides.append(exclude_keys_override(list(config.hydra.overrides.task), base))


def plan_jobs(hydra_argv: list[str]) -> tuple[str, list[tuple[list[str], str]]]:
    """`ablate sweep NAME --dry-run`: the launcher and, per job in Hydra's order, its overrides and
    run dir, composed as a launch composes them (BasicSweeper's expansion of `hydra.sweeper.params`
    with the command line on top, then each job's config from the command line's hydra overrides
    plus its own, as Hydra's `load_sweep_config`), without starting a job or creating a dir."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf, open_dict

    from ablate.config.compose import register_resolvers
    from ablate.launchers.sweep_resume import expand_jobs, fixed_overrides
    from ablate.paths import conf_dir

    register_resolvers()
    parser = OverridesParser.create()
    args = [a for a in hydra_argv if not a.startswith("-")]
    hydra_overrides = [a for a in args if parser.parse_override(a).is_hydra_override()]
    GlobalHydra.instance().clear()
    jobs: list[tuple[list[str], str]] = []
    try:
        with initialize_config_dir(config_dir=conf_dir(), version_base="1.3"):
            if not any(a.startswith("hydra.job.config.override_dirname") for a in hydra_overrides):
                # as NameJobsByWhatVaries adds it to a real launch
                task = [a for a in args if a not in hydra_overrides]
                base = compose(
                    config_name="config",
                    overrides=[*hydra_overrides, *fixed_overrides(task)],
                    return_hydra_config=True,
                )
                hydra_overrides.append(
                    exclude_keys_override(task, list(base.hydra.job.config.override_dirname.exclude_keys))
                )
            for num, overrides in enumerate(expand_jobs(hydra_argv)):
                cfg = compose(
                    config_name="config", overrides=[*hydra_overrides, *overrides], return_hydra_config=True
                )
                with open_dict(cfg):  # as Hydra's launchers number their jobs
                    cfg.hydra.job.id = num
                    cfg.hydra.job.num = num
                # ${hydra:...} in a dir pattern resolves as in a launch
                HydraConfig.instance().set_config(cfg)
                jobs.append((overrides, str(Path(str(cfg.hydra.sweep.dir)) / str(cfg.hydra.sweep.subdir))))
            choice, target = (
                (
                    cfg.hydra.runtime.choices.get("hydra/launcher"),
                    OmegaConf.select(cfg, "hydra.launcher._target_"),
                )
                if jobs
                else ("-", "-")
            )
            launcher = f"{choice} ({target})"
    finally:
        GlobalHydra.instance().clear()  # a later hydra.main initializes it again
    return launcher, jobs


def study_plan(hydra_argv: list[str]) -> str | None:
    """`--dry-run` of a study (hydra/sweeper=optuna): its trials are sampled as it runs, so what it would
    do is its budget, sampler, pruner, objective and search space; None for a grid."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    from ablate.config.compose import register_resolvers
    from ablate.launchers.sweep_resume import fixed_overrides
    from ablate.paths import conf_dir

    register_resolvers()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=conf_dir(), version_base="1.3"):
            cfg = compose(
                config_name="config", overrides=fixed_overrides(hydra_argv), return_hydra_config=True
            )
            sw = cfg.hydra.sweeper
            if not str(sw.get("_target_", "")).endswith("OptunaSweeper"):
                return None
            swept = [a for a in hydra_argv if not a.startswith("-") and a not in fixed_overrides(hydra_argv)]
            space = {**OmegaConf.to_container(sw.params), **dict(a.split("=", 1) for a in swept)}
            sampler, pruner = (
                OmegaConf.select(sw, f"{k}._target_", default="-").split(".")[-1]
                for k in ("sampler", "pruner")
            )
            return "\n".join(
                [
                    f"dry run of study {cfg.sweep_name}: {sw.n_trials} trials, {sw.n_jobs} at a time, "
                    f"{sampler}, {pruner}, {sw.direction} {sw.metric}; nothing started; search space:",
                    *(f"  {k}: {v}" for k, v in space.items()),
                ]
            )
    finally:
        GlobalHydra.instance().clear()


def print_plan(name: str, hydra_argv: list[str]) -> None:
    """Print what `ablate sweep NAME [overrides]` would launch: count, launcher, each job's overrides, dir."""
    from ablate.record.secrets import mask_text

    study = study_plan(hydra_argv)
    if study is not None:
        print(mask_text(study))
        return
    launcher, jobs = plan_jobs(hydra_argv)
    print(f"dry run of sweep {name}: {len(jobs)} job(s), launcher {launcher}; nothing started")
    for num, (overrides, run_dir) in enumerate(jobs):
        print(f"job {num}: {mask_text(' '.join(overrides))} -> {run_dir}")


def job_rows(sweep_dir: Path) -> list[dict[str, Any]]:
    """One row per job dir of a sweep: job, the overrides that vary, status, key metric, run dir, error."""
    rows = []
    # jobs whose dir was not theirs: left as it was, counted as failed
    refused = sweep_dirs.refusals(sweep_dir)
    runs = [r for r in find_runs([sweep_dir]) if str(r.path.resolve()) not in refused]
    # what varies between jobs (the fixed overrides are the same on every row); one job: everything
    keys = {k for r in runs for k in r.overrides} - {"sweep_name", "sweep"}
    varying = [k for k in keys if len(runs) == 1 or len({r.overrides.get(k) for r in runs}) > 1]
    objective = study_metric(sweep_dir)
    for run in runs:
        key = (
            objective
            if objective and run.final(objective) is not None
            else next((m for m in run.default_metrics if run.final(m) is not None), None)
        )
        value = run.final(key) if key else None
        overrides = [f"{k}={v}" for k, v in run.overrides.items() if k in varying]
        rows.append(
            {
                "job": run.path.name.split("_")[0],
                "overrides": " ".join(overrides),
                "status": rundir.state(run.path, run.summary),  # as `ablate ls` and `ablate status` say
                "metric": f"{key}={value:.4g}" if key and value is not None else "-",
                "run_dir": str(run.path),
                "error": str(run.summary.get("error", ""))[:160],
            }
        )
    for path, record in refused.items():
        rows.append(
            {
                "job": Path(path).name.split("_")[0],
                "overrides": " ".join(map(str, record.get("overrides", []))),
                "status": "failed",
                "metric": "-",
                "run_dir": path,
                "error": str(record["error"])[:160],
            }
        )
    return sorted(rows, key=lambda r: (int(r["job"]) if r["job"].isdigit() else 1 << 30, r["run_dir"]))


def study_metric(sweep_dir: Path) -> str | None:
    """A study's objective (hydra/sweeper=optuna: `hydra.sweeper.metric` in multirun.yaml), the key
    metric of its table; None for a grid."""
    from omegaconf import OmegaConf

    if not (sweep_dir / "study.db").is_file() or not (sweep_dir / "multirun.yaml").is_file():
        return None
    return OmegaConf.select(OmegaConf.load(sweep_dir / "multirun.yaml"), "hydra.sweeper.metric", default=None)


def print_summary(sweep_dir: Path) -> int:
    """Print the sweep's job table; returns the number of jobs that did not complete."""
    from rich.console import Console
    from rich.measure import Measurement
    from rich.table import Table

    rows = job_rows(sweep_dir)
    _state["jobs"] = len(rows)
    failed = sum(r["status"] not in DONE for r in rows)
    plan = _state.get("plan")
    pruned = sum(r["status"] == "pruned" for r in rows)
    title = f"sweep {sweep_dir}: {len(rows) - failed}/{len(rows)} jobs completed" + (
        f" ({pruned} pruned)" if pruned else ""
    )
    table = Table(title=title, min_width=len(title))  # a title wider than its table would wrap
    for col in (
        "job",
        "overrides",
        "status",
        *(["this launch"] if plan else []),
        "key metric",
        "run dir",
        "error",
    ):
        # paths are pasted (ablate resume / compare): never folded; long text columns fold instead
        table.add_column(
            col,
            overflow="fold",
            no_wrap=col == "run dir",
            max_width=60 if col in ("overrides", "error") else None,
        )
    for r in rows:
        style = "" if r["status"] in DONE else "red"
        launch = [plan.get(r["job"], "-")] if plan else []
        table.add_row(
            r["job"], r["overrides"], r["status"], *launch, r["metric"], r["run_dir"], r["error"], style=style
        )
    # as wide as the table needs: piped output (no terminal) would otherwise be cut at 80 columns
    console = Console()
    width = Measurement.get(console, console.options.update(max_width=100_000), table).maximum
    Console(width=max(200, width)).print(table)
    print_next_steps(sweep_dir)
    return failed if rows else 1


def print_next_steps(sweep_dir: Path) -> None:
    """Under a finished sweep's table: how to upload its offline W&B runs, how to compare its jobs."""
    if list(sweep_dir.glob("*/wandb/offline-run-*")):
        print(f"W&B (offline): upload every job with `wandb sync {sweep_dir}/*/wandb/offline-run-*`")
    print(f"compare: ablate compare {sweep_dir}")


class SweepSummary(Callback):
    """Hydra callback (conf/config.yaml `hydra.callbacks`): the job table at the end of a multirun."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        from ablate.config.compose import publish_launch_time

        publish_launch_time()  # before any job process starts: they must resolve the same sweep dir
        _state.update(sweep_dir=Path(str(config.hydra.sweep.dir)).resolve(), printed=False, failed=0, jobs=0)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        finish()


def job_count() -> int:
    """Jobs in the table printed at the end of this process's multirun (0: none ran, or none printed)."""
    return int(_state.get("jobs") or 0)


def finish() -> int:
    """Print the table of the multirun this process started (once); returns its failed job count
    (0 when no multirun ran)."""
    if _state["sweep_dir"] is None:
        return 0
    if not _state["printed"] and _state.get("detached"):
        ids = _state["detached"]
        print(
            f"submitted {len(ids)} SLURM jobs ({ids[0].split('_')[0]}_[...]) for sweep "
            f"{_state['sweep_dir']}\nfollow it: ablate status {_state['sweep_dir']}"
        )
        _state.update(printed=True, failed=0)
    if not _state["printed"]:
        _state.update(printed=True, failed=print_summary(_state["sweep_dir"]))
    return int(_state["failed"])
