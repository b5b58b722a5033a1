"""ablate's Hydra plugins: the detached SLURM launcher (`ablate sweep ... --detach`)."""
