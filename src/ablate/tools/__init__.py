"""Tools a GRPO policy may call during its rollouts (`method.args.tools=[ablate.tools.calculator]`).

A tool is a plain Python function with type hints and a Google-style docstring: transformers'
`get_json_schema` turns its signature and docstring into the schema a chat template shows the model,
as TRL 1.16 does with its `tools=`. It returns the result (anything; the model reads `str(result)`) or
raises: the error goes back to the model as the tool's answer and counts as a failed call
(`tools/failure_frequency`). Your own tools are functions like these in your own module
(`method.args.tools=[mytools.search]`, found in the current directory: ablate.rewards.resolve).
"""

from __future__ import annotations

import ast
import operator

_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
MAX_EXPONENT = 64  # 10**64 is an answer; 9**9**9 would hold the process for minutes
MAX_LENGTH = 200  # characters of an expression: a model's runaway call is refused, not parsed


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression and return its value.

    Args:
        expression: Numbers combined with + - * / // % ** and parentheses, e.g. "347*29+18".
    """
    if len(expression) > MAX_LENGTH:
        raise ValueError(f"expression longer than {MAX_LENGTH} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise ValueError(f"not an arithmetic expression: {expression!r}") from None
    value = _eval(tree.body)
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        value = int(value)  # 6/3 reads as 2, as a person writes it
    return str(round(value, 6) if isinstance(value, float) else value)


def _eval(node: ast.AST) -> int | float:
    """Numbers and the operators above only: no names, calls or attributes (the model's text is not code)."""
    if (
        isinstance(node, ast.Constant)
        and isinstance(node.value, (int, float))
        and not isinstance(node.value, bool)
    ):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise ValueError(f"exponent {right} is too large (at most {MAX_EXPONENT})")
        return _BINARY[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    raise ValueError(f"unsupported in an arithmetic expression: {ast.unparse(node)!r}")
