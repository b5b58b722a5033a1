"""`ablate <command> [args]`: train (a Hydra app), sweep, compare.

Nothing here imports torch: composing and printing a config (`ablate train --cfg job`) is fast.
"""

from __future__ import annotations

import hashlib
import re
import sys
from pathlib import Path

USAGE = """usage: ablate <command> [args]

commands:
  train [overrides]        train one run (Hydra app: key=value, -m, --cfg job, +group=opt, hydra.run.dir=...)
  sweep FILE [overrides]   run a sweep file from sweeps/ as a Hydra multirun
  compare DIR... [--out D] compare run and sweep directories (table, plots)

examples:
  ablate train                                  # DPO (sigmoid) on the tiny model, ~1 min on CPU
  ablate train method=dpo_hinge method.args.beta=0.2
  ablate train -m method=dpo,dpo_hinge seed=1,2,3
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


def register_resolvers() -> None:
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver("ablate_dirname"):
        OmegaConf.register_new_resolver("ablate_dirname", _dirname)


def hydra_train(argv: list[str]) -> None:
    """Run the training Hydra app with `argv` as its command line."""
    import hydra

    from ablate.train import main as task

    register_resolvers()
    sys.argv = ["ablate", *argv]
    hydra.main(config_path=conf_dir(), config_name="config", version_base="1.3")(task)()


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return
    cmd, rest = argv[0], argv[1:]
    if cmd == "train":
        hydra_train(rest)
    else:
        print(f"ablate: unknown command '{cmd}'\n\n{USAGE}", file=sys.stderr)
        sys.exit(2)
