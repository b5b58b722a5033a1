"""Config groups renamed so that they say what they configure (ablate.schema.renamed): for one release each
old spelling still works, with one notice naming the new one; a run recorded under an old name resumes."""

from __future__ import annotations

import json

import pytest
from conftest import ablate

FAST = ["method.args.max_steps=2", "method.args.save_steps=1", "method.args.logging_steps=1", "data.max_train_samples=32"]


@pytest.mark.parametrize("old,new,notes", [
    (["perf=off", "perf.lean_layers=true"], ["speed=off", "speed.lean_layers=true"], ["perf is now speed"]),
    (["method/loss=robust", "method.loss.label_smoothing=0.2"], ["method/dpo_loss=robust", "method.dpo_loss.label_smoothing=0.2"],
     ["method/loss is now method/dpo_loss", "method.loss is now method.dpo_loss"]),
    (["method=grpo", "method/aggregation=dr_grpo", "method/scale_rewards=none", "method/objective=cispo",
      "method/reward_aggregation=normalize_then_sum", "method/generator=hf"],
     ["method=grpo", "method/grpo_aggregation=dr_grpo", "method/grpo_scale_rewards=none", "method/grpo_objective=cispo",
      "method/grpo_reward_aggregation=normalize_then_sum", "method/rollouts=hf"],
     ["method/aggregation is now method/grpo_aggregation", "method/scale_rewards is now method/grpo_scale_rewards",
      "method/objective is now method/grpo_objective", "method/reward_aggregation is now method/grpo_reward_aggregation",
      "method/generator is now method/rollouts"]),
    (["model=local", "model.path=/x", "+model/lr=pretrained"], ["model=local", "model.path=/x", "optimizer/lr=pretrained"],
     ["model/lr is now optimizer/lr"]),
], ids=["speed", "dpo_loss", "grpo", "lr"])
def test_an_old_spelling_composes_the_same_config_with_a_notice(tmp_path, old, new, notes):
    was, now = ablate("train", "--cfg", "job", *old, cwd=tmp_path), ablate("train", "--cfg", "job", *new, cwd=tmp_path)
    assert was.returncode == now.returncode == 0, was.stderr[-2000:] + now.stderr[-2000:]
    assert was.stdout == now.stdout and now.stderr == ""
    lines = was.stderr.strip().splitlines()
    assert [line.split(" (")[0] for line in lines] == [f"ablate: note: {n}" for n in notes]  # once per old name


def test_an_old_file_in_a_users_config_dir_still_composes(tmp_path):
    """A method YAML of the user's including `/trainers/common_args@args` and a model option with
    `lr: pretrained` (model/lr/): both work, each noted; a refusal is still one line, the notes folded into it."""
    (tmp_path / "conf" / "method").mkdir(parents=True)
    (tmp_path / "conf" / "model").mkdir()
    (tmp_path / "conf" / "method" / "my_dpo.yaml").write_text(
        "defaults:\n  - dpo\n  - /trainers/common_args@args\n  - _self_\n\nname: my_dpo\n")
    (tmp_path / "conf" / "model" / "my_tiny.yaml").write_text("defaults:\n  - tiny\n  - lr: pretrained\n  - _self_\n")
    r = ablate("train", "--config-dir", "conf", "method=my_dpo", "model=my_tiny", "method.args.beta=0", cwd=tmp_path)
    line, = r.stderr.strip().splitlines()
    assert r.returncode == 2 and line.startswith("ablate: error: method.args.beta=0: must be a number > 0 ("), r.stderr
    assert "model/lr/pretrained is now optimizer/lr" in line and "trainers/common_args is now /training_args@args" in line
    cfg = ablate("train", "--config-dir", "conf", "method=my_dpo", "model=my_tiny", "--cfg", "job", cwd=tmp_path).stdout
    assert "lr: 2.0e-05" in cfg and "logging_steps: 5" in cfg


def test_a_sweep_file_with_old_names_runs_under_the_new_ones(tmp_path):
    sweep = tmp_path / "old_sweep.yaml"
    sweep.write_text("# @package _global_\nhydra:\n  sweeper:\n    params:\n      method/loss: sigmoid,hinge\n")
    r = ablate("sweep", str(sweep), "--dry-run", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "method/dpo_loss=sigmoid" in r.stdout and "method/dpo_loss=hinge" in r.stdout
    assert r.stderr.count("ablate: note: method/loss is now method/dpo_loss") == 1


def test_a_run_recorded_under_old_names_resumes(tmp_path):
    """run.json written before the rename (overrides `perf=off`, config key `perf`): `ablate resume`
    takes it as the same run and the same config (no 'holds another run', no 'config changed')."""
    run = tmp_path / "run"
    first = ablate("train", f"hydra.run.dir={run}", "speed=off", *FAST, "method.args.max_steps=4", cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-2000:]
    info = json.loads((run / "run.json").read_text())
    from ablate.record.identity import config_hash

    old = {("perf" if k == "speed" else k): v for k, v in info["config"].items()}
    info.update(overrides=[o.replace("speed=off", "perf=off") for o in info["overrides"]], config=old,
                config_hash=config_hash(old))
    (run / "run.json").write_text(json.dumps(info))
    summary = json.loads((run / "summary.json").read_text())
    (run / "summary.json").write_text(json.dumps({**summary, "status": "interrupted"}))
    for ckpt in ("checkpoint-4", "checkpoint-3"):  # resume from step 2
        import shutil

        shutil.rmtree(run / "checkpoints" / ckpt, ignore_errors=True)
    r = ablate("resume", str(run), cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "ablate: note: perf is now speed" in r.stderr
    assert json.loads((run / "summary.json").read_text())["global_step"] == 4
    assert [e["step"] for e in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())][:4] == [1, 2, 3, 4]


def test_unit_renames():
    from ablate.schema.renamed import current, current_config

    assert current("+perf=off") == ("+speed=off", "perf")
    assert current("method.loss.beta=1") == ("method.dpo_loss.beta=1", "method.loss")
    assert current("method.args.scale_rewards=x") == ("method.args.scale_rewards=x", None)  # a moved field, not a rename
    assert current("method.trainer.generator._target_=x")[1] is None
    assert current_config({"perf": {"a": 1}, "method": {"loss": {"b": 2}, "args": {}}}) == \
        {"speed": {"a": 1}, "method": {"dpo_loss": {"b": 2}, "args": {}}}
