"""Run directories as the analysis sees them: `Run` (summary, overrides, metrics, launch), finding
the runs under a folder, grouping them, and the one-line rows of `ablate ls`.

Reads the run directory contract only: imports neither torch nor transformers.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from ablate.record import rundir

# pruned: a study's trial stopped early
STATUSES = ("running", "completed", "failed", "interrupted", "preempted", "pruned")
NOT_NAMING = {"sweep_name", "tags", "notes"}  # labels, shown in their own columns
# Metrics shown when `--metric` is not given and a run's summary.json names none (`compare_metrics`,
# from the method's YAML).
FALLBACK_METRICS = ["loss"]
_SKIP_DIRS = {rundir.CHECKPOINTS, rundir.MODEL, "wandb", ".hydra"}


@dataclass
class Run:
    """One run directory as `ablate compare` sees it."""

    path: Path
    summary: dict[str, Any]
    overrides: dict[str, str]
    events: list[dict[str, Any]] = field(default_factory=list)
    launch: Path | None = None  # the sweep dir it was launched in; a run outside a sweep: itself

    @property
    def seed(self) -> str:
        return self.overrides.get("seed", "0")

    @property
    def status(self) -> str:
        return str(self.summary.get("status", "running"))

    @property
    def method(self) -> str:
        return str(self.summary.get("method", "?"))

    @property
    def default_metrics(self) -> list[str]:
        """The method's `compare_metrics` (its YAML, recorded in summary.json), else `loss`."""
        return list(self.summary.get("compare_metrics") or FALLBACK_METRICS)

    @cached_property
    def examples(self) -> dict[str, dict[str, float]]:
        """Per-example eval scores (`eval_examples.jsonl`, by `ablate eval`): {id: {metric: score}}."""
        return rundir.read_examples(self.path)

    @cached_property
    def evaluation(self) -> dict[str, Any]:
        """`ablate eval`'s record (eval.json: `metrics`, `split`, `examples`, ...); {} when not evaluated."""
        return rundir.read_json(self.path / rundir.EVAL) or {}

    @cached_property
    def held_out(self) -> dict[str, float]:
        """The held-out metrics (`eval_`-prefixed, as the Trainer names them): eval.json's (the latest `ablate
        eval`: its backends' `lm_eval/...` and `judge/...` too), else the last eval during training
        (summary.json, with eval_strategy set). A value that is not a number is left out (`not_numbers`)."""
        trained = {
            k: float(v)
            for k, v in self.summary.get("metrics", {}).items()
            if k.startswith("eval_") and _number(v)
        }
        metrics = self.evaluation.get("metrics")
        if isinstance(metrics, dict):
            trained.update({k: float(v) for k, v in metrics.items() if _number(v)})
        return trained

    @cached_property
    def not_numbers(self) -> str:
        """One line naming eval.json's values that are not numbers (`"eval_loss": "low"`, written by a tool
        of the user's), which `ablate compare` leaves out; "" when there are none."""
        metrics = self.evaluation.get("metrics")
        bad = [
            f"{k} is {v!r}" for k, v in (metrics or {}).items() if not _number(v) and not isinstance(v, dict)
        ]
        if not bad:
            return ""
        return f"{self.path / rundir.EVAL}: {', '.join(bad)}, not a number: left out of this run's metrics"

    @cached_property
    def diverged(self) -> str:
        """Why this run counts as diverged (`grad_norm nan at step 5`), "" when it does not: a NaN or an
        infinity among its final metrics (summary.json, eval.json) or its last logged values. A diverged
        run's numbers are no measurement of its arm: `score()` leaves it out of the statistics."""
        last = self.events[-1] if self.events else {}
        for where, values in (
            ("", self.summary.get("metrics") or {}),
            ("held out", self.evaluation.get("metrics") or {}),
            (f"at step {last.get('step')}", last),
        ):
            for k, v in values.items():
                if isinstance(v, float) and not math.isfinite(v):
                    return f"{k} {v}" + (f" {where}" if where else "")
        return ""

    def score(self, metric: str) -> float | None:
        """The value `ablate compare`'s statistics use: `final(metric)`, or None for a diverged run (left
        out, and said so)."""
        return None if self.diverged else self.final(metric)

    @cached_property
    def config(self) -> dict[str, Any]:
        """The composed config (.hydra/config.yaml) as `{dotted.key: value}`; {} when absent or unreadable."""
        import yaml

        try:
            cfg = yaml.safe_load((self.path / rundir.HYDRA / "config.yaml").read_text()) or {}
        except (OSError, yaml.YAMLError):
            return {}
        return flatten(cfg) if isinstance(cfg, dict) else {}

    def final(self, metric: str) -> float | None:
        """The run's final value of `metric`: eval.json's (the latest `ablate eval`), else summary.json's
        metrics, else a run-level summary field (`generation_seconds`, `train_runtime`, ...), else the last
        logged value (still running)."""
        if metric in self.held_out:
            return self.held_out[metric]
        value = self.summary.get("metrics", {}).get(metric, self.summary.get(metric))
        if value is None:
            for event in reversed(self.events):
                if isinstance(event.get(metric), (int, float)):
                    return float(event[metric])
        return float(value) if isinstance(value, (int, float)) else None


