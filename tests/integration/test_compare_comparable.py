"""`ablate compare` ranks what is comparable, from a scratch dir as a user runs it: run dirs written to the
contract with the config `ablate train` records (composed from the real conf/), so each method's
`defined_by` is read as a sweep's runs carry it. Two DPO losses' `loss` is not ranked, their rewards are;
held-out metrics (eval.json) are preferred when every run has them and `--metric eval_*` picks them; a
sweep of 1-seed arms says "not enough seeds to tell" in one line (`--verbose`: each)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from integration.test_compare import write_run
from unit.test_comparable import composed

ENV = {**os.environ, "COLUMNS": "250"}
# per (loss, seed): rewards/margins (hinge - sigmoid = 0.3, 0.5, 0.4: clear), rewards/accuracies (+0.05, 0,
# +0.1: mean 0.05, sd 0.05, not clear at 3 seeds; a t test finds an effect of 1 sd at 80% power from 10 pairs)
TRAIN = {
    ("sigmoid", 1): (0.2, 0.85),
    ("sigmoid", 2): (0.4, 0.9),
    ("sigmoid", 3): (0.3, 0.8),
    ("hinge", 1): (0.5, 0.9),
    ("hinge", 2): (0.9, 0.9),
    ("hinge", 3): (0.7, 0.9),
}
# eval.json per (loss, seed): eval_rewards/margins (hinge - sigmoid = -0.4, -0.5, -0.3: clear, lower), eval_loss
HELD_OUT = {
    ("sigmoid", 1): (1.0, 0.3),
    ("sigmoid", 2): (1.2, 0.3),
    ("sigmoid", 3): (1.1, 0.3),
    ("hinge", 1): (0.6, 0.1),
    ("hinge", 2): (0.7, 0.1),
    ("hinge", 3): (0.8, 0.1),
}


def ablate(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, "-m", "ablate", *args], cwd=cwd, capture_output=True, text=True, timeout=120, env=ENV
    )
    assert proc.returncode == 0, proc.stderr
    return proc


def write_sweep(
    root: Path, key: str = "method/dpo_loss", values: tuple = ("sigmoid", "hinge"), evaluated: int = 0
) -> Path:
    """A dpo_loss-like sweep (or of another key): 2 arms x 3 seeds, .hydra/config.yaml as `ablate train` writes
    it; the first `evaluated` runs get an eval.json as `ablate eval` writes it."""
    sweep = root / "outputs" / "sweeps" / "s" / "2026-01-01_00-00-00"
    configs = {v: composed("method=dpo", f"{key}={v}") for v in values}
    for num, ((loss, seed), (margin, accuracy)) in enumerate(TRAIN.items()):
        value = values[0] if loss == "sigmoid" else values[1]
        run = write_run(
            sweep,
            num,
            ["sweep_name=s", "method=dpo", f"{key}={value}", f"seed={seed}"],
            {"rewards/margins": margin, "rewards/accuracies": accuracy, "loss": 1.0 - margin},
        )
        (run / ".hydra" / "config.yaml").write_text(yaml.safe_dump({**configs[value], "seed": seed}))
        if num < evaluated:
            margins, loss_value = HELD_OUT[(loss, seed)]
            (run / "eval.json").write_text(
                json.dumps(
                    {
                        "method": "dpo",
                        "split": "eval",
                        "examples": 32,
                        "metrics": {
                            "eval_rewards/margins": margins,
                            "eval_rewards/accuracies": 1.0,
                            "eval_loss": loss_value,
                        },
                    }
                )
            )
    (sweep / "multirun.yaml").write_text("{}\n")
    return sweep


def test_two_losses_rank_the_rewards_not_the_losses(tmp_path: Path) -> None:
    write_sweep(tmp_path)
    out = ablate("compare", "outputs/sweeps/s", cwd=tmp_path).stdout
    assert (
        "not compared: loss is defined by each arm's dpo_loss (sigmoid vs hinge); ranking the others instead "
        "(`ablate eval RUN_DIR` on each run adds held-out ones)"
    ) in out
    assert "95% t interval over the per-seed differences (assumes they are roughly normal" in out
    assert (
        "dpo_loss=hinge − dpo_loss=sigmoid rewards/margins = +0.4 [+0.1516, +0.6484], n=3 pairs: dpo_loss=hinge "
        "higher (95% t interval excludes 0)"
    ) in out
    assert (
        "dpo_loss=hinge − dpo_loss=sigmoid rewards/accuracies = +0.05 [-0.07421, +0.1742], n=3 pairs: no clear "
        "difference (95% t interval includes 0)\n    about 10 seeds per arm would make a difference of this size "
        "clear at 80% power"
    ) in out
    assert "sigmoid loss" not in out and " loss = " not in out  # no paired difference of the two objectives


def test_held_out_metrics_are_preferred_when_every_run_has_them(tmp_path: Path) -> None:
    write_sweep(tmp_path, evaluated=6)
    out = ablate("compare", "outputs/sweeps/s", cwd=tmp_path).stdout
    assert "eval_rewards/margins" in out.split("\n", 3)[2]  # the table's header: held-out columns
    assert (
        "not compared: eval_loss is defined by each arm's dpo_loss (sigmoid vs hinge); ranking the held-out "
        "metrics instead"
    ) in out
    assert (
        "dpo_loss=hinge − dpo_loss=sigmoid eval_rewards/margins = -0.4 [-0.6484, -0.1516], n=3 pairs: "
        "dpo_loss=hinge lower (95% t interval excludes 0)"
    ) in out
    assert "eval_rewards/accuracies = +0 [+0, +0], n=3 pairs: identical in every pair" in out
    assert " rewards/margins = " not in out  # the training metrics gave way


def test_some_runs_evaluated_is_one_table_with_the_missing_cells_marked(tmp_path: Path) -> None:
    """4 of 6 runs evaluated (all 3 sigmoid seeds, 1 hinge seed): the held-out columns sit beside the training
    ones in the same table, hinge's cells over its 1 evaluated run, marked so."""
    write_sweep(tmp_path, evaluated=4)
    out = ablate("compare", "outputs/sweeps/s", cwd=tmp_path).stdout
    assert (
        "held-out metrics (eval.json) in 4 of 6 runs: shown beside the training ones, each cell over the runs "
        "that have it; `ablate eval RUN_DIR` on the others fills them"
    ) in out
    assert out.count("runs in") == 1  # one table
    header = next(line for line in out.splitlines() if line.startswith("┃ group"))
    assert header.index("rewards/margins") < header.index("eval_rewards/margins")
    hinge = next(line for line in out.splitlines() if line.startswith("│ dpo_loss=hinge"))
    assert "0.6 (1 of 3)" in hinge  # its one evaluated seed's eval_rewards/margins
    assert "rewards/margins = +0.4" in out


