"""Test helpers: reward functions a user gets wrong (tests/integration/test_bad_inputs.py, issue 32)."""

import math


def raises(prompts, completions, **kwargs):
    raise ValueError("my reward broke on purpose")


def one_short(prompts, completions, **kwargs):
    return [1.0] * (len(completions) - 1)


def strings(prompts, completions, **kwargs):
    return ["good"] * len(completions)


def scalar(prompts, completions, **kwargs):
    return 1.0


def wrong_signature(text):
    return [1.0]


def positional_only(prompts, completions, /, **kwargs):
    return [1.0] * len(completions)


def infinite(prompts, completions, **kwargs):
    return [math.inf] * len(completions)


def unscored(prompts, completions, **kwargs):
    return [None] * len(completions)


def needs_a_column(prompts, completions, completion_ids, answer):
    return [1.0] * len(completions)


def length(prompts, completions, **kwargs):
    return [float(len(c)) for c in completions]


class NotCallable:
    """A class listed as a reward whose instances cannot be called (issue 36: a reward model is a class with __call__)."""

    def __init__(self, **kwargs):
        pass


class WordyEnv:
    """An environment (TRL's contract) whose get_reward() returns a word, not a number."""

    def reset(self, **row):
        return None

    def lookup(self, key: str) -> str:
        """Look a key up.

        Args:
            key: The key.
        """
        return key

    def get_reward(self):
        return "good"
