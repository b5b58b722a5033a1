"""One run's lifecycle, around the trainer: composing its config, validating it, owning its run
directory (lock, run.json, summary.json, checkpoints), secrets, interrupts and preemption, and the
process's set-up (threads, malloc). `ablate.train` wires these together."""
