"""The link between a study's driver (hydra/sweeper=optuna, ablate.launchers.study) and its trials
(ablate.record.callbacks.ReportToStudy): the job environment naming the study, and the study's storage. No
torch, no transformers: the launching process imports it."""

from __future__ import annotations

from typing import Any

from ablate.errors import missing_extra

# set per job by the sweeper (hydra.job.env_set): where the study is, which trial this run is, what it reports
STORAGE_ENV, STUDY_ENV, TRIAL_ENV, METRIC_ENV = (
    "ABLATE_STUDY_STORAGE",
    "ABLATE_STUDY_NAME",
    "ABLATE_TRIAL_ID",
    "ABLATE_STUDY_METRIC",
)
# the pruner's config as JSON: Optuna keeps no pruner in the database, each process builds its own
PRUNER_ENV = "ABLATE_STUDY_PRUNER"


def require_optuna() -> Any:
    """The optuna module, or one line naming the extra that installs it."""
    try:
        import optuna
    except ImportError:
        raise missing_extra("optuna", "optuna", "hydra/sweeper=optuna (a study)") from None
    return optuna


def storage(url: str) -> Any:
    """Optuna's RDBStorage on `url`, with a generous SQLite lock timeout: the driver and every running
    trial (its pruning reports) write to the one file."""
    optuna = require_optuna()
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # ablate prints each trial's line itself
    return optuna.storages.RDBStorage(url=url, engine_kwargs={"connect_args": {"timeout": 60}})


def pruner(config_json: str | None) -> Any:
    """The study's pruner from its config (`_target_` and arguments, as JSON); None: Optuna's default."""
    import json

    if not config_json:
        return None
    from hydra.utils import instantiate

    return instantiate(json.loads(config_json))
