"""Experiment trackers selected by `conf/logger/*.yaml`. ablate owns the tracker's run.

A tracker has `start(config, run_dir, run_info)`, `callback()` (a TrainerCallback that forwards log
events, or None) and `finish(status)`. `ablate.train` calls `finish` in `finally`, so a crashed job
in a sequential sweep never leaves its run open for the next job to log into.
"""
