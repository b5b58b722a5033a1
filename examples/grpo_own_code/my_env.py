# my_env.py
from ablate.tools import calculator as evaluate


class OneCall:
    """A calculator that counts its uses, one per rollout: the episode scores 1 when the calculator was called
    exactly once (TRL's environment contract: reset(**row), public methods are tools, get_reward())."""

    def reset(self, **row):
        self.calls = 0

    def calculator(self, expression: str) -> str:
        """Evaluate an arithmetic expression and return its value.

        Args:
            expression: Numbers combined with + - * / // % ** and parentheses, e.g. "347*29+18".
        """
        self.calls += 1
        return evaluate(expression)

    def get_reward(self) -> float:
        return 1.0 if self.calls == 1 else 0.0
