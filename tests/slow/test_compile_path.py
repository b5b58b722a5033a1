"""`speed.compile=true` (issue 33): each decoder layer through torch.compile gives the eager layers' numbers.
Three DPO optimizer steps on the tiny model with every default speed path on, compiled and not: every
logged loss equal to float rounding. The compile takes ~80 s on 2 cores: slow suite."""

from __future__ import annotations

import pytest
from datasets import Dataset

from ablate.methods.dpo import DPOTrainer
from ablate.models import tiny
from ablate.speed.plan import SpeedSwitches
from tiny_setups import dpo_config

pytestmark = pytest.mark.slow

ROWS = [
    {"prompt": "sort: cba =", "chosen": " abc", "rejected": " bac"},
    {"prompt": "sort: hgfedcba =", "chosen": " abcdefgh", "rejected": " hg"},
    {"prompt": "s:", "chosen": " cd", "rejected": " dcxyzwvu"},
] * 2


def _losses(tmp_path, name: str, perf: SpeedSwitches) -> tuple[list[float], DPOTrainer]:
    tok, model = tiny()
    args = dpo_config(tmp_path / name)
    trainer = DPOTrainer(
        model=model, args=args, train_dataset=Dataset.from_list(ROWS), processing_class=tok, perf=perf
    )
    trainer.train()
    return [e["loss"] for e in trainer.state.log_history if "loss" in e], trainer


def test_compiled_layers_give_the_eager_losses(tmp_path):
    eager, _ = _losses(tmp_path, "eager", SpeedSwitches())
    compiled, trainer = _losses(tmp_path, "compiled", SpeedSwitches(compile=True))
    assert trainer.speed_plan.on("compile")
    assert all(
        hasattr(layer, "_compiled_call_impl") and layer._compiled_call_impl is not None
        for layer in trainer.model.model.layers
    )
    assert len(eager) == 3 and len(set(eager)) == 3
    assert compiled == pytest.approx(eager, rel=1e-5, abs=1e-6)
