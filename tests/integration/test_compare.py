"""`ablate compare` and the sweep job table on run dirs written to the contract (no training here:
the dirs are written by hand, so every expected number is known; tests/slow/test_sweeps.py runs
compare on real sweeps)."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ablate.analysis import compare
from ablate.launchers import sweep

REPO = Path(__file__).resolve().parents[2]

# Final rewards/margins per (loss, seed). sigmoid: mean 0.3, sample std sqrt((0.1^2+0.1^2)/1) = 0.1414;
# hinge: mean 0.7, std sqrt((0.2^2+0.2^2)/1) = 0.2828.
MARGINS = {("sigmoid", 1): 0.2, ("sigmoid", 2): 0.4, ("hinge", 1): 0.5, ("hinge", 2): 0.9}


def write_run(
    root: Path,
    num: int,
    overrides: list[str],
    metrics: dict,
    status: str = "completed",
    steps: int = 4,
    runtime: float = 2.0,
    error: str | None = None,
) -> Path:
    run = root / f"{num}_{','.join(overrides)}".replace("/", "_")  # as Hydra names job dirs (ablate_dirname)
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    summary = {
        "status": status,
        "method": "dpo",
        "overrides": overrides,
        "global_step": steps,
        "compare_metrics": ["rewards/accuracies", "rewards/margins", "loss"],  # as conf/method/dpo.yaml
        "train_runtime": runtime,
        "metrics": metrics,
    }
    if error:
        summary["error"] = error
    (run / "summary.json").write_text(json.dumps(summary))
    (run / "run.json").write_text(json.dumps({"overrides": overrides}))  # ablate's marker, written first
    with (run / "metrics.jsonl").open("w") as f:  # a curve ending at the final value
        for step in range(1, steps + 1):
            event = {k: v * step / steps for k, v in metrics.items()}
            f.write(json.dumps({"step": step, "time": 0.5 * step, **event}) + "\n")
    return run


@pytest.fixture
def sweep_dir(tmp_path: Path) -> Path:
    root = tmp_path / "dpo_loss" / "2026-01-01_00-00-00"
    for num, ((loss, seed), margin) in enumerate(MARGINS.items()):
        write_run(
            root,
            num,
            ["sweep_name=dpo_loss", "method=dpo", f"method/dpo_loss={loss}", f"seed={seed}"],
            {"rewards/margins": margin, "rewards/accuracies": 0.5 + margin / 2, "loss": 1.0 - margin},
            runtime=1.0 + seed,
        )
    (root / "multirun.yaml").write_text("{}\n")
    return root


def test_groups_by_the_overrides_that_differ_ignoring_seed(sweep_dir: Path) -> None:
    groups = compare.group_runs(compare.find_runs([sweep_dir]))
    assert [g.label for g in groups] == ["dpo_loss=sigmoid", "dpo_loss=hinge"]
    assert [[r.overrides["seed"] for r in g.runs] for g in groups] == [["1", "2"], ["1", "2"]]


def test_table_is_mean_and_std_of_the_summaries(sweep_dir: Path) -> None:
    rows = compare.compare([sweep_dir], metrics=["rewards/margins"])
    by_group = {r["group"]: r for r in rows}
    assert by_group["dpo_loss=sigmoid"]["rewards/margins mean"] == pytest.approx(0.3)
    assert by_group["dpo_loss=sigmoid"]["rewards/margins std"] == pytest.approx(0.141421, abs=1e-6)
    assert by_group["dpo_loss=hinge"]["rewards/margins mean"] == pytest.approx(0.7)
    assert by_group["dpo_loss=hinge"]["rewards/margins std"] == pytest.approx(0.282843, abs=1e-6)
    assert by_group["dpo_loss=hinge"]["runtime_s mean"] == pytest.approx(2.5)  # runtimes 2.0 and 3.0
    assert by_group["dpo_loss=hinge"]["status"] == "2 completed"


def test_cli_compare_writes_table_plots_markdown_and_csv(sweep_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "report"
    # also proves compare stays light: neither torch nor transformers gets imported
    code = (
        "import sys; from ablate.cli import main; main(sys.argv[1:]); "
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules, 'heavy import'"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, "compare", str(sweep_dir), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert proc.returncode == 0, proc.stderr
    assert "dpo_loss=sigmoid" in proc.stdout and "dpo_loss=hinge" in proc.stdout
    assert "0.3 ± 0.14" in proc.stdout and "0.7 ± 0.28" in proc.stdout  # rewards/margins
    for name in ("rewards_margins_vs_step.png", "rewards_accuracies_vs_step.png", "loss_vs_step.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    rows = {r["group"]: r for r in csv.DictReader((out / "summary.csv").open())}
    assert float(rows["dpo_loss=hinge"]["loss mean"]) == pytest.approx(1.0 - 0.7)
    md = (out / "summary.md").read_text()
    assert md.startswith("| group | runs | status | rewards/accuracies | rewards/margins | loss |")
    assert "| dpo_loss=hinge | 2 | 2 completed |" in md


def test_caption_says_what_each_column_shows(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """3 seeds: the metric gets an interval, the runtime mean ± std, and the caption says both (issue 37:
    it said "with fewer than 3 seeds: mean ± std" above a 3-seed runtime of `33.08 ± 31`)."""
    root = tmp_path / "s" / "2026-01-01_00-00-00"
    for seed in (1, 2, 3):
        write_run(root, seed, ["method=dpo", f"seed={seed}"], {"loss": 0.1 * seed}, runtime=10.0 * seed)
    compare.compare([root], metrics=["loss"])
    out = capsys.readouterr().out
    # loss: a t interval, 0.2 ± t_{0.975, 2} · 0.1 / √3 = 0.2 ± 0.2484; runtime: mean ± std
    assert "0.2 [-0.04841, 0.4484]" in out and "20 ± 10" in out
    assert (
        "runtime (s): mean ± std over seeds, always" in out
        and "metrics: mean [95% t interval over the seeds" in out
    )


def test_metric_flag_picks_the_columns(sweep_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "r"
    compare.compare([sweep_dir], metrics=["loss"], out=out)
    assert (out / "summary.md").read_text().splitlines()[
        0
    ] == "| group | runs | status | loss | runtime (s) | steps |"
    assert not (out / "rewards_margins_vs_step.png").exists()


def test_failed_and_running_jobs(tmp_path: Path) -> None:
    """A sweep still running: a failed job, a job with only Hydra's files and a half-written log."""
    root = tmp_path / "sweep"
    write_run(root, 0, ["data.name=sort_prefs", "seed=1"], {"loss": 0.25})
    write_run(
        root, 1, ["data.name=missing", "seed=1"], {}, status="failed", error="DataError: no dataset 'missing'"
    )
    running = root / "2_data.name=sort_prefs,seed=2"
    (running / ".hydra").mkdir(parents=True)
    (running / ".hydra" / "overrides.yaml").write_text("- data.name=sort_prefs\n- seed=2\n")
    (running / "metrics.jsonl").write_text('{"step": 1, "time": 0.1, "loss": 0.75}\n{"step": 2, "ti')

    rows = {r["group"]: r for r in compare.compare([root], metrics=["loss"])}
    assert rows["name=sort_prefs"]["status"] == "1 completed, 1 running"
    assert rows["name=sort_prefs"]["loss mean"] == pytest.approx(
        (0.25 + 0.75) / 2
    )  # running: last logged value
    assert rows["name=missing"]["status"] == "1 failed" and rows["name=missing"]["loss mean"] is None

    jobs = sweep.job_rows(root)
    assert [(j["job"], j["status"]) for j in jobs] == [("0", "completed"), ("1", "failed"), ("2", "running")]
    assert jobs[1]["error"] == "DataError: no dataset 'missing'" and jobs[0]["metric"] == "loss=0.25"
    assert sweep.print_summary(root) == 2  # not completed: one failed, one still running


