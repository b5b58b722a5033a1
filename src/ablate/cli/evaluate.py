"""`ablate eval RUN_DIR|SWEEP_DIR [--vs BASELINE] [--samples N] [overrides]`: evaluate a saved run (or every
job of a sweep) with the evaluation backends of the group `eval` (ablate.evaluation): `heldout` (the method's
own metrics on the held-out split: the default), `lm_eval` (lm-evaluation-harness) and `judge` (a judged win
rate against `--vs`).

The run's config is composed again from its own overrides (run.json) plus the ones given here (`data=...`,
`eval=[heldout,lm_eval]`, `judge=reward_model judge.path=DIR`; a given key replaces the run's), the policy is
the run's `model/` (adapters included), and ablate.record.lifecycle.evaluate runs the evaluations, records
them in `<run_dir>/eval.json` and `eval_examples.jsonl` (what `ablate compare` reads) and logs them into the
run's W&B run when it trained with logger=wandb. A sweep dir: every completed job, but those whose
eval.json holds every evaluation asked already.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ablate.analysis.runs import override_key
from ablate.cli.exits import fail, one_line_errors
from ablate.evaluation import results as evaluations
from ablate.record import rundir

EVAL = rundir.EVAL


def compose_run_config(run_dir: Path, overrides: list[str]) -> Any:
    """The run's config with `overrides` on top (a key given here replaces the run's own override)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from ablate.config.compose import register_resolvers
    from ablate.errors import ConfigError
    from ablate.paths import conf_dir

    info = rundir.read_json(run_dir / rundir.RUN)
    if info is None:
        raise ConfigError(f"{run_dir} is not an ablate run dir (no {rundir.RUN})")
    given = {override_key(o) for o in overrides}
    merged = [o for o in info.get("overrides", []) if override_key(o) not in given] + overrides
    register_resolvers()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=conf_dir(), version_base="1.3"):
        return compose(config_name="config", overrides=merged), merged


def asked(run_dir: Path, overrides: list[str], samples: int, vs: Path | None) -> tuple[Any, list[str]]:
    """The run's config with the evaluations asked made explicit: the run's own (`eval=[...]` it trained with)
    or the ones given, else held-out; `--vs` adds the judge against it, `--samples` sets both backends'."""
    # which evaluations: the group's selection only (an `eval.judge.limit=8` needs the node it sets)
    cfg, _ = compose_run_config(run_dir, [o for o in overrides if not override_key(o).startswith("eval.")])
    names = evaluations.names(cfg) or ([] if vs is not None else [evaluations.HELD_OUT])
    if vs is not None and "judge" not in names:
        names.append("judge")
    extra = [f"eval=[{','.join(names)}]"]
    extra += [f"eval.judge.vs={vs}"] if vs is not None else []
    extra += [f"eval.{n}.samples={samples}" for n in names if samples and n in ("heldout", "judge")]
    given = {override_key(o) for o in extra}
    return compose_run_config(run_dir, extra + [o for o in overrides if override_key(o) not in given])


def evaluate(
    run_dir: Path, overrides: list[str], samples: int = 0, vs: Path | None = None
) -> tuple[dict[str, Any], list[str]]:
    """Evaluate one run dir (see the module docstring); returns eval.json's record and what ran."""
    from transformers import set_seed

    from ablate.cli.generate import load_run_model
    from ablate.config.machine import check_precision
    from ablate.process.setup import quiet_libraries
    from ablate.record import lifecycle

    cfg, merged = asked(run_dir, overrides, samples, vs)
    evaluations.check(cfg)  # an unknown task, a missing extra, no judge: before the model is loaded
    quiet_libraries()  # no dataset bars, no pin_memory warning on a CPU, as in a training run
    set_seed(cfg.seed)
    tokenizer, model = load_run_model(run_dir)
    names = evaluations.names(cfg)
    record = lifecycle.evaluate(cfg, run_dir, model, tokenizer, check_precision(cfg.precision), merged, names)
    return record, names


def evaluate_sweep(sweep: Path, overrides: list[str], samples: int, vs: Path | None) -> None:
    """Every completed job under `sweep`, but those whose eval.json holds what is asked already."""
    from ablate.analysis.runs import find_runs

    runs = [r for r in find_runs([sweep]) if (r.path / rundir.RUN).is_file()]
    if not runs:
        fail(
            f"{sweep} is not an ablate run dir (no {rundir.RUN}), nor a sweep holding any (`ablate ls` lists "
            "your runs)"
        )
    for run in runs:
        if run.status != "completed":
            print(f"{run.path.name}: {run.status}, not evaluated (its training has not completed)")
            continue
        cfg, _ = asked(run.path, overrides, samples, vs)
        record = rundir.read_json(run.path / EVAL) or {}
        todo = evaluations.pending(cfg, record) if not vs and not samples else evaluations.names(cfg)
        if not todo:
            print(f"{run.path.name}: done ({', '.join(evaluations.done(record))} in {EVAL})")
            continue
        result, ran = evaluate(run.path, overrides + [f"eval=[{','.join(todo)}]"], samples, vs)
        print(f"{run.path.name}: {', '.join(ran)} -> {run.path / EVAL}")
        show(result, ran)


def show(result: dict[str, Any], names: list[str]) -> None:
    """Each evaluation's metrics, indented under what it scored."""
    metrics = result["metrics"]
    for name in names:
        prefix = evaluations.PREFIXES.get(name, f"{name}/")
        if name == evaluations.HELD_OUT:
            how = f", {result['completions']}" if "completions" in result else ""
            split, n = result.get("split"), result.get("examples")
            print(f"{result['method']} eval on the {split} split ({n} examples{how}):")
        else:
            facts = result.get(name) or {}
            about = ", ".join(
                f"{k} {v}" for k, v in facts.items() if k in ("tasks", "vs", "judge", "answers")
            )
            print(f"{name} ({about}):")
        mine = {k: v for k, v in metrics.items() if k.startswith(prefix)}
        width = max([28, *map(len, mine)])
        for k, v in sorted(mine.items()):
            print(f"  {k:<{width}} {v:.4g}" if isinstance(v, float) else f"  {k:<{width}} {v}")


def eval_cmd(args: Any) -> None:
    """`ablate eval RUN_DIR|SWEEP_DIR [--vs BASELINE] [--samples N] [key=value ...]` (ablate.cli.parser)."""
    with one_line_errors():
        path = rundir.given_run(args.run_dir).resolve()  # `last`: the newest run
        vs = rundir.given_run(args.vs).resolve() if args.vs is not None else None
        rundir.check_given(path, run=False)  # at once: before the heavy imports
        if not (path / rundir.RUN).is_file():  # a sweep dir, or a folder of runs
            evaluate_sweep(path, args.overrides, args.samples, vs)
            return
        result, ran = evaluate(path, args.overrides, args.samples, vs)
    show(result, ran)
    print(f"wrote {path / EVAL}")
    print(f"wrote {path / rundir.EXAMPLES} (each example's scores, for ablate compare)")
