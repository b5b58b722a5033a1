"""Training with and without the reuse cache (ablate.data.cache): one sweep of three jobs, the cache
off, on (a miss: computed and stored) and on again (a hit: loaded), gives bitwise the same per-step
losses and metrics; run.json records the lookups. The cache's own rules: tests/unit/test_cache.py."""

from __future__ import annotations

import json

from conftest import ablate, metrics

TIMING = ("time", "train_runtime", "train_tokens_per_second", "tokens_per_second", "mfu", "train_samples_per_second",
          "train_steps_per_second")


def test_losses_are_bitwise_equal_with_and_without_the_cache(tmp_path) -> None:
    env = {"ABLATE_CACHE": str(tmp_path / "cache")}
    r = ablate("train", "-m", "cache=off,on,on", "method.args.max_steps=2", "method.args.logging_steps=1",
               "hydra.sweep.dir=sweep", cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    runs = [tmp_path / "sweep" / d for d in ("0_cache=off", "1_cache=on", "2_cache=on")]
    steps = [[{k: v for k, v in e.items() if k not in TIMING} for e in metrics(d) if "loss" in e] for d in runs]
    assert len(steps[0]) == 2 and all("rewards/chosen" in e for e in steps[0])
    assert steps[1] == steps[0] and steps[2] == steps[0]  # floats compared exactly (JSON keeps every bit)
    records = [json.loads((d / "run.json").read_text())["cache"] for d in runs]
    assert records[0]["enabled"] is False and records[0]["hits"] == records[0]["misses"] == 0
    assert (records[1]["hits"], records[1]["misses"]) == (0, 2)  # tokenized pairs, reference log-probs
    assert (records[2]["hits"], records[2]["misses"]) == (2, 0)
    assert [e["what"] for e in records[2]["launches"][-1]] == ["tokenized train pairs",
                                                                "reference log-probs of 24 train pairs"]
    assert "cache: reference log-probs of 24 train pairs loaded" in r.stdout
