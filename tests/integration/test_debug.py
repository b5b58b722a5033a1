"""Debug presets as a user runs them (`ablate train debug=...` from a scratch cwd, default run dirs)."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import ablate, metrics, summary


def only_run(cwd: Path) -> Path:
    (run,) = (cwd / "outputs" / "runs").glob("*/*")
    return run


def test_fast_two_steps_tiny_eval_no_checkpoints(tmp_path: Path) -> None:
    r = ablate("train", "debug=fast", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    run = only_run(tmp_path)
    assert run.name.endswith("_debug=fast")
    s = summary(run)
    assert s["status"] == "completed" and s["global_step"] == 2
    assert [e["step"] for e in metrics(run) if "loss" in e] == [1, 2]
    assert any("eval_loss" in e for e in metrics(run))  # the tiny eval ran
    assert not list((run / "checkpoints").glob("checkpoint-*")) and not (run / "wandb").exists()
    assert (run / "model" / "config.json").is_file()


def test_overfit_loss_falls_on_one_batch(tmp_path: Path) -> None:
    r = ablate("train", "debug=overfit", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "debug=overfit: loss" in r.stdout and ": OK" in r.stdout
    losses = [e["loss"] for e in metrics(only_run(tmp_path)) if "loss" in e]
    assert len(losses) == 30 and losses[-1] < 0.5 * losses[0]


def test_overfit_fails_when_nothing_learns(tmp_path: Path) -> None:
    r = ablate("train", "debug=overfit", "optimizer.optimizer.lr=1e-12", cwd=tmp_path)
    assert r.returncode == 2
    errors = [line[line.index("ablate: error:"):] for line in r.stderr.splitlines() if "ablate: error:" in line]
    assert len(errors) == 1 and errors[0].startswith("ablate: error: debug=overfit: loss went 0.6931 -> 0.6931")
    assert "Traceback" not in r.stderr
    s = summary(only_run(tmp_path))
    assert s["status"] == "failed" and "OverfitFailed" in s["error"]


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
                cfg = compose(config_name="config", overrides=[f"debug={preset}", f"method={method}", "logger=wandb"])
            assert cfg.method.args.save_strategy == "no" and cfg.method.args.logging_steps == 1
            assert cfg.logger.get("_target_")  # the command line's logger wins over the preset's
        lines = (Path(conf_dir()) / "debug" / f"{preset}.yaml").read_text().splitlines()
        for i, line in enumerate(lines):
            s = line.strip()
            if s and not s.startswith(("#", "- ", "_target_:")) and not s.endswith(":"):
                assert "#" in line or lines[i - 1].strip().startswith("#"), f"debug/{preset}.yaml: '{s}'"