def _number(v: Any) -> bool:
    """A JSON number (true/false count as 1/0, as in eval_examples.jsonl)."""
    return isinstance(v, (int, float))


@dataclass
class Group:
    """Runs that share every override but the seed."""

    label: str
    runs: list[Run]
    launch: str = ""  # the launch's short name when launches are kept apart, else ""
    arm: str = ""  # the label without the launch

    def per_seed(self, metric: str) -> dict[str, list[float]]:
        """{seed: the final `metric` of each run of the arm with that seed} (pooled launches: several)."""
        values: dict[str, list[float]] = {}
        for r in self.runs:
            if (v := r.score(metric)) is not None:
                values.setdefault(r.seed, []).append(v)
        return values

    def seed_scores(self, metric: str) -> list[float]:
        """One value per seed (a seed two pooled launches both ran counts once, with its mean): what the
        many-seed statistics use, so a pooled arm never counts a seed twice."""
        return [sum(v) / len(v) for v in self.per_seed(metric).values()]


def flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    """A nested config as `{dotted.key: value}` (lists are values)."""
    if not isinstance(node, dict) or not node:
        return {prefix: node} if prefix else {}
    out: dict[str, Any] = {}
    for k, v in node.items():
        out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def override_key(override: str) -> str:
    """`+a.b=1`, `~a.b`, `a.b=1` -> `a.b`."""
    return override.split("=", 1)[0].lstrip("+~")


def parse_overrides(overrides: list[str]) -> dict[str, str]:
    """`["a.b=1", "+c=x"]` -> `{"a.b": "1", "c": "x"}` (a later value of a key wins)."""
    return {override_key(o): o.split("=", 1)[1] if "=" in o else "" for o in overrides}


def load_run(path: Path) -> Run | None:
    """The run in `path`, or None when `path` is no run dir (no summary.json, run.json or .hydra/)."""
    summary = rundir.read_json(path / rundir.SUMMARY)
    info = rundir.read_json(path / rundir.RUN)
    hydra_overrides = path / ".hydra" / "overrides.yaml"
    if summary is None and info is None and not hydra_overrides.is_file():
        return None
    if summary is None and (path / rundir.SUMMARY).exists():  # corrupt, not "still running"
        summary = {"status": "unreadable", "error": f"{rundir.SUMMARY} is not a JSON object"}
    problem = rundir.run_json_problem(path) if summary is not None or info is None else None
    if problem is not None and (summary is not None or (path / rundir.RUN).exists()):
        # no run to use (`last` skips it, eval and generate refuse it), whatever summary.json says
        summary = {**(summary or {}), "status": "unreadable", "error": f"{problem}; `last` skips it"}
    summary = summary or {"status": "running"}
    overrides = summary.get("overrides") or (info or {}).get("overrides")
    if overrides is None and not hydra_overrides.is_file():  # an unreadable run's: none known
        overrides = []
    if overrides is None:  # job launched, ablate not started yet: Hydra's record of the overrides
        overrides = [
            line[2:].strip() for line in hydra_overrides.read_text().splitlines() if line.startswith("- ")
        ]
    # a sweep job (Hydra's `<num>_<overrides>` subdir, or under a multirun.yaml) belongs to its sweep dir
    in_sweep = (path.parent / "multirun.yaml").is_file() or re.match(r"\d+(_|$)", path.name) is not None
    launch = path.parent if in_sweep else path
    return Run(
        path=path,
        summary=summary,
        overrides=parse_overrides(overrides),
        events=rundir.read_metrics(path),
        launch=launch.resolve(),
    )


