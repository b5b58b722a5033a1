"""Optimizer and schedule options: every combination composes and binds; schedules by hand; AdamW8bit on CPU.
Also the small pure pieces of issue 5: callbacks' decisions, the compute_metrics hook, precision checks."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from transformers import TrainerControl, TrainerState

from ablate.callbacks import EarlyStop, NaNGuard
from ablate.errors import ConfigError
from ablate.methods.compute_metrics import completion_accuracy
from ablate.methods.schedules import constant, cosine
from ablate.methods.schedules import step as step_schedule
from ablate.paths import conf_dir
from ablate.config.compose import register_resolvers
from ablate.config.machine import check_precision


def _compose(*overrides: str):
    register_resolvers()
    with initialize_config_dir(config_dir=conf_dir(), version_base="1.3"):
        return compose("config", overrides=list(overrides))


def _lrs(sched, opt, n: int) -> list[float]:
    out = []
    for _ in range(n):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


def _opt(lr: float = 1.0) -> torch.optim.Optimizer:
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)


def test_cosine_by_hand():
    """N=10, warmup_ratio=0.2 -> 2 warm-up steps: factors 1/3, 2/3; then 0.5*(1+cos(pi*(s-2)/8)):
    s=2 -> 1, s=6 -> 0.5, s=9 -> 0.5*(1+cos(7pi/8)) = 0.0381."""
    opt = _opt()
    lrs = _lrs(cosine(opt, num_training_steps=10, warmup_ratio=0.2, min_ratio=0.0), opt, 10)
    assert lrs[0] == pytest.approx(1 / 3) and lrs[1] == pytest.approx(2 / 3) and lrs[2] == pytest.approx(1.0)
    assert lrs[6] == pytest.approx(0.5) and lrs[9] == pytest.approx(0.5 * (1 + math.cos(7 * math.pi / 8)))


def test_cosine_min_ratio_floor():
    opt = _opt()
    lrs = _lrs(cosine(opt, num_training_steps=4, warmup_ratio=0.0, min_ratio=0.1), opt, 6)
    assert lrs[3] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 3 / 4)))  # step 3 of 4
    assert lrs[5] == pytest.approx(0.1)  # past the end: stays at the floor


def test_step_and_constant_by_hand():
    """StepLR(step_size=2, gamma=0.1): 1, 1, 0.1, 0.1, 0.01. constant, 3 warm-up steps: 1/4, 2/4, 3/4, 1, 1."""
    opt = _opt()
    assert _lrs(step_schedule(opt, num_training_steps=5, step_size=2, gamma=0.1), opt, 5) == pytest.approx(
        [1, 1, 0.1, 0.1, 0.01]
    )
    opt = _opt()
    assert _lrs(constant(opt, num_training_steps=5, warmup_steps=3), opt, 5) == pytest.approx(
        [0.25, 0.5, 0.75, 1, 1]
    )


@pytest.mark.parametrize("opt_name,cls", [("adamw", "AdamW"), ("sgd", "SGD"), ("adamw_8bit", "AdamW8bit")])
@pytest.mark.parametrize("sched", ["constant", "cosine", "step"])
def test_every_optimizer_and_schedule_composes_and_binds(opt_name, cls, sched):
    cfg = _compose(f"optimizer={opt_name}", f"optimizer/scheduler={sched}")
    assert cfg.optimizer.scheduler._target_ == f"ablate.methods.schedules.{sched}"
    w = torch.nn.Parameter(torch.ones(64, 64))
    opt = instantiate(cfg.optimizer.optimizer)([w])
    sch = instantiate(cfg.optimizer.scheduler)(opt, num_training_steps=10)
    assert type(opt).__name__ == cls
    (w * w).sum().backward()
    opt.step()
    sch.step()
    assert not torch.equal(w.detach(), torch.ones(64, 64))  # it took a step


def test_default_schedules_per_optimizer():
    assert _compose().optimizer.scheduler._target_ == "ablate.methods.schedules.cosine"
    assert _compose("optimizer=sgd").optimizer.scheduler._target_ == "ablate.methods.schedules.constant"


def test_adamw_8bit_tracks_adamw_on_cpu():
    """8-bit state (uint8 moments for tensors >= min_8bit_size) and updates close to torch's AdamW."""
    torch.manual_seed(0)
    init, target = torch.randn(128, 64), torch.randn(128, 64)
    weights = {}
    for name in ("adamw", "adamw_8bit"):
        w = torch.nn.Parameter(init.clone())
        opt = instantiate(_compose(f"optimizer={name}").optimizer.optimizer)([w], lr=1e-2)
        for _ in range(5):
            opt.zero_grad()
            ((w - target) ** 2).sum().backward()
            opt.step()
        weights[name] = w.detach()
        if name == "adamw_8bit":
            assert opt.state[w]["state1"].dtype == torch.uint8
    moved = (weights["adamw"] - init).abs().mean()
    assert moved > 0.04  # 5 Adam steps of ~lr each
    assert (weights["adamw_8bit"] - weights["adamw"]).abs().mean() < 0.05 * moved