def test_metric_flag_takes_eval_json_metrics(tmp_path: Path) -> None:
    write_sweep(tmp_path, evaluated=6)
    out = ablate("compare", "outputs/sweeps/s", "--metric", "eval_rewards/margins", cwd=tmp_path).stdout
    assert "eval_rewards/margins = -0.4 [-0.6484, -0.1516]" in out
    proc = subprocess.run(
        [sys.executable, "-m", "ablate", "compare", "outputs/sweeps/s", "--metric", "eval_rewards/margin"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env=ENV,
    )
    assert proc.returncode == 2 and "did you mean --metric eval_rewards/margins?" in proc.stderr


def test_a_beta_sweep_ranks_the_accuracies_not_the_rewards(tmp_path: Path) -> None:
    write_sweep(tmp_path, key="method.args.beta", values=(0.1, 0.5))
    out = ablate("compare", "outputs/sweeps/s", cwd=tmp_path).stdout
    assert (
        "not compared: rewards/margins, loss are defined by each arm's beta (0.1 vs 0.5); ranking the others "
        "instead"
    ) in out
    assert "beta=0.5 − beta=0.1 rewards/accuracies = +0.05" in out and "rewards/margins = +" not in out


@pytest.fixture
def one_seed_arms(tmp_path: Path) -> Path:
    sweep = tmp_path / "outputs" / "sweeps" / "dpo_losses" / "2026-01-01_00-00-00"
    for i, loss in enumerate(["sigmoid", "hinge", "ipo", "robust", "exo_pair", "nca_pair"]):
        write_run(
            sweep,
            i,
            ["sweep_name=dpo_losses", f"method/dpo_loss={loss}", "seed=1"],
            {"tokens_per_second": 100.0 + i, "mfu": 0.01 * i, "loss": 0.5},
        )
    (sweep / "multirun.yaml").write_text("{}\n")
    return tmp_path


def test_too_few_seeds_is_one_line_and_verbose_lists_each(one_seed_arms: Path) -> None:
    out = ablate("compare", "outputs/sweeps/dpo_losses", "--metric", "speed", cwd=one_seed_arms).stdout
    assert out.count("not enough seeds to tell") == 1
    assert (
        "seed-paired differences: not enough seeds to tell for 10 differences (1 pair each; a verdict needs 3): "
        "run at least 3 seeds per arm; --verbose lists each"
    ) in out
    verbose = ablate(
        "compare", "outputs/sweeps/dpo_losses", "--metric", "speed", "--verbose", cwd=one_seed_arms
    ).stdout
    assert verbose.count("n=1 pair: not enough seeds to tell (a t interval needs 3 pairs)") == 10
    report = one_seed_arms / "report"
    ablate(
        "compare", "outputs/sweeps/dpo_losses", "--metric", "speed", "--out", str(report), cwd=one_seed_arms
    )
    assert (report / "report.html").read_text().count("n=1 pair: not enough seeds to tell") == 10
