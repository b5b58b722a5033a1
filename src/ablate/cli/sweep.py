"""`ablate sweep NAME [overrides]`: a sweep file as a Hydra multirun; `--dry-run`, `--resume`, `--detach`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ablate.cli.exits import fail, user_errors
from ablate.cli.train import echo, hydra_train
from ablate.config.compose import quote_override_value
from ablate.paths import sweeps_dir


def find_sweep(arg: str) -> tuple[str, list[str]]:
    """The sweep file `arg` names, as (name, extra Hydra args): a shipped sweep by name (`dpo_loss`)
    or path (`sweeps/dpo_loss.yaml`), or a YAML file of your own anywhere, which is added to Hydra's
    search path as the group `sweep` (hydra_plugins/ablate_sweeps) ahead of the shipped ones."""
    path, shipped = Path(arg), Path(sweeps_dir())
    if path.is_file() and path.suffix == ".yaml" and path.resolve().parent != shipped.resolve():
        check_sweep_file(path)
        own = quote_override_value(f"ablate-sweeps://{path.resolve()}")
        return path.stem, [f"hydra.searchpath=[{own},ablate-sweeps://shipped]"]
    if (shipped / f"{path.stem}.yaml").is_file() and (path.suffix in ("", ".yaml")):
        return path.stem, []
    names = ", ".join(sorted(p.stem for p in shipped.glob("*.yaml")))
    raise FileNotFoundError(
        f"ablate sweep: no sweep file '{arg}' (shipped, in sweeps/: {names}; "
        "or the path to a sweep file of your own)"
    )


def check_sweep_file(path: Path) -> None:
    """A file of your own is a sweep only with swept values under `hydra.sweeper.params`: anything else
    would run as one plain training job. An old-style file (top-level `params:`) says how to convert it."""
    import yaml
    from omegaconf import OmegaConf

    from ablate.config.hints import bad_config_file

    try:
        cfg = OmegaConf.load(path)
    except (yaml.YAMLError, UnicodeDecodeError) as e:  # the same one line as a broken file under conf/
        reason = bad_config_file(e) or f"{path}: not valid YAML"
        raise ValueError(f"ablate sweep: {reason.replace('a config file', str(path))}") from None
    if OmegaConf.select(cfg, "hydra.sweeper.params") is not None:
        return
    if "params" in cfg:
        raise ValueError(
            f"ablate sweep: {path} is an old-style sweep file (top-level params:); sweeps are Hydra "
            "configs now: move its params under hydra.sweeper.params (see sweeps/dpo_loss.yaml)"
        )
    raise ValueError(
        f"ablate sweep: {path} sweeps nothing (no hydra.sweeper.params; see sweeps/dpo_loss.yaml)"
    )


def sweep_cmd(args: Any) -> None:
    """`ablate sweep NAME [overrides] [--resume [--force]]` / `ablate sweep --resume SWEEP_DIR`:
    the sweep file sweeps/NAME.yaml (or a path) as a Hydra multirun, or an earlier launch resumed."""
    from ablate.launchers.sweep import sweep_argv

    resume, force, detach, dry = args.resume, args.force, args.detach, args.dry_run
    if not args.name or (dry and resume):
        from ablate.cli import refuse

        refuse(
            "--dry-run and --resume do not go together"
            if dry and resume
            else "which sweep? give its name (dpo_loss) or file, or --resume SWEEP_DIR",
            "ablate sweep",
        )
    argv = [args.name, *args.overrides, *hydra_flags(args)]
    sweep_dir = Path(argv[0]) if resume and (Path(argv[0]) / "multirun.yaml").is_file() else None
    with user_errors(FileNotFoundError, ValueError):
        check_overrides(argv[1:], resume)
        if sweep_dir is not None:  # the launch's own command line, recorded by Hydra
            from ablate.launchers.sweep_resume import launch_argv

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
    echo(hydra_argv)
    if dry:
        _dry_run(argv[0], hydra_argv)
        return
    hydra_train(hydra_argv)


def hydra_flags(args: Any) -> list[str]:
    """Hydra's own options given to `ablate sweep` (`--cfg job`), as train takes them."""
    flags = [f"--{k.replace('_', '-')}" for k in ("resolve",) if getattr(args, k)]
    for key in ("cfg", "package", "info", "config_dir"):
        if getattr(args, key) is not None:
            flags += [f"--{key.replace('_', '-')}", getattr(args, key)]
    return flags


def check_overrides(args: list[str], resume: bool) -> None:
    """What follows the sweep's name are overrides (key=value, ~key): a sweep dir given after the name
    (`ablate sweep NAME ... --resume DIR`) or a stray word would reach Hydra's parser, which answers in
    its grammar's terms ("extraneous input '/' expecting {EQUAL, ...}")."""
    # Hydra's own flags whose value is the next word (`--cfg job`, `-p PACKAGE`)
    valued = {
        "--cfg",
        "-c",
        "--package",
        "-p",
        "--info",
        "-i",
        "--config-path",
        "-cp",
        "--config-name",
        "-cn",
        "--config-dir",
        "-cd",
        "--experimental-rerun",
    }
    for i, a in enumerate(args):
        if "=" in a or a.startswith(("-", "~")) or (i and args[i - 1] in valued):
            continue
        if (Path(a) / "multirun.yaml").is_file():
            how = (
                "--resume takes the sweep dir in place of the sweep's name"
                if resume
                else "a sweep dir is resumed"
            )
            raise ValueError(
                f"'{a}' is a sweep dir: {how}: ablate sweep --resume {a} [key=value ...] (its sweep "
                "and command line come from its multirun.yaml)"
            )
        raise ValueError(
            f"'{a}' is not an override: after the sweep's name come key=value overrides "
            "(ablate sweep NAME key=value ... [--resume])"
        )


def _dry_run(name: str, hydra_argv: list[str]) -> None:
    """`--dry-run`: the jobs the launch would start, composed as Hydra composes them; nothing runs."""
    from hydra.errors import HydraException

    from ablate.launchers.sweep import print_plan

    try:
        print_plan(name, hydra_argv)
    except HydraException as e:  # a bad override: Hydra's first line says which
        fail(str(e).strip().splitlines()[0])


def _resume_argv(hydra_argv: list[str], sweep_dir: Path | None, force: bool) -> list[str]:
    """Check every job of the sweep against its earlier launch (sweep_resume.plan) and return the
    argv that relaunches it into that launch's dir, completed jobs skipped."""
    from ablate.launchers import sweep, sweep_resume
    from ablate.record import lifecycle

    try:
        sweep_dir, actions = sweep_resume.plan(hydra_argv, sweep_dir, force)
    except sweep_resume.ResumeRefused as e:
        raise ValueError(str(e)) from None
    counts: dict[str, int] = {}
    for action in actions.values():
        counts[action.split(" ")[0]] = counts.get(action.split(" ")[0], 0) + 1
    print(
        f"resuming {sweep_dir}: "
        + (", ".join(f"{n} {a}" for a, n in counts.items()) or "the study in study.db")
    )
    os.environ[lifecycle.RESUME_ENV] = "1"  # inherited by the job processes
    sweep.set_plan(actions)
    kept = [a for a in hydra_argv if not a.startswith("hydra.sweep.dir=")]
    return [*kept, f"hydra.sweep.dir={quote_override_value(str(sweep_dir))}"]
