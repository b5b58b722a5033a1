"""End to end through the console entry point: the default run, hinge, SFT, the run dir contract,
model reload, resume, and one-line errors for bad overrides."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import ablate, metrics, summary


@pytest.fixture(scope="module")
def default_run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("default") / "run"
    r = ablate("train", f"hydra.run.dir={run_dir}")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "run dir:" in r.stdout and "rewards/accuracies" in r.stdout  # ends by printing dir + metrics
    return run_dir


def _last(events: list[dict], key: str) -> float:
    return [e[key] for e in events if key in e][-1]


def test_default_run_learns(default_run):
    s = summary(default_run)
    assert s["status"] == "completed" and s["method"] == "dpo"
    assert s["metrics"]["rewards/accuracies"] >= 0.9
    assert s["metrics"]["rewards/margins"] > 0
    ev = metrics(default_run)
    assert _last(ev, "rewards/margins") > [e for e in ev if "rewards/margins" in e][0]["rewards/margins"]


def test_run_dir_contract(default_run):
    for name in (
        ".hydra/config.yaml",
        ".hydra/overrides.yaml",
        "run.json",
        "metrics.jsonl",
        "summary.json",
        "model/config.json",
        "model/model.safetensors",
        "model/tokenizer.json",
    ):
        assert (default_run / name).is_file(), name
    s = summary(default_run)
    for key in ("status", "metrics", "global_step", "train_runtime", "versions", "overrides"):
        assert key in s, key
    assert s["global_step"] == 60
    assert {"python", "torch", "transformers", "ablate"} <= set(s["versions"])
    assert s["overrides"] == []  # hydra.run.dir is Hydra's own override, not the run's config
    events = metrics(default_run)
    assert all("step" in e for e in events)
    names = set().union(*events)
    for m in (
        "loss",
        "rewards/chosen",
        "rewards/rejected",
        "rewards/accuracies",
        "rewards/margins",
        "logps/chosen",
        "logps/rejected",
    ):
        assert m in names, m
    # summary metrics are the final logged values
    assert s["metrics"]["rewards/margins"] == _last(events, "rewards/margins")


def test_saved_model_reloads_with_same_logits(default_run):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ablate.models import pretrained

    tok = AutoTokenizer.from_pretrained(default_run / "model")
    model = AutoModelForCausalLM.from_pretrained(default_run / "model").eval()
    ids = tok("sort: cab =", return_tensors="pt", add_special_tokens=False)["input_ids"]
    tok2, model2 = pretrained(str(default_run / "model"))  # the model=local code path
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, model2.eval()(ids).logits)
    # and it is the trained model, not the initial one
    from ablate.models import tiny

    _, init = tiny()
    with torch.no_grad():
        assert not torch.allclose(model(ids).logits, init.eval()(ids).logits)


def test_hinge_learns(tmp_path):
    r = ablate("train", "method=dpo_hinge", f"hydra.run.dir={tmp_path}")
    assert r.returncode == 0, r.stderr[-3000:]
    s = summary(tmp_path)
    assert s["method"] == "dpo_hinge" and s["metrics"]["rewards/accuracies"] >= 0.9


def test_eval_before_training_is_an_exact_tie(tmp_path):
    """At step 0 the policy is the reference, so every eval pair's implicit rewards are 0 - 0 and
    eval_rewards/accuracies (chosen > rejected, a tie is not a win) is exactly 0, as TRL shows. The
    reference was scored in length-sorted batches and the eval in dataset order, and a row's log-prob
    moves in the last bits with its batch-mates' padding: 1 of 64 caps_prefs pairs (1 of 32 on SmolLM2)
    won a tie by noise. The eval's reference is now scored in the eval loader's batches."""
    run_dir = tmp_path / "run"
    r = ablate(
        "train",
        "data=caps_prefs",
        "method.args.max_steps=1",
        "method.args.eval_strategy=steps",
        "method.args.eval_steps=1",
        "method.args.eval_on_start=true",
        "method.args.per_device_eval_batch_size=16",
        f"hydra.run.dir={run_dir}",
    )
    assert r.returncode == 0, r.stderr[-3000:]
    first = [e for e in metrics(run_dir) if "eval_rewards/accuracies" in e][0]
    assert (
        first["step"] == 0
        and first["eval_rewards/accuracies"] == 0.0
        and first["eval_rewards/margins"] == 0.0
    ), first
    assert first["eval_rewards/chosen"] == 0.0 and first["eval_rewards/rejected"] == 0.0, first


def test_sft_lowers_loss(tmp_path):
    r = ablate("train", "method=sft", f"hydra.run.dir={tmp_path}")
    assert r.returncode == 0, r.stderr[-3000:]
    losses = [e["loss"] for e in metrics(tmp_path) if "loss" in e]
    assert losses[-1] < 0.5 * losses[0]
    assert summary(tmp_path)["metrics"]["mean_token_accuracy"] > 0.5


def test_local_model_and_jsonl_data(tmp_path, default_run):
    """model=local (from_pretrained on a dir) trains further on a local JSONL file with chat messages."""
    rows = [
        {
            "prompt": [{"role": "user", "content": f"sort: {w}"}],
            "chosen": [{"role": "assistant", "content": "".join(sorted(w))}],
            "rejected": [{"role": "assistant", "content": w}],
        }
        for w in ("cba", "dca", "fed", "hge")
    ]
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = tmp_path / "run"
    r = ablate(
        "train",
        "model=local",
        f"model.path={default_run / 'model'}",
        "data=jsonl",
        f"data.train_path={data}",
        "method.args.max_steps=4",
        "method.args.per_device_train_batch_size=2",
        f"hydra.run.dir={run}",
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert summary(run)["status"] == "completed" and summary(run)["global_step"] == 4


def test_resume_reproduces_uninterrupted_losses(tmp_path):
    common = [
        "method.args.max_steps=20",
        "method.args.save_steps=5",
        "method.args.logging_steps=1",
        "+callbacks.crash._target_=crashing.CrashAt",
    ]
    a, b = tmp_path / "a", tmp_path / "b"
    assert ablate("train", *common, f"hydra.run.dir={a}").returncode == 0
    crashed = ablate("train", *common, f"hydra.run.dir={b}", env={"ABLATE_TEST_CRASH_AT": "13"})
    assert crashed.returncode != 0
    assert summary(b)["status"] == "failed" and "simulated crash at step 13" in summary(b)["error"]
    resumed = ablate("resume", str(b))  # = the same command with the same hydra.run.dir
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert summary(b)["status"] == "completed"
    la = [(e["step"], e["loss"]) for e in metrics(a) if "loss" in e]
    lb = [(e["step"], e["loss"]) for e in metrics(b) if "loss" in e]
    assert la == lb  # exact: same RNG, data order and reference log-probs after the resume
    again = ablate("resume", str(b))
    assert again.returncode == 0 and "nothing to resume" in again.stdout
    assert ablate("resume", str(tmp_path)).returncode == 2  # not a run dir


def test_other_run_in_dir_is_refused(tmp_path):
    assert ablate("train", "method.args.max_steps=2", f"hydra.run.dir={tmp_path}").returncode == 0
    r = ablate("train", "method.args.max_steps=3", f"hydra.run.dir={tmp_path}")
    assert r.returncode == 2 and "holds another run" in r.stderr
    assert summary(tmp_path)["status"] == "completed"  # the first run's summary is untouched


@pytest.mark.parametrize(
    "override,needle",
    [
        ("method=nope", "no option 'nope' in config group 'method'"),
        ("+method.args.betta=0.2", "did you mean 'method.args.beta'"),
        ("method.args.loss_type=ipo", "ablate: error: unknown config key 'method.args.loss_type'"),
        (
            "method/dpo_loss=dapo",
            "no option 'dapo' in config group 'method/dpo_loss' (dapo is an option of "
            "method/grpo_aggregation: method/grpo_aggregation=dapo;",
        ),
        ("data.name=nope", "no packaged dataset 'nope'"),
        ("precision=fp16", "needs a CUDA GPU"),
        (
            "distributed=fsdp",
            "distributed=fsdp shards the model over several processes",
        ),  # one process: nothing to shard over
    ],
)
def test_bad_override_is_a_short_error(tmp_path, override, needle):
    r = ablate("train", override, f"hydra.run.dir={tmp_path}")
    assert r.returncode != 0
    assert needle in r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) <= 15


@pytest.mark.parametrize(
    "overrides,needle",
    [
        (["model=qwen2_5_0_5b"], "model.path: cannot load 'Qwen/Qwen2.5-0.5B-Instruct'"),
        (["data=ultrafeedback_binarized"], "data: cannot load 'trl-lib/ultrafeedback_binarized'"),
    ],
)
def test_unreachable_model_or_data_is_a_short_error(tmp_path, overrides, needle):
    """The hub options use the real from_pretrained / load_dataset; offline they fail in one line."""
    r = ablate(
        "train",
        *overrides,
        f"hydra.run.dir={tmp_path}",
        env={"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"},
    )
    assert r.returncode == 2 and needle in r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) <= 3
    assert summary(tmp_path)["status"] == "failed"
