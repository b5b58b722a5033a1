"""`ablate compare` on arms of different methods (sweeps/preference_methods.yaml): the metrics every arm
logs are in the table, the others listed per arm; `loss`, each method's own objective, is not ranked
between them. Run dirs written by hand, so every number is known."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ablate.analysis import compare

# (method, its compare_metrics as its YAML names them, final metrics per seed)
ARMS = {
    "dpo": (
        ["rewards/accuracies", "rewards/margins", "loss"],
        {
            1: {"rewards/accuracies": 0.9, "rewards/margins": 2.0, "loss": 0.3},
            2: {"rewards/accuracies": 1.0, "rewards/margins": 3.0, "loss": 0.2},
        },
    ),
    "kto": (
        ["rewards/margins", "kl", "loss"],
        {
            1: {"rewards/margins": 1.0, "kl": 0.5, "loss": 0.4},
            2: {"rewards/margins": 1.5, "kl": 0.7, "loss": 0.35},
        },
    ),
    "reward": (
        ["accuracy", "margin", "loss"],
        {
            1: {"accuracy": 0.95, "margin": 4.0, "loss": 0.1},
            2: {"accuracy": 0.975, "margin": 5.0, "loss": 0.15},
        },
    ),
}


@pytest.fixture
def sweep_dir(tmp_path: Path) -> Path:
    root = tmp_path / "preference_methods" / "2026-01-01_00-00-00"
    num = 0
    for method, (names, seeds) in ARMS.items():
        for seed, final in seeds.items():
            overrides = ["sweep_name=preference_methods", f"method={method}", f"seed={seed}"]
            run = root / f"{num}_method={method},seed={seed}"
            (run / ".hydra").mkdir(parents=True)
            (run / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
            (run / "summary.json").write_text(
                json.dumps(
                    {
                        "status": "completed",
                        "method": method,
                        "overrides": overrides,
                        "global_step": 2,
                        "compare_metrics": names,
                        "train_runtime": 1.0,
                        "metrics": final,
                    }
                )
            )
            (run / "metrics.jsonl").write_text(
                "".join(
                    json.dumps({"step": s, "time": s, **{k: v * s / 2 for k, v in final.items()}}) + "\n"
                    for s in (1, 2)
                )
            )
            num += 1
    (root / "multirun.yaml").write_text("{}\n")
    return root


def test_shared_metrics_are_compared_the_rest_listed(sweep_dir: Path, tmp_path: Path, capsys) -> None:
    rows = compare.compare([sweep_dir], out=tmp_path / "report")
    out = capsys.readouterr().out
    assert [r["group"] for r in rows] == ["method=dpo", "method=kto", "method=reward"]
    # loss is every arm's, so in the table, but each method's own objective: not ranked between them
    assert [c for c in rows[0] if c.endswith(" mean")] == ["loss mean", "runtime_s mean"]
    assert rows[2]["loss mean"] == pytest.approx(0.125)
    assert (
        "not compared: loss is defined by each arm's method (dpo, kto, reward); nothing left to rank "
        "(`ablate eval RUN_DIR` on each run adds held-out metrics)"
    ) in out
    assert "seed-paired differences" not in out and "−" not in out
    # the others are listed per arm with their values, not compared
    listed = out.split("not every arm logs these (listed, not compared):")[1]
    assert "method=dpo: rewards/accuracies 0.95 ± 0.071, rewards/margins 2.5 ± 0.71" in listed
    assert "method=kto: rewards/margins 1.25 ± 0.35, kl 0.6 ± 0.14" in listed
    assert "method=reward: accuracy 0.9625 ± 0.018, margin 4.5 ± 0.71" in listed
    # plots for every metric: an arm without it has no line
    pngs = {p.name for p in (tmp_path / "report").glob("*.png")}
    assert {
        "loss_vs_step.png",
        "rewards_margins_vs_step.png",
        "accuracy_vs_step.png",
        "kl_vs_step.png",
    } <= pngs


def test_one_method_compares_every_metric(sweep_dir: Path, capsys) -> None:
    rows = compare.compare([p for p in sweep_dir.iterdir() if "method=dpo" in p.name])
    assert {"rewards/accuracies mean", "rewards/margins mean", "loss mean"} <= set(rows[0])
    out = capsys.readouterr().out
    assert "not every arm logs these" not in out and "not compared" not in out
