"""Reward functions for GRPO, selected by a data config's `reward_funcs: {name: {_target_: ...}}`.

A reward function is called as `f(prompts, completions, completion_ids, **dataset_columns)` with one
entry per completion, and returns one float (or None: "cannot score this one") per completion.
Functions are listed with `_partial_: true` so Hydra hands over the function instead of calling it.
"""
