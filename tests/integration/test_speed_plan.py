"""The speed plan from the command line: `ablate train` from a scratch dir prints it as one line when
training starts (a sweep's every job prints it: a table each was 7+ lines a job), writes its table to
the run dir (speed_plan.txt), prints the table with `speed.show=true` (GRPO: under its batch geometry)
and records it in run.json; `speed=off` (every speed
path off: TRL's layout, transformers' own modules) trains to the same losses as the default, step for
step, and says so in its plan."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import ablate, metrics

STEPS = ["method.args.max_steps=3", "method.args.logging_steps=1", "method.args.save_strategy=no"]
ENV = {"OMP_NUM_THREADS": "1"}


def _train(cwd: Path, *overrides: str) -> tuple[Path, str]:
    r = ablate("train", *STEPS, *overrides, cwd=cwd, env=ENV)
    assert r.returncode == 0, r.stderr[-3000:]
    return Path(r.stdout.split("run dir: ")[-1].strip()), r.stdout


def _plan(run_dir: Path) -> dict:
    return json.loads((run_dir / "run.json").read_text())["speed_plan"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, tuple[Path, str]]:
    cwd = tmp_path_factory.mktemp("scratch")
    grpo = ["method=grpo", "method.args.per_device_train_batch_size=16"]
    return {
        "dpo": _train(cwd),
        "dpo_off": _train(cwd, "speed=off"),
        "grpo": _train(cwd, *grpo, "method.args.beta=0.04", "speed.show=true"),
        "grpo_off": _train(cwd, *grpo, "method.args.beta=0.04", "speed=off"),
    }


def test_the_plan_is_one_line_its_table_in_the_run_dir_and_recorded(runs):
    run_dir, out = runs["dpo"]
    assert "Speed plan, policy" not in out  # the table is not printed by default
    lines = [line for line in out.splitlines() if "speed plan" in line.lower() or "speed.show" in line]
    assert lines == [
        "speed plan: policy 4/4 paths on; table: speed_plan.txt in the run dir, or speed.show=true"
    ]
    text = (run_dir / "speed_plan.txt").read_text()
    assert (
        text.count("Speed plan, policy (llama, attention sdpa, cpu, fp32, no wrapper; switches: speed.*)")
        == 1
    )
    table = text[text.index("Speed plan, policy") :].splitlines()[1:6]
    assert [line.split()[:3] for line in table[1:]] == [
        [name, "on", "yes"]
        for name in ("dpo_pair_rows", "padding_free", "completion_only_logits", "lean_layers")
    ]
    plan = _plan(run_dir)
    assert list(plan) == ["policy"]  # the reference log-probs are precomputed: no reference model
    assert plan["policy"]["setting"]["wrapper"] is None and plan["policy"]["setting"]["device"] == "cpu"
    assert all(p["on"] and p["requested"] for p in plan["policy"]["paths"].values())


def test_grpo_prints_its_plan_under_the_batch_geometry(runs):
    """GRPO with beta > 0 keeps a reference model: its plan (scoring paths only) is printed (speed.show=true: the
    tables, not the line) and recorded too."""
    run_dir, out = runs["grpo"]
    assert out.count("Speed plan, policy") == 1 and "speed plan: " not in out
    geometry, policy, reference = (
        out.index(s) for s in ("GRPO batch geometry", "Speed plan, policy", "Speed plan, reference")
    )
    assert geometry < policy < reference
    plan = _plan(run_dir)
    assert set(plan["policy"]["paths"]) == {
        "grpo_group_rows",
        "padding_free",
        "completion_only_logits",
        "length_groups",
        "shared_prefill",
        "lean_layers",
    }
    assert set(plan["reference"]["paths"]) == {
        "grpo_group_rows",
        "padding_free",
        "completion_only_logits",
        "length_groups",
    }
    assert all(p["on"] for p in plan["policy"]["paths"].values())


@pytest.mark.parametrize("method", ["dpo", "grpo"])
def test_perf_off_is_the_plain_path_with_the_same_losses(runs, method):
    fast, _ = runs[method]
    plain, out = runs[f"{method}_off"]
    paths = _plan(plain)["policy"]["paths"]
    assert paths and all(not p["on"] and p["why"] == f"speed.{name}=false" for name, p in paths.items())
    if method == "dpo":  # all off: the one line says how many, not which
        assert "speed plan: policy 0/4 paths on; table: speed_plan.txt" in out
    assert "lean layers" not in out  # transformers' own modules
    pick = lambda run, k: [e[k] for e in metrics(run) if k in e]  # noqa: E731
    # GRPO's logged loss is ~0 here (no reward yet, Trainer rounds to 4 decimals): its entropy comes from
    # the same scored log-probs, step by step on new samples, and its kl from the reference model's
    keys = ["loss"] if method == "dpo" else ["loss", "entropy", "kl"]
    varies = "loss" if method == "dpo" else "entropy"
    assert len(pick(fast, varies)) == 3 and len(set(pick(fast, varies))) == 3
    for key in keys:
        assert pick(plain, key) == pytest.approx(pick(fast, key), rel=1e-5, abs=1e-6), key
    if method == "grpo":  # the same samples: the shared-prefill generator draws what model.generate draws
        assert pick(plain, "reward") == pick(fast, "reward")