def test_sweep_names_become_multirun_argv() -> None:
    argv = sweep.sweep_argv("dpo_loss", ["seed=0", "logger=wandb"])
    assert argv == [
        "-m",
        "+sweep=dpo_loss",
        "seed=0",
        "logger=wandb",
    ]  # the same argv as `ablate train -m +sweep=...`
    assert sweep.sweep_argv("dpo_loss", ["--cfg", "job"])[0] == "+sweep=dpo_loss"  # inspecting: no -m
    # job dirs are named by what varies only (NameJobsByWhatVaries, for every multirun): the fixed
    # command-line keys join the config's exclude_keys; swept ones and group choices stay in the name
    exclude = sweep.exclude_keys_override(
        ["+sweep=dpo_loss", "seed=0", "logger=wandb", "lr=1,2", "method/dpo_loss=hinge"],
        ["sweep_name", "tags", "notes"],
    )
    assert (
        exclude == "hydra.job.config.override_dirname.exclude_keys=[sweep_name,tags,notes,sweep,seed,logger]"
    )


@pytest.mark.parametrize("path", sorted((REPO / "sweeps").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_sweep_config_is_hydras_format_with_a_comment_and_a_name(path: Path) -> None:
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from ablate.cli.sweep import find_sweep
    from ablate.paths import conf_dir
    from ablate.config.compose import register_resolvers

    assert path.read_text().startswith("# @package _global_\n# ")
    register_resolvers()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=conf_dir(), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"+sweep={path.stem}"], return_hydra_config=True)
    assert cfg.sweep_name == path.stem
    assert any("," in str(v) for v in cfg.hydra.sweeper.params.values()), "a sweep config sweeps something"
    assert find_sweep(path.stem) == (path.stem, []) == find_sweep(f"sweeps/{path.stem}.yaml")


