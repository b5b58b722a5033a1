"""ablate's Hydra launcher plugins (Hydra instantiates launchers only from the hydra_plugins namespace).

`DetachedSlurmLauncher`: `ablate sweep NAME hydra/launcher=slurm --detach` (see ablate/launchers/slurm.py).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn, JobStatus

try:
    from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher
except ImportError:
    # no slurm extra: Hydra imports every plugin module at start-up and would warn on every run;
    # hydra/launcher=slurm says `pip install 'ablate[slurm]'`
    SlurmLauncher = object  # type: ignore[assignment,misc]


class _Submitted:
    """A submitted job that is not waited for: its result is a placeholder that the sweeper accepts."""

    def __init__(self, job: Any) -> None:
        self.job = job

    def results(self) -> list[JobReturn]:
        return [JobReturn(status=JobStatus.COMPLETED, _return_value=None)]


class DetachedSlurmLauncher(SlurmLauncher):
    """Hydra's SlurmLauncher, returning as soon as the job array is submitted."""

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        import submitit

        from ablate.launchers import slurm, sweep

        submitted: list[Any] = []
        original = submitit.AutoExecutor.map_array

        def map_array(executor: Any, fn: Any, *iterable: Any) -> list[_Submitted]:
            jobs = original(executor, fn, *iterable)
            submitted.extend(jobs)
            return [_Submitted(j) for j in jobs]

        submitit.AutoExecutor.map_array = map_array  # the parent's launch, minus its wait for results
        try:
            results = super().launch(job_overrides, initial_job_idx)
        finally:
            submitit.AutoExecutor.map_array = original
        assert self.config is not None
        sweep_dir = Path(str(self.config.hydra.sweep.dir)).resolve()
        recorded = slurm.read_jobs(sweep_dir)
        recorded.update(
            {
                str(initial_job_idx + i): {"job_id": str(j.job_id), "overrides": list(o)}
                for i, (j, o) in enumerate(zip(submitted, job_overrides))
            }
        )
        (sweep_dir / slurm.JOBS_FILE).write_text(json.dumps(recorded, indent=2) + "\n")
        sweep.detached(sweep_dir, [str(j.job_id) for j in submitted])
        return results
