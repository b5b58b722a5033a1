"""Training with and without the reuse cache (ablate.data.cache): one sweep of three jobs, the cache
off, on (a miss: computed and stored) and on again (a hit: loaded), gives bitwise the same per-step
losses and metrics, and the same eval metrics at step 0 (the initial policy's forwards, replayed on a
hit: ablate.methods.initial_eval) and after training; run.json records the lookups. The cache's own
rules: tests/unit/test_cache.py."""

from __future__ import annotations

import json

from conftest import ablate, metrics

TIMING = (
    "time",
    "train_runtime",
    "train_tokens_per_second",
    "tokens_per_second",
    "mfu",
    "train_samples_per_second",
    "train_steps_per_second",
)


def test_losses_are_bitwise_equal_with_and_without_the_cache(tmp_path) -> None:
    env = {"ABLATE_CACHE": str(tmp_path / "cache")}
    r = ablate(
        "train",
        "-m",
        "cache=off,on,on",
        "method.args.max_steps=2",
        "method.args.logging_steps=1",
        "method.args.eval_strategy=steps",
        "method.args.eval_steps=2",
        "method.args.eval_on_start=true",
        "hydra.sweep.dir=sweep",
        cwd=tmp_path,
        env=env,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    runs = [next((tmp_path / "sweep").glob(f"{i}_cache-{c}-*")) for i, c in enumerate(("off", "on", "on"))]
    steps = [
        [
            {k: v for k, v in e.items() if k not in TIMING and not k.endswith(("_runtime", "_per_second"))}
            for e in metrics(d)
            if "loss" in e or "eval_loss" in e
        ]
        for d in runs
    ]
    assert [("eval_loss" in e, e["step"]) for e in steps[0]] == [(True, 0), (False, 1), (False, 2), (True, 2)]
    assert all("rewards/chosen" in e for e in steps[0] if "loss" in e)
    assert steps[0][0]["eval_logps/chosen"] < 0 and steps[0][0]["eval_entropy"] > 0  # forwards that ran
    assert steps[1] == steps[0] and steps[2] == steps[0]  # floats compared exactly (JSON keeps every bit)
    records = [json.loads((d / "run.json").read_text())["cache"] for d in runs]
    assert records[0]["enabled"] is False and records[0]["hits"] == records[0]["misses"] == 0
    # tokenized train and eval pairs, their reference log-probs, the initial policy's eval forwards
    assert (records[1]["hits"], records[1]["misses"]) == (0, 5)
    assert (records[2]["hits"], records[2]["misses"]) == (5, 0)
    whats = [e["what"] for e in records[2]["launches"][-1]]
    assert (
        whats[:2] == ["tokenized train pairs", "tokenized eval pairs"]
        and whats[2] == "reference log-probs of 24 train pairs"
    )
    assert whats[3].startswith("reference log-probs of ") and whats[3].endswith(" eval pairs")
    assert whats[4].startswith(
        "the initial policy's forwards of "
    )  # only step 0's eval: the weights are the initial ones
    assert "cache: reference log-probs of 24 train pairs loaded" in r.stdout
    assert "cache: the initial policy's forwards of " in r.stdout
    # each job of a sweep says its speed plan in one line (the table, 7 lines a job before, is in its run dir)
    assert r.stdout.count("speed plan: policy 4/4 paths on; table: speed_plan.txt in the run dir") == 3
    assert "Speed plan, policy" not in r.stdout
    assert all((d / "speed_plan.txt").read_text().startswith("Speed plan, policy (llama") for d in runs)
