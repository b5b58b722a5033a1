"""Reward functions for GRPO, selected by a data config's `reward_funcs`.

A reward function is called as `f(prompts, completions, completion_ids, **dataset_columns)` with one
entry per completion, and returns one float (or None: "cannot score this one") per completion. A data
config lists them as dotted paths (`reward_funcs: [myrew.short]`, the short form; a module in the current
directory is found: `ablate.rewards.resolve`) or as named `{_target_: ..., _partial_: true}` nodes.
`RewardModel` is a learned reward model used the same way (`{_target_: ablate.rewards.RewardModel, path:
DIR}`).
"""

from ablate.rewards.reward_model import RewardModel

__all__ = ["RewardModel"]