def _job_order(path: Path) -> tuple[int, str]:
    m = re.match(r"(\d+)", path.name)
    return (int(m.group(1)) if m else 1 << 30, path.name)


def find_runs(paths: list[Path]) -> list[Run]:
    """Every run under `paths` (a run dir, a sweep dir, or any folder holding them), in job order."""
    runs: list[Run] = []
    for path in paths:
        try:
            run = load_run(path)
            # .submitit/, .replaced/
            subdirs = (
                []
                if run is not None or not path.is_dir()
                else sorted(
                    (
                        p
                        for p in path.iterdir()
                        if p.is_dir() and p.name not in _SKIP_DIRS and not p.name.startswith(".")
                    ),
                    key=_job_order,
                )
            )
        except PermissionError as e:  # one unreadable dir is listed as such; the others are still read
            runs.append(
                Run(
                    path=path,
                    summary={
                        "status": "unreadable",
                        "error": f"cannot read {e.filename or path}: permission denied",
                    },
                    overrides={},
                    launch=path,
                )
            )
            continue
        if run is not None:
            runs.append(run)
        runs.extend(find_runs(subdirs))
    return runs


def launches(runs: list[Run]) -> dict[Path, str]:
    """Each launch's short name, in first-seen order: a sweep's `dpo_loss/2026-01-01_10-00-00`, a
    single run's `2026-01-01/10-00-00-123456` (its dir's name without the overrides, which its label
    shows)."""
    out: dict[Path, str] = {}
    for r in runs:
        if r.launch is not None and r.launch not in out:
            name = r.launch.name.split("_")[0] if r.launch == r.path.resolve() else r.launch.name
            out[r.launch] = f"{r.launch.parent.name}/{name}"
    return out


def status_of(run: Run, info: dict[str, Any]) -> str:
    """The run's state as `ablate status` also gives it (`rundir.state`: summary.json, refined by the
    lock: a `running` run whose process is gone, or a Ctrl-C'd one, is `interrupted`)."""
    return rundir.state(run.path, run.summary, info)


def key_metric(run: Run) -> tuple[str, float | None]:
    """The method's first compare metric (its YAML's `compare_metrics`, in summary.json), its final value."""
    name = run.default_metrics[0]
    return name, run.final(name)


def row(run: Run, root: Path) -> dict[str, Any]:
    try:
        info = rundir.read_json(run.path / rundir.RUN) or {}
    except PermissionError:  # a run dir (or its run.json) that cannot be read: the row says so
        info = {}
    step = run.summary.get("global_step")
    if step is None and run.events:
        step = run.events[-1].get("step")
    try:
        metric, value = key_metric(run)
    except PermissionError:  # its eval.json (the held-out value) cannot be read: the status says why
        metric, value = run.default_metrics[0], None
    try:
        rel = str(run.path.relative_to(root))
    except ValueError:
        rel = str(run.path)
    started = info.get("started")
    if started is None:  # a job Hydra launched before ablate wrote run.json: the dir's time
        import time

        started = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(run.path.stat().st_mtime))
    return {
        "started": started,
        "method": run.method if run.method != "?" else info.get("method", "?"),
        "name": " ".join(f"{k}={v}" for k, v in run.overrides.items() if k not in NOT_NAMING) or "(defaults)",
        "status": status_of(run, info),
        "step": step,
        "metric": metric,
        "value": value,
        "tags": [str(t) for t in info.get("tags") or []],
        "notes": info.get("notes"),
        "error": run.summary.get("error"),
        "path": rel,
    }


