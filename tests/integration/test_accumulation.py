"""Gradient accumulation is exact: batch 8 x accum 1 and batch 2 x accum 4 log the same losses and
gradient norms, step for step, for DPO and SFT.

Why they can match: the sampler's order depends only on data_seed, so the 4 micro-batches of 2 are
the same 8 examples. DPO's loss is a per-pair mean per micro-batch and Trainer divides it by the
accumulation steps (no `labels` -> no num_items_in_batch); SFT's token-mean divides by the token
count of the whole accumulated batch (num_items_in_batch), so neither depends on the split."""

from __future__ import annotations

import pytest
from conftest import ablate, metrics

EXPERIMENT = "# @package _global_\nmethod:\n  args:\n    per_device_train_batch_size: {b}\n    gradient_accumulation_steps: {a}\n"


def test_batch8_equals_batch2_accum4(tmp_path):
    conf = tmp_path / "conf" / "experiment"
    conf.mkdir(parents=True)
    (conf / "b8a1.yaml").write_text(EXPERIMENT.format(b=8, a=1))
    (conf / "b2a4.yaml").write_text(EXPERIMENT.format(b=2, a=4))
    out = tmp_path / "sweep"
    r = ablate(
        "train",
        "-m",
        "method=dpo,sft",
        "+experiment=b8a1,b2a4",
        "method.args.max_steps=3",
        "method.args.logging_steps=1",
        "data.max_train_samples=32",
        f"hydra.searchpath=[file://{tmp_path / 'conf'}]",
        f"hydra.sweep.dir={out}",
        "hydra.sweep.subdir=${hydra.job.num}",
    )
    assert r.returncode == 0, r.stderr[-3000:]
    # job order: (dpo, b8a1), (dpo, b2a4), (sft, b8a1), (sft, b2a4)
    for big, small in (("0", "1"), ("2", "3")):
        a = [e for e in metrics(out / big) if "loss" in e]
        b = [e for e in metrics(out / small) if "loss" in e]
        assert len(a) == len(b) == 3
        for ea, eb in zip(a, b):
            assert eb["loss"] == pytest.approx(ea["loss"], rel=1e-5, abs=1e-6)
            assert eb["grad_norm"] == pytest.approx(ea["grad_norm"], rel=1e-4)
        assert a[0]["loss"] != a[-1]["loss"]  # it trained: later steps really depend on the updates
