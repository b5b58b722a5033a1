"""A run that is one trial of a study (hydra/sweeper=optuna): it reports its metric to the study as it
trains, and the study's pruner may stop it early (Optuna's pruning protocol: `trial.report(value,
step)`, then `trial.should_prune()`; Li et al. 2018 Hyperband, Jamieson & Talwalkar 2016 successive
halving, or the median rule of Google Vizier, Golovin et al. 2017).

The sweeper (hydra_plugins/ablate_sweepers) sets the job's environment (ablate.record.studies): the
study's storage URL, its name, the trial's id and the metric. Outside a study none is set and the run
gets no callback. A pruned run ends through `Pruned`: ablate.record.lifecycle records summary.json
status `pruned` with the step, saves no model, and the job counts as done (not failed).
"""

from __future__ import annotations

import logging
from typing import Any

from transformers import (
    TrainerCallback,
    TrainerControl,
    TrainerState,
    TrainingArguments,
)

from ablate.errors import Pruned

log = logging.getLogger("ablate")


class ReportToStudy(TrainerCallback):
    """At every log event holding the study's metric (an eval's `eval_*` or a train metric): report it
    at that step; when the pruner says so, end the run as `pruned` at that step."""

    def __init__(self, storage_url: str, study_name: str, trial_id: int, metric: str, pruner: str | None = None) -> None:
        from ablate.record.studies import pruner as make_pruner
        from ablate.record.studies import require_optuna, storage

        optuna = require_optuna()
        self.metric = metric
        study = optuna.load_study(study_name=study_name, storage=storage(storage_url), pruner=make_pruner(pruner))
        self.trial = optuna.trial.Trial(study, trial_id)

    def on_log(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
               logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        value = (logs or {}).get(self.metric)
        if not isinstance(value, (int, float)) or not state.is_world_process_zero:
            return
        self.trial.report(float(value), state.global_step)
        if self.trial.should_prune():
            log.warning("trial %d pruned at step %d (%s=%.4g)", self.trial.number, state.global_step, self.metric, value)
            raise Pruned(state.global_step, self.metric, float(value))

