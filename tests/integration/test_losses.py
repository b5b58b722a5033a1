"""Picking a loss through config, as a user does (issue 9 A): a user's loss is one function + one YAML
in their config dir; `method/dpo_loss=NAME` selects it; the old `method.args.loss_type` spelling is one
line naming the new one. Runs the CLI from a scratch cwd with the default output dirs."""

from __future__ import annotations

import json
import os
import re

import pytest
from conftest import TESTS, ablate, metrics, summary

FAST = ("method.args.max_steps=3", "method.args.logging_steps=1", "data.max_train_samples=24")

MY_LOSS = '''
def squared(logp_c, logp_r, ref_c, ref_r, n_c, n_r, beta, target=1.0):
    """(per-token-mean margin - target/(2 beta))^2; with target=1 this is ablate's ipo."""
    delta = (logp_c - ref_c) / n_c.clamp(min=1) - (logp_r - ref_r) / n_r.clamp(min=1)
    return (delta - target / (2 * beta)) ** 2, {}
'''
MY_YAML = """_target_: my_losses.squared
_partial_: true                     # the trainer calls it with the log-probs, token counts and beta
target: 1.0                         # the margin to regress onto, in units of 1/(2 beta)
"""


def test_a_users_loss_is_a_function_and_a_yaml(tmp_path):
    """The docs' example (docs/extending.md section 1) with target=1 is IPO: the same losses step by step
    as `method/dpo_loss=ipo`; with target=2 it is not."""
    (tmp_path / "my_losses.py").write_text(MY_LOSS)
    (tmp_path / "my_conf" / "method" / "dpo_loss").mkdir(parents=True)
    (tmp_path / "my_conf" / "method" / "dpo_loss" / "squared.yaml").write_text(MY_YAML)
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), str(TESTS), os.environ.get("PYTHONPATH", "")])}
    r = ablate(
        "train",
        "-m",
        "--config-dir",
        "my_conf",
        "method/dpo_loss=squared",
        "method.dpo_loss.target=1.0,2.0",
        *FAST,
        cwd=tmp_path,
        env=env,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    jobs = [p for p in (tmp_path / "outputs" / "sweeps" / "multirun").glob("*/*_*") if p.is_dir()]
    done = {
        o: p
        for p in jobs
        if summary(p)["status"] == "completed"
        for o in summary(p)["overrides"]
        if "target" in o
    }
    assert sorted(done) == ["method.dpo_loss.target=1.0", "method.dpo_loss.target=2.0"]
    ipo = ablate("train", "method/dpo_loss=ipo", *FAST, cwd=tmp_path)
    assert ipo.returncode == 0, ipo.stderr[-2000:]
    (ipo_dir,) = [
        p.parent
        for p in (tmp_path / "outputs" / "runs").glob("*/*/run.json")
        if "method/dpo_loss=ipo" in json.loads(p.read_text())["overrides"]
    ]
    losses = {k: [e["loss"] for e in metrics(p) if "loss" in e] for k, p in done.items()}
    ipo_losses = [e["loss"] for e in metrics(ipo_dir) if "loss" in e]
    assert len(ipo_losses) == 3
    assert losses["method.dpo_loss.target=1.0"] == pytest.approx(ipo_losses, abs=1e-6)
    assert losses["method.dpo_loss.target=2.0"][0] != pytest.approx(ipo_losses[0], abs=1e-3)


@pytest.mark.parametrize(
    "args,needle",
    [
        (
            ["train", "method.args.loss_type=hinge"],
            "ablate: error: unknown config key 'method.args.loss_type'",
        ),
        (
            ["train", "method=grpo", "method.args.scale_rewards=batch"],
            "ablate: error: unknown config key 'method.args.scale_rewards': 'scale_rewards' is picked by the config group "
            "method/grpo_scale_rewards: write method/grpo_scale_rewards=batch (options: conf/method/grpo_scale_rewards/)",
        ),
        (
            [
                "train",
                "method=grpo",
                "method.trainer.generator._target_=ablate.rollouts.generation.HFGenerator",
            ],
            "ablate: error: unknown config key 'method.trainer.generator._target_'",
        ),
        # an old-style sweep file (name/params/overrides) is refused in one line: sweeps are Hydra configs now
        (
            ["sweep", "old.yaml"],
            "ablate: error: ablate sweep: old.yaml is an old-style sweep file (top-level params:)",
        ),
        (
            ["train", "method=grpo", "method/dpo_loss=hinge"],
            "ablate: error: method/dpo_loss=hinge: this config has no config "
            "group method/dpo_loss (options of method that have it: cpo, dpo,",
        ),
    ],
)
def test_old_spelling_and_wrong_method_are_one_line(tmp_path, args, needle):
    (tmp_path / "old.yaml").write_text(
        "# an old sweep file\nname: old\nparams:\n  method.args.loss_type: sigmoid,hinge\n"
    )
    r = ablate(*args, cwd=tmp_path)
    assert r.returncode == 2
    lines = re.findall(r"ablate: error: [^\r\n]*", r.stderr)
    assert len(lines) == 1 and lines[0].startswith(needle) and "Traceback" not in r.stderr, r.stderr[-2000:]
