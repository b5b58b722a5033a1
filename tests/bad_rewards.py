"""Test helpers: reward functions, tools and environments a user gets wrong (tests/integration/test_bad_inputs.py)."""

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


def exits(prompts, completions, **kwargs):
    """Calls sys.exit(0), as a script's reward function might when it thinks it is done."""
    import sys

    sys.exit(0)


def huge(prompts, completions, **kwargs):
    """Finite rewards whose group std overflows float32 (+-3e38)."""
    return [3e38 if i % 2 else -3e38 for i in range(len(completions))]


def exit_tool(expression: str) -> str:
    """Evaluate an arithmetic expression.

    Args:
        expression: The expression.
    """
    import sys

    sys.exit(0)


class EnvWithArgs:
    """An environment whose __init__ needs an argument (TRL builds one per rollout with no arguments)."""

    def __init__(self, size):
        self.size = size

    def reset(self, **row):
        return None

    def lookup(self, key: str) -> str:
        """Look a key up.

        Args:
            key: The key.
        """
        return key


def beyond_float32(prompts, completions, **kwargs):
    """A finite Python float that float32 (the reward table's dtype) cannot hold."""
    return [1e39] * len(completions)
