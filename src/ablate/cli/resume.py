"""`ablate resume RUN_DIR`: continue a crashed or killed run in its own dir."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from ablate.cli.exits import fail_job, user_errors
from ablate.cli.train import echo, hydra_train
from ablate.config.compose import quote_override_value


def resume_cmd(args: Any) -> None:
    """`ablate resume RUN_DIR [--force] [hydra overrides]`: rerun a run's own overrides in its own dir,
    which continues it from its newest complete checkpoint (a crashed, killed or failed run).
    `--force`: resume although the data or the composed config changed since the run started
    (refused without it)."""
    from ablate.record import identity, rundir

    if args.force:  # the data or the config changed since the run started: resume on them all the same
        os.environ[identity.NEW_DATA_ENV] = "1"
        os.environ[identity.NEW_CONFIG_ENV] = "1"
    with user_errors(rundir.RunDirError, say=fail_job):  # every rank of a torchrun job sees it alike
        run_dir = rundir.given_run(args.run_dir).resolve()  # `last`: the newest run
        rundir.check_readable(run_dir)
        info = rundir.read_json_checked(run_dir / rundir.RUN)
    summary = rundir.read_json(run_dir / rundir.SUMMARY) or {}
    if info is None:
        fail_job(f"{run_dir} is not an ablate run dir (no {rundir.RUN})")
    if not isinstance(info.get("overrides"), list):  # e.g. `{}`: not written by ablate, or cut short
        fail_job(
            f"{run_dir / rundir.RUN} records no overrides (a list), so the run cannot be "
            f"composed again; restore it, or start over: ablate train hydra.run.dir=NEW_DIR ..."
        )
    if summary.get("status") in ("completed", "pruned"):  # pruned: its study stopped it on purpose
        print(
            f"{run_dir} already {summary['status']} at step {summary.get('global_step')}: nothing to resume"
        )
        return
    resized = _resized(run_dir, info, args.overrides)
    # what the launch had besides its overrides: --config-dir (its methods, data) and PYTHONPATH (its code)
    config_dir = ["--config-dir", info["config_dir"]] if info.get("config_dir") else []
    for path in reversed(info.get("pythonpath", [])):
        if path not in sys.path:
            sys.path.insert(0, path)
    if info.get("pythonpath"):  # for the processes a launcher starts (local_parallel, torchrun)
        os.environ["PYTHONPATH"] = os.pathsep.join([*info["pythonpath"], os.environ.get("PYTHONPATH", "")])
    hydra_argv = [
        *config_dir,
        *_unmasked(info["overrides"], [*args.overrides, *resized], run_dir),
        f"hydra.run.dir={quote_override_value(str(run_dir))}",
    ]
    echo(hydra_argv)
    hydra_train(hydra_argv)


def _unmasked(recorded: list[str], given: list[str], run_dir: Path) -> list[str]:
    """The recorded overrides with the ones given again on the command line replaced (same key):
    run.json holds secrets masked, so a run started with `+model.token=hf_...` is resumed by passing
    it again (or started with `'+model.token=${oc.env:HF_TOKEN}'`, recorded as written)."""
    from ablate.analysis.runs import override_key
    from ablate.record.secrets import MASK

    keys = {override_key(o) for o in given if "=" in o}
    kept = [o for o in recorded if override_key(o) not in keys]
    masked = [o for o in kept if MASK in o]
    if masked:
        key = masked[0].split("=", 1)[0]
        fail_job(
            f"{run_dir}/run.json records '{masked[0]}' masked; give it again: "
            f"ablate resume {run_dir} {key}=..."
        )
    return [*kept, *given]


GA = "method.args.gradient_accumulation_steps"


def _resized(run_dir: Path, info: dict[str, Any], given: list[str]) -> list[str]:
    """Resumed on another number of ranks (torchrun, SLURM tasks) than the run ran on: the override that
    keeps its global batch (ranks x gradient_accumulation_steps micro-batches per step), so the resumed
    steps see the batches, and log the losses, of the uninterrupted run (checkpoints load at any rank
    count: DCP reshards FSDP's shards, DDP's are whole). One line says it; a count that cannot keep the
    batch is refused in one line. `method.args.gradient_accumulation_steps=N` given: the user's choice."""
    from ablate.config.machine import job_processes
    from ablate.record import identity

    ranks, here = int(info.get("world_size") or 1), job_processes()
    if ranks == here or any(o.split("=", 1)[0].lstrip("+") == GA for o in given):
        return []
    args = ((info.get("config") or {}).get("method") or {}).get("args") or {}
    ga = args.get("gradient_accumulation_steps") or 1
    if not isinstance(ga, int) or (ranks * ga) % here:
        fail_job(
            f"{run_dir} ran on {ranks} rank(s) x gradient_accumulation_steps={ga}; {here} ranks cannot keep "
            f"that global batch ({ranks * ga} micro-batches per step is not a multiple of {here}): "
            f"resume on a divisor of {ranks * ga} ranks, or give {GA}=N (and --force: other batches)"
        )
    new = ranks * ga // here
    os.environ[identity.RESIZED_ENV] = GA
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"resuming on {here} rank(s), it ran on {ranks}: {GA} {ga} -> {new} keeps its global batch")
    return [f"{GA}={new}"]
