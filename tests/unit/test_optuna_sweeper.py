"""hydra/sweeper=optuna without training (issue 21B): the search space, the objective read from a run
dir, the driver's ask/launch/tell loop on a stub launcher (seeded reproducibility, the budget, a
resume after the driver died), and the trial's pruning callback on a real SQLite study."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from ablate.launchers.study import objective, search_space, trial_overrides

SPACE = {
    "optimizer.optimizer.lr": "tag(log, interval(1e-4, 1e-1))",
    "method.args.beta": "interval(0.0, 1.0)",
    "method.args.max_steps": "tag(int, interval(2, 9))",
    "method/dpo_loss": "sigmoid,hinge",
    "seed": "3",
}


def test_search_space_reads_hydra_grammar():
    optuna = pytest.importorskip("optuna")
    space, fixed = search_space(SPACE, ["seed=4", "method.args.beta=choice(0.1,0.5)"])
    d = optuna.distributions
    assert space["optimizer.optimizer.lr"] == d.FloatDistribution(1e-4, 1e-1, log=True)
    assert space["method.args.max_steps"] == d.IntDistribution(2, 9)
    assert space["method/dpo_loss"] == d.CategoricalDistribution(["sigmoid", "hinge"])
    assert space["method.args.beta"] == d.CategoricalDistribution(["0.1", "0.5"])  # the command line wins
    assert fixed == ["seed=4"]
    assert search_space({"x": "range(1,7,2)"}, [])[0]["x"] == d.IntDistribution(1, 5, step=2)
    with pytest.raises(ValueError, match="no search space"):
        search_space({"seed": "1"}, [])


def test_trial_overrides_keep_floats_exact():
    lr = 0.1 + 0.2  # 0.30000000000000004: a rounded override would not reproduce the trial
    assert trial_overrides({"optimizer.optimizer.lr": lr, "method/dpo_loss": "hinge", "n": 3}) == [
        "optimizer.optimizer.lr=0.30000000000000004",
        "method/dpo_loss=hinge",
        "n=3",
    ]
    assert float(trial_overrides({"x": lr})[0].split("=")[1]) == lr


def test_objective_from_summary_or_metrics_at_step(tmp_path):
    (tmp_path / "summary.json").write_text(json.dumps({"status": "completed", "metrics": {"loss": 0.5}}))
    (tmp_path / "metrics.jsonl").write_text(
        "".join(
            json.dumps(e) + "\n"
            for e in [
                {"step": 5, "eval_loss": 0.9},
                {"step": 10, "eval_loss": 0.7},
                {"step": 10, "loss": 0.6},
                {"step": 15, "eval_loss": 0.4},
            ]
        )
    )
    assert objective(tmp_path, "loss") == 0.5
    assert objective(tmp_path, "eval_loss", step=12) == 0.7  # the last logged at or before step 12
    assert objective(tmp_path, "eval_loss") == 0.4  # not in the summary's metrics: the last logged
    assert objective(tmp_path, "nope") is None


def test_missing_optuna_is_one_line(monkeypatch):
    from ablate.record.studies import require_optuna

    monkeypatch.setitem(sys.modules, "optuna", None)  # `import optuna` raises ImportError
    with pytest.raises(ValueError) as e:
        require_optuna()
    assert "pip install 'ablate[optuna]'" in str(e.value) and "\n" not in str(e.value)


def test_missing_optuna_refuses_the_study_before_it_starts(monkeypatch):
    """The Validate callback's multirun check (before the sweep dir is claimed): one line, the extra named."""
    from ablate.errors import ConfigError
    from ablate.config import checks

    monkeypatch.setattr(checks, "installed", lambda module: module != "optuna")
    hc = OmegaConf.create(
        {
            "launcher": {"_target_": "hydra._internal.core_plugins.basic_launcher.BasicLauncher"},
            "sweeper": {"_target_": "hydra_plugins.ablate_sweepers.optuna_sweeper.OptunaSweeper"},
        }
    )
    with pytest.raises(
        ConfigError, match=r"^hydra/sweeper=optuna \(a study\) needs .*pip install 'ablate\[optuna\]'$"
    ):
        checks.check_launcher(hc)
    hc.sweeper._target_ = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"
    checks.check_launcher(hc)  # a grid needs no optuna


