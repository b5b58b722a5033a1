"""Run-dir names: short, readable and shell-safe (letters, digits, `.`, `_`, `-`), however many overrides a run
has; two different override lists never share a name; the overrides themselves are in run.json."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

from conftest import ablate

from ablate.config.compose import SLUG_LIMIT, dirname_suffix

SAFE = re.compile(r"^[A-Za-z0-9._-]+$")
LONG = [
    "+experiment=calc_tools",
    "method.args.max_steps=400",
    "model.path=outputs/calc_sft/model",
    "optimizer.optimizer.lr=1e-3",
    "'data.reward_funcs=[myrew.short,myrew.long]'",
    "method.args.beta=0.1",
    "method/dpo_loss=ipo",
    "seed=3",
    "notes=a b c",
]


def test_a_long_override_list_gives_a_short_shell_safe_readable_name() -> None:
    name = dirname_suffix(",".join(LONG))
    assert SAFE.match(name) and len(name) <= 1 + SLUG_LIMIT + 9, name  # `_` + slug + `-` + 8 hex digits
    # keys' last parts, choices first (Hydra sorts them after dotted keys)
    assert name.startswith("_experiment-calc_tools_dpo_loss-ipo_seed-3_"), name


def test_different_override_lists_never_share_a_name() -> None:
    """Lists that read alike once shortened (the same last key part, characters replaced, cut at the limit)."""
    lists = [
        "method.args.beta=1",
        "method.dpo_loss.beta=1",
        "beta=1",
        "+beta=1",
        "beta=1.0",
        "a=b_c",
        "a=b,c=d",
        "a=b-c",
        "a=b/c",
        "a=b c",
        ",".join(LONG),
        ",".join(LONG[:-1]),
        ",".join(LONG) + ",x=1",
        *(f"seed={i},method.args.max_steps={j}" for i, j in itertools.product(range(20), range(20))),
    ]
    names = [dirname_suffix(o) for o in lists]
    assert len(set(names)) == len(lists)
    assert all(SAFE.match(n) for n in names)


def test_a_run_with_many_overrides_gets_a_short_dir_and_keeps_them_in_run_json(tmp_path: Path) -> None:
    overrides = [
        "method.args.max_steps=1",
        "method.args.save_strategy=no",
        "method.args.beta=0.25",
        "optimizer.optimizer.lr=0.002",
        "seed=12345",
        "method/dpo_loss=ipo",
        "method.args.logging_steps=1",
        "method.args.gradient_checkpointing=false",
        "data.max_eval_samples=4",
        "notes=a long note",
    ]
    r = ablate("train", *overrides, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    (run,) = [p.parent for p in (tmp_path / "outputs/runs").glob("*/*/run.json")]
    assert SAFE.match(run.name) and len(run.name) <= len("00-00-00-000000") + 1 + SLUG_LIMIT + 9, run.name
    assert json.loads((run / "run.json").read_text())["overrides"] == overrides
    assert str(run.relative_to(tmp_path)) in r.stdout  # the dir the run prints, as it is
