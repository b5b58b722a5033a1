"""Where a sweep's jobs run and how a sweep is followed: sweep files and their job table, sweep
resume, and SLURM job status (Hydra's launcher plugins live in `hydra_plugins.ablate_launchers`)."""