def test_run_level_summary_fields_are_compared_and_plotted(tmp_path: Path) -> None:
    """GRPO's generation_rounds / generation_seconds live at summary.json's top level (per-run totals,
    never logged per step): spg=1 -> 8 rounds, 4.0 s and 6.0 s (mean 5.0, std 1.414); spg=4 -> 2 rounds."""
    root = tmp_path / "grpo"
    for num, (spg, seed, secs) in enumerate([(1, 1, 4.0), (1, 2, 6.0), (4, 1, 1.0), (4, 2, 1.0)]):
        run = write_run(
            root, num, [f"method.args.steps_per_generation={spg}", f"seed={seed}"], {"reward": 0.5}
        )
        s = json.loads((run / "summary.json").read_text())
        s.update(
            method="grpo",
            generation_rounds=8 // spg,
            generation_seconds=secs,
            compare_metrics=["reward", "generation_rounds", "generation_seconds"],
        )  # conf/method/grpo.yaml
        (run / "summary.json").write_text(json.dumps(s))
    out = tmp_path / "report"
    rows = compare.compare([root], out=out)
    assert [r["generation_rounds mean"] for r in rows] == [8, 2]
    assert rows[0]["generation_seconds mean"] == pytest.approx(5.0)
    assert rows[0]["generation_seconds std"] == pytest.approx(2**0.5)
    assert (out / "generation_seconds_by_group.png").is_file()
    assert not (out / "generation_seconds_vs_step.png").exists()


def test_default_metrics_come_from_the_methods_yaml(tmp_path: Path) -> None:
    """A user's method names its own `compare_metrics` (recorded in summary.json by `ablate train`);
    a run dir without them (an older ablate) shows `loss`."""
    root = tmp_path / "mine"
    for num, seed in enumerate((1, 2)):
        run = write_run(root, num, [f"seed={seed}"], {"my/score": 0.5 + seed, "loss": 0.1})
        s = json.loads((run / "summary.json").read_text())
        s.update(method="my_method", compare_metrics=["my/score"])
        (run / "summary.json").write_text(json.dumps(s))
    assert compare.default_metrics(compare.find_runs([root])) == ["my/score"]
    rows = compare.compare([root])
    assert rows[0]["my/score mean"] == pytest.approx(2.0) and "loss mean" not in rows[0]
    assert sweep.job_rows(root)[0]["metric"] == "my/score=1.5"
    for p in root.iterdir():
        s = json.loads((p / "summary.json").read_text())
        del s["compare_metrics"]
        (p / "summary.json").write_text(json.dumps(s))
    assert compare.default_metrics(compare.find_runs([root])) == ["loss"]
