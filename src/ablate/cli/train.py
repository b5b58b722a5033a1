"""`ablate train [overrides]`: the training Hydra app, with a user mistake as one line."""

from __future__ import annotations

import os
import sys
import traceback

from ablate.cli.exits import fail
from ablate.config.compose import register_resolvers
from ablate.paths import conf_dir
from ablate.process.console import say
from ablate.record.secrets import mask_log_records, remember

# Hydra's own command-line options (as Hydra's get_args_parser declares them): option -> its values
# (None: takes a free value, (): takes none)
HYDRA_OPTIONS: dict[str, tuple[str, ...] | None] = {
    "--help": (),
    "-h": (),
    "--hydra-help": (),
    "-hc": (),
    "--version": (),
    "--resolve": (),
    "--cfg": ("job", "hydra", "all"),
    "-c": ("job", "hydra", "all"),
    "--package": None,
    "-p": None,
    "--run": (),
    "-r": (),
    "--multirun": (),
    "-m": (),
    "--shell-completion": (),
    "-sc": (),
    "--config-path": None,
    "-cp": None,
    "--config-name": None,
    "-cn": None,
    "--config-dir": None,
    "-cd": None,
    "--experimental-rerun": None,
    "--info": ("all", "config", "defaults", "defaults-tree", "plugins", "searchpath"),
    "-i": ("all", "config", "defaults", "defaults-tree", "plugins", "searchpath"),
}


def check_argv(argv: list[str]) -> None:
    """Options Hydra's argparse would answer with its whole usage page: one line instead."""
    import difflib

    args = iter(argv)
    for arg in args:
        if not arg.startswith("-") or arg == "-":
            continue
        flag, eq, value = arg.partition("=")
        if flag not in HYDRA_OPTIONS:
            if flag.startswith("--") and eq:  # --method=dpo: an override written as an option
                _refuse(f"'{arg}' is not an option: overrides take no dashes: write {arg[2:]}")
            hint = difflib.get_close_matches(flag, [k for k in HYDRA_OPTIONS if k.startswith("--")], n=1)
            _refuse(
                f"'{flag}' is not an option of ablate train ({f'did you mean {hint[0]}? ' if hint else ''}"
                f"options: --cfg job|hydra|all, -m, --config-dir DIR, --info, --help)"
            )
        choices = HYDRA_OPTIONS[flag]
        if choices == () and eq:
            _refuse(f"'{flag}' takes no value (got '{arg}')")
        optional = flag in ("--info", "-i")  # --info alone prints everything
        if choices and not eq and not optional:
            value = next(args, "")
        if choices and (eq or not optional) and value not in choices:
            _refuse(
                f"{flag} takes {'|'.join(choices)}, got '{value}' (e.g. ablate train {flag} {choices[0]})"
            )
        if choices is None and not eq:
            next(args, None)


def _refuse(line: str) -> None:
    fail(line)


def hydra_train(argv: list[str]) -> None:
    """Run the training Hydra app with `argv` as its command line."""
    import hydra

    check_argv(argv)

    from ablate.config.hints import one_line
    from ablate.launchers import sweep
    from ablate.process import interrupts
    from ablate.train import main as task

    register_resolvers()
    remember(argv)  # a secret given as an override is masked in every record, however it is spelled
    mask_log_records()  # and in every line logged here (Hydra's launchers echo each job's overrides)
    sys.argv = ["ablate", *argv]
    if "-m" in argv or "--multirun" in argv:  # SIGTERM/SIGINT of the parent stops its workers too
        os.environ[interrupts.SWEEP_PID] = str(os.getpid())
        interrupts.forward_to_workers()
        from ablate.record.secrets import MaskedStream

        sys.stderr = MaskedStream(sys.stderr)  # Hydra writes a failed job's overrides there itself
        interrupts.quiet_pool_trackers()
    full_error = os.environ.get("HYDRA_FULL_ERROR") == "1"
    os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra raises instead of printing a page: errors reach us
    error: Exception | None = None
    try:
        hydra.main(config_path=conf_dir(), config_name="config", version_base="1.3")(task)()
    except (KeyboardInterrupt, interrupts.Interrupted) as e:
        sweep.finish()
        say(f"ablate: interrupted ({interrupts.describe(e)}); continue a run with `ablate resume RUN_DIR`")
        sys.exit(interrupts.exit_code(e))
    except Exception as e:  # a user's mistake becomes one line below, a bug is re-raised
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
        # the launcher refused (hydra/launcher=ray: no cluster)
        elif line is not None and sweep.job_count() == 0:
            from ablate.record.secrets import mask_text

            print(f"ablate: error: {mask_text(line)}", file=sys.stderr)
        print(f"ablate: {failed} sweep job(s) failed (see the table above)", file=sys.stderr)
        sys.exit(1)
    if error is not None:
        if line is None:
            raise error
        from ablate.record.secrets import mask_text

        say(f"ablate: error: {mask_text(line)}")
        sys.exit(2)


def echo(hydra_argv: list[str]) -> None:
    from ablate.record.secrets import mask_text

    print("ablate train " + " ".join(mask_text(a) for a in hydra_argv))