class StubLauncher:
    """Runs no training: each job's run dir gets a summary.json whose loss is a known function of its
    overrides (minimum at lr=1e-2, beta=0.5). `die_after`: raise on that job, as a killed driver."""

    def __init__(self, sweep_dir: Path, die_after: int | None = None) -> None:
        self.sweep_dir, self.die_after, self.jobs = sweep_dir, die_after, []

    def launch(self, batch, initial_job_idx):
        out = []
        for i, overrides in enumerate(batch):
            run_dir = self.sweep_dir / f"{initial_job_idx + i}"
            run_dir.mkdir(parents=True)
            if self.die_after is not None and len(self.jobs) == self.die_after:
                raise KeyboardInterrupt  # the driver dies with this trial started, RUNNING in study.db
            task = dict(o.split("=", 1) for o in overrides if not o.startswith("++hydra."))
            self.jobs.append(task)
            loss = (math.log10(float(task["optimizer.optimizer.lr"])) + 2) ** 2 + (
                float(task["method.args.beta"]) - 0.5
            ) ** 2
            (run_dir / "summary.json").write_text(
                json.dumps({"status": "completed", "metrics": {"loss": loss}})
            )
            out.append(
                SimpleNamespace(
                    hydra_cfg=OmegaConf.create({"hydra": {"runtime": {"output_dir": str(run_dir)}}})
                )
            )
        return out


def sweeper(sweep_dir: Path, n_trials: int, n_jobs: int = 1, die_after: int | None = None):
    from hydra_plugins.ablate_sweepers.optuna_sweeper import OptunaSweeper

    s = OptunaSweeper(
        metric="loss",
        n_trials=n_trials,
        n_jobs=n_jobs,
        sampler=OmegaConf.create(
            {"_target_": "optuna.samplers.TPESampler", "seed": 7, "n_startup_trials": 3}
        ),
        pruner=OmegaConf.create({"_target_": "optuna.pruners.MedianPruner"}),
        params={k: SPACE[k] for k in ("optimizer.optimizer.lr", "method.args.beta")},
    )
    s.config = OmegaConf.create({"sweep_name": "unit", "hydra": {"sweep": {"dir": str(sweep_dir)}}})
    s.launcher = StubLauncher(sweep_dir, die_after)
    return s


def study(sweep_dir: Path):
    optuna = pytest.importorskip("optuna")
    return optuna.load_study(study_name="unit", storage=f"sqlite:///{sweep_dir / 'study.db'}")


def test_seeded_study_reproduces_its_trials(tmp_path):
    pytest.importorskip("optuna")
    runs = []
    for name in ("a", "b"):
        s = sweeper(tmp_path / name, n_trials=6)
        s.sweep(["seed=1"])
        runs.append(s.launcher.jobs)
    assert len(runs[0]) == 6 and runs[0] == runs[1]  # same seed: the same parameters, in the same order
    assert all(job["seed"] == "1" for job in runs[0])  # the fixed override reaches every trial
    assert len({job["optimizer.optimizer.lr"] for job in runs[0]}) == 6
    other = sweeper(tmp_path / "c", n_trials=6)
    other.sampler_cfg.seed = 8
    other.sweep([])
    assert other.launcher.jobs != [{k: v for k, v in j.items() if k != "seed"} for j in runs[0]]
    trials = study(tmp_path / "a").get_trials()
    assert [t.state.name for t in trials] == ["COMPLETE"] * 6
    assert trials[0].user_attrs["run_dir"] == str(tmp_path / "a" / "0")  # job number = trial number


def test_parallel_trials_go_as_batches(tmp_path):
    pytest.importorskip("optuna")
    s = sweeper(tmp_path, n_trials=5, n_jobs=2)
    batches = []
    launch = s.launcher.launch
    s.launcher.launch = lambda batch, initial_job_idx: (
        batches.append((len(batch), initial_job_idx)) or launch(batch, initial_job_idx)
    )
    s.sweep([])
    assert batches == [(2, 0), (2, 2), (1, 4)]  # n_trials is the budget, n_jobs the batch


