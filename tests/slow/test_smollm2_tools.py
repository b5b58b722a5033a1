"""GRPO with tools on a real chat model (issue 36): SmolLM2-135M-Instruct, whose chat template has no tool format,
gets the calculator in the hermes format (ablate.rollouts.tool_calls); a few SFT steps on demonstrations rendered the same
way (+experiment=smollm2_calc_tools_sft), then GRPO (+experiment=smollm2_calc_tools) whose rollouts call it."""

from __future__ import annotations

import pytest
from conftest import ablate, metrics, summary

pytestmark = pytest.mark.slow


def test_smollm2_calls_the_calculator_in_the_hermes_format(tmp_path):
    r = ablate("train", "+experiment=smollm2_calc_tools_sft", "hydra.run.dir=sft", cwd=tmp_path, timeout=3600)
    assert r.returncode == 0, r.stderr[-3000:]
    r = ablate(
        "train",
        "+experiment=smollm2_calc_tools",
        "model.path=sft/model",
        "hydra.run.dir=grpo",
        "method.args.max_steps=2",  # of the experiment's 4: every step's rollouts are checked, two show it (CI's time)
        cwd=tmp_path,
        timeout=3600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert summary(tmp_path / "grpo")["status"] == "completed"
    assert "tool_call_format=hermes" in (tmp_path / "grpo" / "ablate.log").read_text()
    events = [e for e in metrics(tmp_path / "grpo") if "reward" in e]
    assert len(events) == 2 and all(e["tools/call_frequency"] > 0 for e in events), events
    assert sum(e["tools/failure_frequency"] for e in events) / len(events) < 0.5  # the calls it writes run
