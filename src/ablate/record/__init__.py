"""The run record: the run directory contract (what training writes and `compare`, `ls`, resume read),
a run's lifecycle in its dir, the callbacks that write it, and the secrets kept out of it."""