def test_precision_checks_on_cpu():
    if torch.cuda.is_available():
        pytest.skip("CPU-only refusals")
    for p in (_compose("precision=fp16").precision, SimpleNamespace(fp16=True, tf32=None)):
        with pytest.raises(ConfigError, match="fp16 needs a CUDA GPU"):
            check_precision(p)
    with pytest.raises(ConfigError, match="tf32"):
        check_precision(_compose("precision.tf32=true").precision)
    for name in ("fp32", "bf16"):
        check_precision(_compose(f"precision={name}").precision)  # accepted


def _log(cb, step: int, **logs) -> TrainerControl:
    control = TrainerControl()
    cb.on_log(None, TrainerState(global_step=step), control, logs=logs)
    return control


def test_nan_guard_raises_with_step():
    g = NaNGuard()
    _log(g, 1, loss=0.5, grad_norm=1.0)
    with pytest.raises(FloatingPointError, match="loss is nan at step 7"):
        _log(g, 7, loss=float("nan"))
    with pytest.raises(FloatingPointError, match="grad_norm is inf"):
        _log(g, 8, loss=0.1, grad_norm=float("inf"))


def test_nan_guard_stops_a_collapsed_run():
    """Issue 32: lr=1e4 (AdamW) or 1e6 (SGD) "completed" with grad_norm 0.0 from step 2 on and a dead model
    saved. No gradient with lr > 0 and a loss that is not 0, twice in a row: stopped in one line."""
    g = NaNGuard()
    _log(g, 1, loss=0.69, grad_norm=0.53, learning_rate=1e4)
    _log(g, 2, loss=0.68, grad_norm=0.0, learning_rate=9e3)
    with pytest.raises(
        FloatingPointError,
        match=r"grad_norm is exactly 0 at steps 2-3 with the loss at 0.6766 and "
        r"learning_rate 8.5e\+03: the model has collapsed",
    ):
        _log(g, 3, loss=0.6766, grad_norm=0.0, learning_rate=8.5e3)
    fine = (
        NaNGuard()
    )  # a finished task (loss exactly 0), warm-up from lr 0, a gradient between: never stopped
    for step, logs in enumerate(
        [
            dict(loss=0.0, grad_norm=0.0, learning_rate=1e-3),
            dict(loss=0.5, grad_norm=0.0, learning_rate=0.0),
            dict(loss=0.4, grad_norm=0.0, learning_rate=1e-3),
            dict(loss=0.0, grad_norm=0.0, learning_rate=1e-3),
            dict(loss=0.3, grad_norm=0.2, learning_rate=1e-3),
            dict(loss=0.3, grad_norm=0.0, learning_rate=1e-3),
            dict(eval_loss=0.3),
        ]
        * 3
    ):
        _log(fine, step, **logs)
    off = NaNGuard(dead_after=0)
    for step in range(5):
        _log(off, step, loss=0.5, grad_norm=0.0, learning_rate=1.0)


