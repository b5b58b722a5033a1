"""`hydra/sweeper=optuna`: a study (Optuna >= 4: TPE or random sampling, a pruner) as a Hydra sweeper.

Why not hydra-optuna-sweeper: its last release (1.3.0) requires optuna<3. This is ablate's own, on
Optuna's public ask-and-tell API (`study.ask(distributions)`, `study.tell(trial, value | state)`):

- the search space is the sweep file's `hydra.sweeper.params` (ablate.launchers.study: interval,
  tag(log, ...), tag(int, ...), range, choices), the command line's overrides on top;
- the study is `<sweep dir>/study.db` (SQLite), created or continued (`load_if_exists`): rerunning
  into the same sweep dir (`ablate sweep NAME --resume`) continues it. Trials a killed driver left
  `RUNNING` are marked failed and their parameters enqueued again, so they run first; finished trials
  are never repeated. `n_trials` is the study's budget: trials this sweeper finished, over all launches;
- each batch of `n_jobs` trials goes to the configured launcher (basic, local_parallel, slurm, ray) as
  one ordinary ablate job each; job number = trial number (the job dir `<number>_<overrides>`);
- a trial's environment (hydra.job.env_set, ablate.record.studies) names the study and the trial, so
  the run reports its metric as it trains (ablate.record.callbacks.ReportToStudy) and the pruner can stop it
  (`pruned`);
- its objective is read from its run dir when the job returns (summary.json, or metrics.jsonl at
  `step`), whichever launcher ran it.

Nothing heavy at import: Hydra imports every plugin module at each start-up; optuna is imported when
the study starts, and a missing one is one line naming `pip install 'ablate[optuna]'`.
"""

# no `from __future__ import annotations`: Hydra executes plugin modules outside sys.modules at discovery
import json
import logging
from pathlib import Path
from typing import Any

from hydra.core.plugins import Plugins
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf

log = logging.getLogger(__name__)


