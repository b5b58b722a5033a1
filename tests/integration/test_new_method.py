"""A new DPO-family method, added from a user's own files alone: a loss function with a setting of its own in a
module on PYTHONPATH, its option and its method in a `--config-dir` (nothing in ablate's tree). Its setting is a
typed config key whose default is the function's own (hydra_plugins.ablate_schemas builds the node from its
signature), `ablate plan` counts it as the DPO family it inherits, and a bad value is one line before any run
dir exists."""

from __future__ import annotations

import math
import re

import pytest

from conftest import ablate, metrics

LOSS = '''from typing import Annotated

import torch.nn.functional as F
from annotated_types import Ge


def margin_sigmoid(logp_c, logp_r, ref_c, ref_r, n_c, n_r, beta: float, margin: Annotated[float, Ge(0)] = 0.5):
    """DPO's sigmoid loss with a target margin (as SimPO's gamma): -log sigmoid(beta * delta - margin)."""
    return -F.logsigmoid(beta * ((logp_c - ref_c) - (logp_r - ref_r)) - margin), {}
'''
OPTION = "defaults:\n  - /schema@_here_: margin_loss.margin_sigmoid\n  - _self_\n"
METHOD = "defaults:\n  - dpo\n  - override dpo_loss: margin\n  - _self_\n\nname: mdpo\n"


def _user_files(tmp_path):
    (tmp_path / "margin_loss.py").write_text(LOSS)
    (tmp_path / "cfg" / "method" / "dpo_loss").mkdir(parents=True)
    (tmp_path / "cfg" / "method" / "dpo_loss" / "margin.yaml").write_text(OPTION)
    (tmp_path / "cfg" / "method" / "mdpo.yaml").write_text(METHOD)
    return {"PYTHONPATH": str(tmp_path)}


def test_a_new_method_trains_is_planned_and_refuses_a_bad_setting(tmp_path):
    env = _user_files(tmp_path)
    user = ("--config-dir", "cfg", "method=mdpo")
    for bad, says in [("-1", "must be a number >= 0"), ("abc", "must be a number >= 0")]:
        r = ablate("train", *user, f"method.dpo_loss.margin={bad}", cwd=tmp_path, env=env)
        assert r.returncode == 2, r.stderr[-2000:]
        assert r.stderr.strip() == f"ablate: error: method.dpo_loss.margin={bad}: {says}", r.stderr[-2000:]
    assert not (tmp_path / "outputs").exists()

    plans = [ablate("plan", *args, cwd=tmp_path, env=env) for args in (user, ("method=dpo",))]
    assert [p.returncode for p in plans] == [0, 0], plans[0].stderr[-2000:]
    lines = [re.findall(r"^\s*(micro-batch: .*|reference .*)$", p.stdout, re.M) for p in plans]
    assert lines[0] == lines[1] and len(lines[0]) == 2, lines  # pairs, and a reference, as DPO's

    r = ablate(
        "train", *user, "method.args.max_steps=1", "method.args.logging_steps=1", cwd=tmp_path, env=env
    )
    assert r.returncode == 0, r.stderr[-3000:]
    (run,) = (tmp_path / "outputs" / "runs").glob("*/*")
    first = next(m["loss"] for m in metrics(run) if "loss" in m)
    # step 1: the policy is its reference (delta = 0), so the loss is -log sigmoid(-margin) at the default 0.5
    assert first == pytest.approx(math.log1p(math.exp(0.5)), abs=1e-3)