def test_early_stop_patience_and_mode():
    es = EarlyStop(metric="eval_loss", mode="min", patience=2, min_delta=0.01)
    decisions = [
        _log(es, s, eval_loss=v).should_training_stop for s, v in enumerate([1.0, 0.9, 0.895, 0.95, 0.5])
    ]
    # 0.9 improves; 0.895 is within min_delta (bad 1); 0.95 (bad 2) -> stop
    assert decisions == [False, False, False, True, False]
    es = EarlyStop(metric="rewards/accuracies", mode="max", patience=1)
    assert not _log(es, 1, **{"rewards/accuracies": 0.5}).should_training_stop
    assert not _log(es, 2, loss=0.1).should_training_stop  # other metrics are ignored
    assert _log(es, 3, **{"rewards/accuracies": 0.4}).should_training_stop
    with pytest.raises(ValueError, match="mode"):
        EarlyStop(mode="up")


def test_completion_accuracy_by_hand():
    """labels [[-100, 5, 6, 7]], argmax [[5, 0, 7, 9]]: positions 0..2 predict 5 (ok), 0 (want 6), 7 (ok) -> 2/3."""
    labels = np.array([[-100, 5, 6, 7]])
    ids = np.array([[5, 0, 7, 9]])
    logits = np.eye(10)[ids]  # one-hot logits: argmax = ids
    for preds in (ids, logits, (logits,)):
        out = completion_accuracy(SimpleNamespace(predictions=preds, label_ids=labels))
        assert out == {"completion_accuracy": pytest.approx(2 / 3)}


def test_trainer_without_configured_optimizer_is_refused():
    """A method's trainer must take the optimizer group (AblateTrainer); a plain Trainer
    subclass would silently train with Trainer's default AdamW instead."""
    from transformers import Trainer

    from ablate.methods import dpo, grpo, sft
    from ablate.config.code_checks import check_trainer_class

    for cls in (dpo.DPOTrainer, sft.SFTTrainer, grpo.GRPOTrainer, type("Mine", (dpo.DPOTrainer,), {})):
        check_trainer_class(cls)  # accepted
    with pytest.raises(ConfigError, match="Plain does not subclass ablate.methods.base.AblateTrainer"):
        check_trainer_class(type("Plain", (Trainer,), {}))


def test_nan_guard_window_of_steps():
    """A log event averages the loss over `logging_steps` but reports the last step's grad_norm: a hinge loss
    whose last step is past its margin logs loss > 0 with grad_norm 0 and is alive (CI: test_hinge_learns was
    stopped as collapsed). Such an event only starts a per-step check; windows with no gradient at all stop it."""
    import torch
    from types import SimpleNamespace

    args = SimpleNamespace(logging_steps=5)
    live, dead = torch.nn.Linear(2, 1), torch.nn.Linear(2, 1)
    for m, g in ((live, 1.0), (dead, 0.0)):
        for p in m.parameters():
            p.grad = torch.full_like(p, g)

    def window(g, model, step):
        for _ in range(5):
            g.on_pre_optimizer_step(args, TrainerState(global_step=step), TrainerControl(), model=model)
        g.on_log(
            args,
            TrainerState(global_step=step),
            TrainerControl(),
            logs=dict(loss=0.11, grad_norm=0.0, learning_rate=1e-3),
        )

    hinge = NaNGuard()
    for step in range(5, 60, 5):
        window(hinge, live, step)  # never stopped: each window had a step with a gradient
    collapsed = NaNGuard()
    window(collapsed, dead, 5)  # unchecked window: only starts the check
    window(collapsed, dead, 10)
    with pytest.raises(FloatingPointError, match="grad_norm is exactly 0 at steps 10-15"):
        window(collapsed, dead, 15)


def test_sweep_overrides_take_hydra_flags_with_values():
    """`ablate sweep dpo_losses ... --cfg job` (the README test's dry form) is Hydra's flag and its value, not a stray word."""
    from ablate.cli.sweep import check_overrides

    check_overrides(["method.args.max_steps=2", "--cfg", "job"], resume=False)
    check_overrides(["-p", "method", "--cfg", "job"], resume=False)
    with pytest.raises(ValueError, match="'job' is not an override"):
        check_overrides(["method.args.max_steps=2", "job"], resume=False)
