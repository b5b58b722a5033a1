"""Debug presets as a user runs them (`ablate train debug=...` from a scratch cwd, default run dirs)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from conftest import ablate, metrics, summary


def only_run(cwd: Path) -> Path:
    (run,) = (cwd / "outputs" / "runs").glob("*/*")
    return run


def test_fast_two_steps_tiny_eval_no_checkpoints(tmp_path: Path) -> None:
    r = ablate("train", "debug=fast", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    run = only_run(tmp_path)
    assert "_debug-fast-" in run.name
    s = summary(run)
    assert s["status"] == "completed" and s["global_step"] == 2
    assert [e["step"] for e in metrics(run) if "loss" in e] == [1, 2]
    assert any("eval_loss" in e for e in metrics(run))  # the tiny eval ran
    assert not list((run / "checkpoints").glob("checkpoint-*")) and not (run / "wandb").exists()
    assert (run / "model" / "config.json").is_file()


def test_overfit_loss_falls_on_one_batch(tmp_path: Path) -> None:
    r = ablate("train", "debug=overfit", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "debug=overfit: watched loss (method.progress; must fall)" in r.stdout and ": OK" in r.stdout
    losses = [e["loss"] for e in metrics(only_run(tmp_path)) if "loss" in e]
    assert len(losses) == 30 and losses[-1] < 0.5 * losses[0]


def test_overfit_fails_when_nothing_learns(tmp_path: Path) -> None:
    r = ablate("train", "debug=overfit", "optimizer.optimizer.lr=1e-12", cwd=tmp_path)
    assert r.returncode == 2
    errors = [
        line[line.index("ablate: error:") :] for line in r.stderr.splitlines() if "ablate: error:" in line
    ]
    assert len(errors) == 1 and errors[0].startswith(
        "ablate: error: debug=overfit: watched loss (method.progress; must fall) went 0.6931 -> 0.6931"
    )
    assert "Traceback" not in r.stderr
    s = summary(only_run(tmp_path))
    assert s["status"] == "failed" and "OverfitFailed" in s["error"]


def test_overfit_watches_each_methods_progress_metric(tmp_path: Path) -> None:
    """GRPO's loss sits near 0 whether it learns or not (advantages are centred per group): its overfit
    check watches the reward, must rise, on one batch of prompts (64 completions / 8 per prompt);
    DPO and SFT watch the loss (issue 37: GRPO passed on `loss -7.6e-09 -> -0.0035`)."""
    for method, metric, mode, rows in (
        ("grpo", "reward", "max", 8),
        ("dpo", "loss", "min", 8),
        ("sft", "loss", "min", 8),
    ):
        r = ablate("train", f"method={method}", "debug=overfit", "--cfg", "job", "--resolve", cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        assert re.search(rf"^    metric: {metric}\n    mode: {mode}$", r.stdout, flags=re.M), (
            method,
            r.stdout[-1500:],
        )
        assert f"  max_train_samples: {rows}\n" in r.stdout, method  # one batch
    r = ablate(
        "train",
        "method=grpo",
        "debug=overfit",
        "method.args.num_generations=4",
        "--cfg",
        "job",
        "--resolve",
        cwd=tmp_path,
    )
    assert "  max_train_samples: 16\n" in r.stdout  # still one batch: 64 completions / 4 per prompt


def test_overfit_check_takes_means_of_thirds_and_names_the_metric() -> None:
    """A sampled reward wobbles around 1/256 when nothing learns: its last value may triple its first by
    chance, the means of the first and last third do not; a real rise passes."""
    from transformers import TrainerControl, TrainerState, TrainingArguments

    from ablate.callbacks.debug import OverfitCheck, OverfitFailed

    def end(rewards: list[float]) -> None:
        state = TrainerState()
        state.global_step, state.log_history = (
            len(rewards),
            [{"reward": r, "loss": 0.0, "step": i} for i, r in enumerate(rewards)],
        )
        OverfitCheck("reward", "max", 2.0).on_train_end(
            TrainingArguments("/tmp/unused"), state, TrainerControl()
        )

    noise = [0.002, 0.006, 0.004, 0.0, 0.008, 0.004, 0.002, 0.006, 0.004, 0.0, 0.008, 0.004, 0.0, 0.012]
    with pytest.raises(OverfitFailed, match=r"watched reward \(method.progress; must rise\) went 0.00"):
        end(noise)  # 0.002 -> 0.012 end to end (x6), 0.004 -> 0.005 by thirds
    end([0.004, 0.002, 0.006, 0.01, 0.02, 0.03, 0.05, 0.06, 0.08])


@pytest.mark.slow
def test_grpo_overfit_watches_the_reward(tmp_path: Path) -> None:
    """A GRPO run under debug=overfit passes on its reward, and fails on it when nothing learns (~1 min each)."""
    r = ablate("train", "method=grpo", "debug=overfit", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    ok = re.search(
        r"debug=overfit: watched reward \(method.progress; must rise\) (\S+) -> (\S+) in 30 steps", r.stdout
    )
    assert ok and float(ok.group(2)) >= 3 * float(ok.group(1)), r.stdout[-2000:]
    r = ablate("train", "method=grpo", "debug=overfit", "optimizer.optimizer.lr=1e-12", cwd=tmp_path)
    assert r.returncode == 2 and "debug=overfit: watched reward (method.progress; must rise) went" in r.stderr


def test_profile_writes_trace_and_table(tmp_path: Path) -> None:
    r = ablate("train", "debug=profile", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    run = only_run(tmp_path)
    trace = json.loads((run / "profile" / "trace.json").read_text())
    assert any(e.get("name", "").startswith("ProfilerStep") for e in trace["traceEvents"])
    table = (run / "profile" / "summary.txt").read_text()
    assert "aten::mm" in table and len(table.splitlines()) <= 25  # one screen
    assert "debug=profile: 3 steps" in r.stdout and "Self CPU time total" in r.stdout


def test_presets_compose_and_document_every_field() -> None:
    """Every conf/debug option composes over every method, and each field has a comment."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from ablate.paths import conf_dir
    from ablate.config.compose import register_resolvers

    register_resolvers()
    presets = sorted(p.stem for p in (Path(conf_dir()) / "debug").glob("*.yaml"))
    assert presets == ["fast", "overfit", "profile"]
    for preset in presets:
        for method in ("dpo", "sft", "grpo"):
            GlobalHydra.instance().clear()
            with initialize_config_dir(config_dir=conf_dir(), version_base="1.3"):
                cfg = compose(
                    config_name="config", overrides=[f"debug={preset}", f"method={method}", "logger=wandb"]
                )
            assert cfg.method.args.save_strategy == "no" and cfg.method.args.logging_steps == 1
            assert cfg.logger.get("_target_")  # the command line's logger wins over the preset's
        lines = (Path(conf_dir()) / "debug" / f"{preset}.yaml").read_text().splitlines()
        for i, line in enumerate(lines):
            s = line.strip()
            if s and not s.startswith(("#", "- ", "_target_:")) and not s.endswith(":"):
                assert "#" in line or lines[i - 1].strip().startswith("#"), f"debug/{preset}.yaml: '{s}'"
