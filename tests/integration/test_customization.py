"""The customization surface end to end (issue 5): optimizer/schedule options, precision refusals,
NaN guard, live/quantized DPO references, quantized-policy refusal, eval with a compute_metrics hook,
early stopping and the printing callback. Multiruns (-m) share one process start between options."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch
from conftest import ablate, metrics, summary

FAST = ("method.args.max_steps=2", "method.args.logging_steps=1", "data.max_train_samples=32")


def _sweep(tmp: Path, *overrides: str) -> Path:
    r = ablate("train", "-m", *overrides, f"hydra.sweep.dir={tmp}", "hydra.sweep.subdir=${hydra.job.num}")
    assert r.returncode == 0, r.stderr[-3000:]
    (tmp / "stdout.txt").write_text(r.stdout)
    return tmp


def _error_line(stderr: str) -> str:
    lines = re.findall(r"ablate: error: [^\r\n]*", stderr)  # tqdm may share the line (\r)
    assert len(lines) == 1 and "Traceback" not in stderr, stderr[-2000:]
    return lines[0]


def _col(run: Path, key: str) -> list[float]:
    return [e[key] for e in metrics(run) if key in e]


def test_optimizers_and_step_schedule(tmp_path):
    out = _sweep(
        tmp_path,
        "optimizer=adamw_8bit,sgd",
        "optimizer/scheduler=step",
        "optimizer.scheduler.step_size=1",
        "optimizer.scheduler.gamma=0.5",
        *FAST,
    )
    for job in ("0", "1"):
        assert summary(out / job)["status"] == "completed"
        lr = _col(out / job, "learning_rate")
        assert len(lr) == 2 and lr[1] == pytest.approx(0.5 * lr[0])  # StepLR halves it every step
        assert all(math.isfinite(x) for x in _col(out / job, "loss"))


def test_sgd_and_cosine_reach_the_trainer(tmp_path):
    """optimizer=sgd, optimizer/scheduler=cosine, epoch-based: 32 rows / batch 8 = 4 optimizer steps,
    a number only Trainer knows when it builds the schedule (AblateTrainer.create_scheduler).
    The logged lr is cosine over exactly those 4 steps, and the checkpoint's optimizer is SGD."""
    lr0 = 0.05
    r = ablate(
        "train",
        "optimizer=sgd",
        f"optimizer.optimizer.lr={lr0}",
        "optimizer/scheduler=cosine",
        "optimizer.scheduler.warmup_ratio=0",
        "method.args.max_steps=-1",
        "method.args.num_train_epochs=1",
        "data.max_train_samples=32",
        "method.args.logging_steps=1",
        "method.args.save_steps=4",
        f"hydra.run.dir={tmp_path}/run",
    )
    assert r.returncode == 0, r.stderr[-3000:]
    run = tmp_path / "run"
    # the lr step s+1 trained with: lr0 * 0.5 * (1 + cos(pi * s / 4)); with N=5 steps the second would be 0.90 lr0
    assert _col(run, "learning_rate") == pytest.approx(
        [lr0 * 0.5 * (1 + math.cos(math.pi * s / 4)) for s in range(4)]
    )
    state = torch.load(run / "checkpoints" / "checkpoint-4" / "optimizer.pt", weights_only=True)
    group = state["param_groups"][0]
    assert "momentum" in group and "betas" not in group  # SGD's fields, not AdamW's
    assert group["momentum"] == 0.9 and group["initial_lr"] == lr0
    assert all("momentum_buffer" in s for s in state["state"].values())
    assert summary(run)["global_step"] == 4


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-only refusals")
@pytest.mark.parametrize(
    "override,needle", [("precision=fp16", "fp16 needs a CUDA GPU"), ("precision.tf32=true", "tf32")]
)
def test_gpu_only_precision_refused_on_cpu(tmp_path, override, needle):
    r = ablate("train", override, f"hydra.run.dir={tmp_path}/run")
    assert r.returncode == 2
    assert needle in _error_line(r.stderr)
    assert not (
        tmp_path / "run"
    ).exists()  # a config mistake: refused before the run dir exists (docs/errors.md)


def test_nan_guard_fails_the_run_with_a_clear_message(tmp_path):
    # lr 1e30 blows the weights up after the first step: the second step's grad_norm is nan
    r = ablate(
        "train",
        "optimizer=sgd",
        "optimizer.optimizer.lr=1e30",
        "method.args.max_steps=3",
        "method.args.logging_steps=1",
        f"hydra.run.dir={tmp_path}/run",
    )
    assert r.returncode == 2, r.stderr[-2000:]
    assert "NaNGuard" in _error_line(r.stderr)
    s = summary(tmp_path / "run")
    assert s["status"] == "failed" and "NaNGuard" in s["error"] and "at step" in s["error"]


def test_reference_models_live_8bit_4bit(tmp_path):
    out = _sweep(tmp_path, "+ref_model=live,live_8bit,live_4bit", *FAST)
    first = {job: metrics(out / job)[0] for job in ("0", "1", "2")}
    for job in first:
        assert summary(out / job)["status"] == "completed"
    # full-precision live reference == the initial policy: zero rewards, loss exactly ln 2 at step 1
    assert first["0"]["rewards/chosen"] == 0.0 and first["0"]["loss"] == pytest.approx(math.log(2), abs=1e-6)
    for job in ("1", "2"):  # quantized reference: close to, but not exactly, the policy
        assert first[job]["rewards/chosen"] != 0.0
        assert first[job]["loss"] == pytest.approx(math.log(2), abs=2e-3)


def test_quantized_policy_refused(tmp_path):
    from ablate.models import tiny

    tok, model = tiny()
    model.save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    r = ablate(
        "train",
        "model=local",
        f"model.path={tmp_path / 'm'}",
        "+model.quantization_config._target_=transformers.BitsAndBytesConfig",
        "+model.quantization_config.load_in_8bit=true",
        f"hydra.run.dir={tmp_path}/run",
    )
    assert r.returncode == 2, r.stderr[-2000:]
    assert "quantized" in _error_line(r.stderr)


def test_eval_compute_metrics_early_stop_and_print_logs(tmp_path):
    out = _sweep(
        tmp_path,
        "method=dpo,sft",
        "method.args.max_steps=30",
        "method.args.logging_steps=1",
        "method.args.eval_strategy=steps",
        "method.args.eval_steps=1",
        "data.max_eval_samples=16",
        "+compute_metrics=completion_accuracy",
        "callbacks=[default,early_stop,print_logs]",
        "callbacks.early_stop.metric=eval_loss",
        "callbacks.early_stop.mode=max",  # eval_loss falls: never "improves"
        "callbacks.early_stop.patience=2",
    )
    for job in ("0", "1"):
        run = out / job
        assert summary(run)["status"] == "completed"
        assert summary(run)["global_step"] == 3  # best at eval 1, no improvement at 2 and 3 -> stopped
        evals = [e for e in metrics(run) if "eval_loss" in e]
        assert len(evals) == 3 and all(0 <= e["eval_completion_accuracy"] <= 1 for e in evals)
        assert not any(
            k.startswith("eval_") for e in metrics(run) if "loss" in e for k in e
        )  # train events unprefixed
    assert "Step 1: {" in (out / "stdout.txt").read_text()  # PrintLogs, the docs' on_log example
    sft_evals = [e for e in metrics(out / "1") if "eval_loss" in e]
    for e in sft_evals:  # two independent implementations of completion-token accuracy agree
        assert e["eval_completion_accuracy"] == pytest.approx(e["eval_mean_token_accuracy"], abs=1e-6)
