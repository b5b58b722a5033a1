"""`ablate train [overrides]`: the training Hydra app, with a user mistake as one line."""

from __future__ import annotations

import os
import sys
import traceback

from ablate.paths import conf_dir
from ablate.run.compose import check_moved, register_resolvers


def hydra_train(argv: list[str]) -> None:
    """Run the training Hydra app with `argv` as its command line."""
    import hydra

    check_moved(argv)

    from ablate.launchers import sweep
    from ablate.run import interrupts
    from ablate.run.validate import one_line
    from ablate.train import main as task

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
        elif line is not None and sweep.job_count() == 0:  # the launcher refused (hydra/launcher=ray: no cluster)
            from ablate.run.secrets import mask_text

            print(f"ablate: error: {mask_text(line)}", file=sys.stderr)
        print(f"ablate: {failed} sweep job(s) failed (see the table above)", file=sys.stderr)
        sys.exit(1)
    if error is not None:
        if line is None:
            raise error
        from ablate.run.secrets import mask_text

        print(f"ablate: error: {mask_text(line)}", file=sys.stderr)
        sys.exit(2)


def echo(hydra_argv: list[str]) -> None:
    from ablate.run.secrets import mask_text

    print("ablate train " + " ".join(mask_text(a) for a in hydra_argv))