def test_killed_driver_then_rerun_continues_the_study(tmp_path):
    pytest.importorskip("optuna")
    first = sweeper(tmp_path, n_trials=5, die_after=3)
    with pytest.raises(KeyboardInterrupt):
        first.sweep([])
    before = study(tmp_path).get_trials()
    assert [t.state.name for t in before] == ["COMPLETE"] * 3 + ["RUNNING"]
    again = sweeper(tmp_path, n_trials=5)
    again.sweep([])
    trials = study(tmp_path).get_trials()
    done = [t for t in trials if t.state.name == "COMPLETE"]
    assert len(done) == 5 and len(again.launcher.jobs) == 2  # 3 finished trials not repeated: 2 new jobs
    assert trials[3].state.name == "FAIL"  # the one the dead driver left running...
    assert not (tmp_path / "3").exists() and list((tmp_path / ".replaced").glob("3-*"))  # (its dir set aside)
    assert (
        trials[4].params == before[3].params and trials[4].user_attrs["retry_of"] == 3
    )  # ...runs again, first
    assert [t.params for t in done[:3]] == [t.params for t in before[:3]]
    assert done[4].params not in [
        t.params for t in done[:4]
    ]  # the continued sampler does not redraw its first points
    again.sweep([])  # the budget is spent: a third launch runs nothing
    assert len(again.launcher.jobs) == 2


def test_pruning_stops_a_clearly_worse_trial(tmp_path):
    """ReportToStudy, the trial's callback: a trial whose loss stays far above the finished trial's
    at the same steps is pruned at its first report past warm-up; the good one is not."""
    optuna = pytest.importorskip("optuna")
    from ablate.errors import Pruned
    from ablate.record.callbacks import ReportToStudy

    url = f"sqlite:///{tmp_path / 'study.db'}"
    s = optuna.create_study(
        study_name="p", storage=url, pruner=optuna.pruners.MedianPruner(n_startup_trials=1)
    )
    state = SimpleNamespace(is_world_process_zero=True, global_step=0)

    def train(curve: list[float]) -> int | None:
        trial = s.ask()
        # the pruner travels as config: Optuna keeps none in the database (the sweeper passes it in the env)
        cb = ReportToStudy(
            url,
            "p",
            trial._trial_id,
            "eval_loss",
            '{"_target_": "optuna.pruners.MedianPruner", "n_startup_trials": 1}',
        )
        for step, loss in enumerate(curve, start=1):
            state.global_step = step * 5
            try:
                cb.on_log(None, state, None, logs={"eval_loss": loss, "loss": 9.9})
            except Pruned as e:
                s.tell(trial, state=optuna.trial.TrialState.PRUNED)
                return e.step
        s.tell(trial, curve[-1])
        return None

    assert train([0.6, 0.5, 0.4]) is None  # the first trial sets the median
    assert train([0.55, 0.45, 0.35]) is None  # better at every step: never pruned
    assert train([0.69, 0.69, 0.69]) == 5  # worse than the median at step 5: stopped there
    assert s.get_trials()[-1].intermediate_values == {5: 0.69}


def test_compare_shows_a_studys_trials_best_first(tmp_path, capsys):
    pytest.importorskip("optuna")
    from ablate.analysis.study import best_command, load, trial_rows

    s = sweeper(tmp_path, n_trials=4)
    s.config.hydra.overrides = {
        "task": ["+sweep=unit", "seed=1"]
    }  # as Hydra records the launch (multirun.yaml)
    s.sweep(["seed=1"])
    study = load(tmp_path)
    rows = trial_rows(study)
    values = [float(r[2]) for r in rows]
    assert values == sorted(values) and len(rows) == 4  # minimize: best first
    best = study.best_trial
    assert rows[0][0] == str(best.number) and rows[0][4] == str(
        best.number
    )  # its run dir, job number = trial number
    lr = trial_overrides({"optimizer.optimizer.lr": best.params["optimizer.optimizer.lr"]})[0]
    command = best_command(study, tmp_path)
    assert command.startswith("ablate train +sweep=unit seed=1 ") and lr in command