def list_runs(
    root: Path, status: str | None = None, method: str | None = None, tags: list[str] | None = None
) -> list[dict[str, Any]]:
    """Rows of every run under `root`, newest first, filtered (a run must carry every tag given)."""
    rows = [row(r, root) for r in find_runs([root])]
    rows = [
        r
        for r in rows
        if (status is None or r["status"] == status)
        and (method is None or r["method"] == method)
        and all(t in r["tags"] for t in tags or [])
    ]
    return sorted(rows, key=lambda r: (r["started"], r["path"]), reverse=True)


def format_rows(rows: list[dict[str, Any]]) -> list[str]:
    """Aligned plain-text lines; the path comes last and is never cut or wrapped (pipes, `cut`, awk)."""
    header = ["started", "method", "status", "step", "metric", "tags", "name", "path"]
    cells = [
        [
            r["started"].replace("T", " "),
            r["method"],
            r["status"],
            "-" if r["step"] is None else str(r["step"]),
            f"{r['metric']}={r['value']:.4g}" if r["value"] is not None else f"{r['metric']}=-",
            ",".join(r["tags"]) or "-",
            r["name"],
            r["path"],
        ]
        for r in rows
    ]
    widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, h in enumerate(header)]
    return [
        "  ".join(c.ljust(w) for c, w in zip(line[:-1], widths)) + "  " + line[-1]
        for line in [header, *cells]
    ]


def newest_launches(paths: list[Path]) -> tuple[list[Run], list[str]]:
    """The runs under `paths`, where a path holds several launches of one sweep (`outputs/sweeps/NAME`)
    only those of its newest launch (by start time); and a note on each sweep folder whose older
    launches were left out. A launch dir named itself is always taken whole."""
    runs: list[Run] = []
    notes: list[str] = []
    for path in paths:
        found = find_runs([path])
        by_folder: dict[Path, dict[Path, list[Run]]] = {}
        for r in found:
            if r.launch is not None and r.launch != r.path.resolve() and r.launch != path.resolve():
                by_folder.setdefault(r.launch.parent, {}).setdefault(r.launch, []).append(r)
        dropped: set[Path] = set()
        for folder, launched in by_folder.items():
            if len(launched) > 1:
                order = sorted(launched, key=lambda launch: (_started(launched[launch]), launch.name))
                dropped.update(order[:-1])
                notes.append(
                    f"{folder.name}: the newest launch only ({order[-1].name}); {len(order) - 1} older "
                    f"launch(es) left out ({', '.join(o.name for o in order[:-1])}): --all-launches "
                    "compares every launch, each apart; --pool pools them"
                )
        runs += [r for r in found if r.launch not in dropped]
    return runs, notes


def _started(runs: list[Run]) -> str:
    """When a launch started: its earliest run.json `started`, else its dir's modification time."""
    import time

    stamps = [
        str(info["started"])
        for r in runs
        if (info := rundir.read_json(r.path / rundir.RUN)) and info.get("started")
    ]
    if stamps:
        return min(stamps)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(runs[0].path.parent.stat().st_mtime))


def by_method(runs: list[Run]) -> list[list[Run]]:
    """Runs split by what their methods report (each method's `compare_metrics`: DPO and DPO hinge
    together, SFT apart, GRPO apart): one table per family, grouped by what varies inside it."""
    families: dict[tuple[str, ...], list[Run]] = {}
    unknown = []  # a job not started yet (no summary): its method has not said; with the largest family
    for run in runs:
        metrics = run.summary.get("compare_metrics")
        (families.setdefault(tuple(metrics), []) if metrics else unknown).append(run)
    if not families:
        return [unknown]
    largest = max(families.values(), key=len)
    largest += unknown
    return list(families.values())


def method_names(runs: list[Run]) -> str:
    return ", ".join(dict.fromkeys(str(r.summary.get("method", "?")) for r in runs))
