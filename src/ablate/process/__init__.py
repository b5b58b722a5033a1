"""This process: how it is stopped (signals, SLURM preemption), its threads and memory, what it prints."""
