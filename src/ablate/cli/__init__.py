"""`ablate <command> [args]`: one argparse parser, a subcommand per command, each with its own `--help`;
a command's module is imported only when it runs (no torch for `compare` or `ls`). `train` hands its
arguments to Hydra as they are (its `--help` is Hydra's: the config groups and their options). A
mistake on the command line is one line, `ablate: error: ...`, exit status 2.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, NoReturn

from ablate.cli.exits import fail

EXAMPLES = """examples:
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
  ablate compare outputs/sweeps/dpo_loss --out          # <sweep dir>/report/report.html, plots included
  ablate train debug=fast 'tags=[baseline]' notes="first try"   # debug=fast|overfit|profile
  ablate ls --status failed                     # what have I run? (--method, --tag, --json)
  ablate generate outputs/runs/DATE/TIME --prompt "sort: dcba ="
  ablate eval outputs/runs/DATE/TIME data=caps_prefs
  ablate data preview model=smollm2_135m data=local data.train_path=prefs.parquet -n 2
  ablate data check data=local data.train_path=train.jsonl data.eval_path=eval.jsonl
  ablate plan +experiment=qwen7b_dpo_lora --gpus 8 --gpu-memory 80   # memory per GPU; no download
  ablate serve-rollouts +experiment=smollm2_grpo --port 8000   # rollouts for method/rollouts=vllm_server
each command's own options: ablate <command> --help"""


class Parser(argparse.ArgumentParser):
    """argparse, with a mistake as one line naming what to fix instead of the usage page."""

    commands: dict[str, Parser]  # the top parser's subparsers, by command

    def error(self, message: str) -> NoReturn:
        if message.startswith("unrecognized arguments: "):
            message = f"'{message.split(': ', 1)[1]}' is not an option of {self.prog}"
        else:
            # argparse's own words, said of the command: "ablate cache: argument --kind: invalid choice: ...";
            # intermixed parsing names the optional overrides too
            message = f"{self.prog}: " + message.replace(", overrides", "")
        refuse(message, self.prog)


def refuse(why: str, prog: str = "ablate") -> NoReturn:
    """Exit 2 with one line on stderr: what is wrong, and where the command's usage is. For the
    mistakes argparse cannot see (a run dir given where a sweep dir goes, two flags that exclude
    each other), said in the same form as the ones it can."""
    print(f"ablate: error: {why} ({prog} --help for usage)", file=sys.stderr)
    sys.exit(2)


def parser() -> Parser:
    """The whole command line: `ablate <command> ...`, each command a subparser (its `--help`)."""
    top = Parser(
        prog="ablate",
        usage="ablate <command> [args]",
        epilog=EXAMPLES,
        description="Hydra-based experiment orchestration for LLM post-training.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    top.add_argument("-V", "--version", action="store_true", help="print the version")
    sub = top.add_subparsers(title="commands", metavar="<command>", parser_class=Parser, prog="ablate")

    top.commands = {}

    def command(name: str, help: str, description: str = "", **kw: Any) -> Parser:  # `help`: argparse's name
        top.commands[name] = sub.add_parser(name, help=help, description=description or help, **kw)
        return top.commands[name]

    from ablate.cli import arguments

    for add in arguments.COMMANDS:
        add(command)
    return top


# command -> (module, function); modules load only when their command runs (no torch for `compare`, `ls`)
COMMANDS = {
    "train": ("ablate.cli.train", "hydra_train"),
    "sweep": ("ablate.cli.sweep", "sweep_cmd"),
    "compare": ("ablate.cli.compare", "compare_cmd"),
    "status": ("ablate.cli.status", "status_cmd"),
    "ls": ("ablate.cli.ls", "ls_cmd"),
    "generate": ("ablate.cli.generate", "generate_cmd"),
    "eval": ("ablate.cli.evaluate", "eval_cmd"),
    "resume": ("ablate.cli.resume", "resume_cmd"),
    "cache": ("ablate.cli.cache", "cache_cmd"),
    "fetch": ("ablate.cli.fetch", "fetch_cmd"),
    "data": ("ablate.cli.data", "data_cmd"),
    "plan": ("ablate.cli.plan", "plan_cmd"),
    "serve-rollouts": ("ablate.cli.serve", "serve_cmd"),
}


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    survive_closed_pipes()
    top = parser()
    if not argv or argv[0] in ("-h", "--help", "help"):
        top.print_help()
        return
    if argv[0] in ("--version", "-V", "version"):
        from ablate import __version__

        print(f"ablate {__version__}")
        return
    from ablate.process.setup import exit_without_teardown

    try:
        with exit_without_teardown():  # a torchrun/SLURM rank: no interpreter teardown after its group
            _dispatch(top, argv[0], argv[1:])
    except KeyboardInterrupt:  # Ctrl-C: the run records itself (summary.json); no traceback page here
        from ablate.process.console import say

        say("ablate: interrupted")
        sys.exit(130)
    except PermissionError as e:  # a file or dir the user cannot read or write: theirs to fix, not a bug
        from ablate.config.hints import os_error_line
        from ablate.process.console import say

        say(f"ablate: error: {os_error_line(e)}")
        sys.exit(2)


def _dispatch(top: Parser, cmd: str, rest: list[str]) -> None:
    """Run `cmd` with `rest`: parsed by its subparser (flags and values in any order), or for `train`
    handed to Hydra untouched."""
    if cmd not in COMMANDS:
        import difflib

        hint = difflib.get_close_matches(cmd, COMMANDS, n=1)
        meant = f"did you mean 'ablate {hint[0]}'? " if hint else ""
        what = "an option" if cmd.startswith("-") else "a command"
        fail(f"'{cmd}' is not {what} ({meant}commands: {', '.join(COMMANDS)}; ablate --help for usage)")
    import importlib

    module, func = COMMANDS[cmd]
    args = rest if cmd == "train" else top.commands[cmd].parse_intermixed_args(rest)
    getattr(importlib.import_module(module), func)(args)


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
