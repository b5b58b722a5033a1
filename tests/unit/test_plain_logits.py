"""The plain path's logits on a mixed-precision run (issue 33 B): the trainers call the model's forward as
accelerate wrapped it but without its conversion of the outputs to float32 (ablate.methods.forward), so
the logits they read are bf16, never a float32 copy of [rows, T, vocab]; the numbers are the same bits
(an upcast is exact, and the log-probs are taken in float32 either way). bf16 autocast on a CPU."""

from __future__ import annotations

import pytest
import torch
from datasets import Dataset

from ablate.losses import logps
from ablate.methods import dpo, grpo, sft
from ablate.methods.dpo import DPOConfig, DPOTrainer
from ablate.methods.grpo import GRPOConfig, GRPOTrainer
from ablate.methods.sft import SFTConfig, SFTTrainer
from ablate.models import tiny
from ablate.speed.plan import SpeedSwitches

ROWS = [
    {"prompt": "sort: cba =", "chosen": " abc", "rejected": " bac"},
    {"prompt": "sort: hgfedcba =", "chosen": " abcdefgh", "rejected": " hg"},
] * 2


def _trainer(method: str, tmp_path):
    tok, model = tiny()
    common = dict(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        max_steps=2,
        learning_rate=1e-3,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        use_cpu=True,
        bf16=True,
        disable_tqdm=True,
    )
    if method == "dpo":
        return DPOTrainer(
            model=model,
            args=DPOConfig(**common),
            train_dataset=Dataset.from_list(ROWS),
            processing_class=tok,
            perf=SpeedSwitches.off(),
        )
    if method == "sft":
        rows = [{"prompt": r["prompt"], "completion": r["chosen"]} for r in ROWS]
        return SFTTrainer(
            model=model,
            args=SFTConfig(**common),
            train_dataset=Dataset.from_list(rows),
            processing_class=tok,
            perf=SpeedSwitches.off(),
        )
    return GRPOTrainer(
        model=model,
        args=GRPOConfig(**{**common, "num_generations": 2, "max_completion_length": 4}),
        train_dataset=Dataset.from_dict({"prompt": ["ab", "cd"] * 2}),
        processing_class=tok,
        reward_funcs={"len": lambda completions, **_: [float(len(c)) for c in completions]},
        perf=SpeedSwitches.off(),
    )


@pytest.mark.parametrize("method", ["dpo", "sft", "grpo"])
def test_plain_path_reads_bf16_logits_with_the_same_losses(tmp_path, monkeypatch, method):
    seen: list[torch.dtype] = []
    apply = logps.LogitsLogps.apply

    def record(
        x, *a
    ):  # the training forwards' logits (a reference precomputed before training is not wrapped yet)
        if torch.is_grad_enabled():
            seen.append(x.dtype)
        return apply(x, *a)

    monkeypatch.setattr(logps.LogitsLogps, "apply", record)
    lean = _trainer(method, tmp_path / "lean")
    lean.train()
    assert seen and set(seen) == {torch.bfloat16}
    module = {"dpo": dpo, "sft": sft, "grpo": grpo}[method]
    monkeypatch.setattr(
        module, "unconverted", lambda accelerator, model: model
    )  # accelerate's float32 outputs
    seen.clear()
    converted = _trainer(method, tmp_path / "converted")
    converted.train()
    assert set(seen) == {torch.float32}
    losses = [[e["loss"] for e in t.state.log_history if "loss" in e] for t in (lean, converted)]
    assert len(losses[0]) == 2 and losses[0] == losses[1]