class OptunaSweeper(Sweeper):
    """The fields are conf/hydra/sweeper/optuna.yaml's (each commented there)."""

    def __init__(
        self,
        metric: str,
        direction: str = "minimize",
        n_trials: int = 8,
        n_jobs: int = 1,
        step: int | None = None,
        study_name: str | None = None,
        sampler: DictConfig | None = None,
        pruner: DictConfig | None = None,
        params: dict[str, Any] | None = None,
        enqueue: list[dict[str, Any]] | None = None,
    ) -> None:
        self.metric, self.direction, self.step = metric, direction, step
        self.n_trials, self.n_jobs = int(n_trials), max(1, int(n_jobs))
        self.study_name, self.sampler_cfg, self.pruner_cfg = study_name, sampler, pruner
        self.params = dict(params or {})
        self.enqueue = [dict(p) for p in (enqueue or [])]
        self.config: DictConfig | None = None
        self.launcher: Any = None
        self.hydra_context: HydraContext | None = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config, self.hydra_context = config, hydra_context
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config
        )

    def _study(self, sweep_dir: Path) -> Any:
        from hydra.utils import instantiate

        from ablate.launchers.study import storage_url
        from ablate.record.studies import require_optuna, storage

        optuna = require_optuna()
        url = storage_url(sweep_dir)
        name = self.study_name or str(OmegaConf.select(self.config, "sweep_name", default="study"))
        study = optuna.create_study(
            storage=storage(url),
            study_name=name,
            direction=self.direction,
            load_if_exists=True,
            sampler=instantiate(self.sampler_cfg) if self.sampler_cfg else None,
            pruner=instantiate(self.pruner_cfg) if self.pruner_cfg else None,
        )
        seed = OmegaConf.select(self.sampler_cfg, "seed", default=None) if self.sampler_cfg else None
        if seed is not None and (done := len(study.get_trials(deepcopy=False))):
            # a continued study: a sampler seeded as at its start would draw its first trials' parameters
            # again
            study.sampler = instantiate(self.sampler_cfg, seed=int(seed) + done)
        if study.direction.name.lower() != self.direction.lower():
            from ablate.errors import ConfigError

            raise ConfigError(
                f"{url}: study {name} was created to {study.direction.name.lower()}, "
                f"not {self.direction}: launch it into a new sweep dir"
            )
        return study, url

    def sweep(self, arguments: list[str]) -> Any:
        from ablate.launchers.study import check_study, search_space, trial_overrides
        from ablate.record.studies import require_optuna

        optuna = require_optuna()
        assert self.config is not None and self.launcher is not None
        space, fixed = search_space(self.params, list(arguments))
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        check_study(sweep_dir)  # a damaged study.db: one line, before multirun.yaml is rewritten
        study, url = self._study(sweep_dir)
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        self._requeue_stale(study, optuna, sweep_dir)
        if not study.get_trials(deepcopy=False):  # a new study: the trials the user asked for first
            for params in self.enqueue:
                study.enqueue_trial(params)
        returns = []
        while (left := self.n_trials - _finished(study)) > 0:
            trials = [study.ask(space) for _ in range(min(self.n_jobs, left))]
            batch = [
                [*fixed, *trial_overrides(t.params), *self._env(url, study.study_name, t)] for t in trials
            ]
            for t in trials:
                t.set_user_attr("overrides", " ".join(trial_overrides(t.params)))
            # job numbers are trial numbers: one driver asks them in a row
            results = self.launcher.launch(batch, initial_job_idx=trials[0].number)
            for trial, ret in zip(trials, results):
                self._tell(study, trial, ret, optuna)
            returns.append(results)
        _print_best(study, url)
        return returns

    def _env(self, url: str, study_name: str, trial: Any) -> list[str]:
        """The job's hydra overrides naming its study and trial (not task ones: the run dir's name stays)."""
        from ablate.config.compose import quote_override_value
        from ablate.record.studies import METRIC_ENV, PRUNER_ENV, STORAGE_ENV, STUDY_ENV, TRIAL_ENV

        env = {
            STORAGE_ENV: url,
            STUDY_ENV: study_name,
            TRIAL_ENV: str(trial._trial_id),
            METRIC_ENV: self.metric,
            PRUNER_ENV: json.dumps(OmegaConf.to_container(self.pruner_cfg, resolve=True))
            if self.pruner_cfg
            else "",
        }
        return [f"++hydra.job.env_set.{k}={quote_override_value(v)}" for k, v in env.items()]

    def _tell(self, study: Any, trial: Any, ret: Any, optuna: Any) -> None:
        """Score the finished job from its run dir and tell the study: complete, pruned or failed."""
        from ablate.launchers.study import objective
        from ablate.record import rundir

        run_dir = (
            Path(str(OmegaConf.select(ret.hydra_cfg, "hydra.runtime.output_dir"))) if ret.hydra_cfg else None
        )
        summary = (rundir.read_json(run_dir / rundir.SUMMARY) if run_dir else None) or {}
        status = str(summary.get("status", "failed"))
        value = objective(run_dir, self.metric, self.step) if run_dir and status == "completed" else None
        trial.set_user_attr("run_dir", str(run_dir))
        if status == "completed" and value is None:
            status = f"failed (no {self.metric} in its summary or metrics.jsonl)"
        trial.set_user_attr("status", status)
        if status == "pruned":
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            log.info(
                "trial %d: %s -> pruned at step %s",
                trial.number,
                trial.user_attrs["overrides"],
                summary.get("pruned_at"),
            )
        elif status == "completed":
            study.tell(trial, value)
            log.info(
                "trial %d: %s -> %s=%.6g", trial.number, trial.user_attrs["overrides"], self.metric, value
            )
        else:
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
            log.warning(
                "trial %d: %s -> %s (%s)", trial.number, trial.user_attrs["overrides"], status, run_dir
            )

    @staticmethod
    def _requeue_stale(study: Any, optuna: Any, sweep_dir: Path) -> None:
        """Trials a killed driver left RUNNING are failed, and their parameters run again first (a new
        trial, a new job dir); the old job dir is moved into `<sweep dir>/.replaced/`, as `--force` does
        to a changed job of a grid, so the sweep's table and `ablate compare` hold each trial once."""
        import shutil
        import time

        from ablate.launchers.sweep_resume import job_dir

        for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
            study.tell(t.number, state=optuna.trial.TrialState.FAIL)
            old = job_dir(sweep_dir, t.number)
            if old is not None:
                aside = sweep_dir / ".replaced" / f"{old.name}-{time.strftime('%Y%m%d-%H%M%S')}"
                aside.parent.mkdir(exist_ok=True)
                shutil.move(str(old), aside)
            study.enqueue_trial(t.params, user_attrs={"retry_of": t.number})
            log.warning(
                "trial %d was left running by an earlier driver: marked failed, its parameters queued again",
                t.number,
            )


def _finished(study: Any) -> int:
    """Trials this sweeper ended (complete, pruned, or failed as a job): the budget spent."""
    return sum("status" in t.user_attrs for t in study.get_trials(deepcopy=False))


def _print_best(study: Any, url: str) -> None:
    try:
        best = study.best_trial
    except ValueError:
        print(f"study {study.study_name} ({url}): no trial completed")
        return
    print(
        f"study {study.study_name}: best trial {best.number}, value {best.value:.6g}: "
        f"{best.user_attrs.get('overrides')}"
        f"\n  run dir: {best.user_attrs.get('run_dir')}\n  study: {url} (optuna-dashboard {url})"
    )
