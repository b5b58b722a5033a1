"""One schema per config node: a dataclass whose fields are the node's keys, each declared once with
its type, its default, its one-line help and its check. A mistake is one line, `key=value: must be <what>`.

Declared once, checked once, wherever the node is made:
- Hydra composes `method.args` and `speed` from their schema (a structured config in its ConfigStore:
  ablate.config.compose), so the YAML files under conf/ only select it and override; OmegaConf refuses a
  value of the wrong type while composing, in this schema's words (ablate.config.validate);
- a method's arguments class subclasses its schema (`DPOConfig(DPOArgs, TrainingArguments)`), so
  creating one checks it (`__post_init__`, as TRL's configs do), in a run or from Python;
- the launching process checks the composed config against the same schemas before torch is
  imported or any run dir exists (ablate.config.checks: `Schema.problems` on each node's values).

Nodes whose values go to code ablate does not own (a torch optimizer, a user's loader) have schemas
whose fields default to ABSENT: a key the node does not hold is not checked. No torch import here.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator, Mapping
from typing import Any, ClassVar

from ablate.errors import ConfigError

ABSENT: Any = type("Absent", (), {"__repr__": lambda self: "ABSENT"})()  # a key the node does not set
MISSING = "???"  # OmegaConf's mark of a value the config must be given (model=local's path)


def is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


@dataclasses.dataclass(frozen=True)
class Rule:
    """What a field's value must be: `test(value, node)`, and the words for it (`what`: text, or text
    made from the node and its key prefix, for a check against a sibling field)."""

    test: Callable[[Any, Any], bool]
    what: str | Callable[[Any, str], str]

    def words(self, node: Any, at: str) -> str:
        return self.what if isinstance(self.what, str) else self.what(node, at)

    def __or__(self, other: Rule) -> Rule:
        """Either rule (for a value that may be, e.g., all-linear or a list)."""
        return Rule(
            lambda v, n: self.test(v, n) or other.test(v, n),
            lambda n, at: f"{self.words(n, at)} or {other.words(n, at)}",
        )


def integer(at_least: int, why: str = "", at_most: int | None = None) -> Rule:
    if at_most is not None:
        return Rule(
            lambda v, n: is_int(v) and at_least <= v <= at_most, f"an integer in {at_least}..{at_most}{why}"
        )
    return Rule(lambda v, n: is_int(v) and v >= at_least, f"an integer >= {at_least}{why}")


def number(above: float | None = None, at_least: float | None = None, why: str = "") -> Rule:
    if above is not None:
        return Rule(lambda v, n: is_num(v) and v > above, f"a number > {above:g}{why}")
    return Rule(lambda v, n: is_num(v) and v >= at_least, f"a number >= {at_least:g}{why}")


def fraction(of: str = "", high: float = 1.0, closed: bool = True) -> Rule:
    """A number in [0, high] ([0, high) with `closed=False`)."""
    bound = "]" if closed else ")"
    return Rule(
        lambda v, n: is_num(v) and 0 <= v and (v <= high if closed else v < high),
        f"{of or 'a number'} in [0, {high:g}{bound}",
    )


def choice(*values: Any, words: str = "") -> Rule:
    return Rule(lambda v, n: v in values, words or f"one of {', '.join(map(str, values))}")


BOOL = Rule(lambda v, n: isinstance(v, bool), "true or false")


def nullable(rule: Rule, null: str = "") -> Rule:
    """`rule`, or null (`null`: what null means, said in the message)."""
    return Rule(
        lambda v, n: v is None or rule.test(v, n),
        lambda n, at: f"null{f' ({null})' if null else ''} or {rule.words(n, at)}",
    )


def field(
    default: Any = ABSENT,
    check: Rule | None = None,
    help: str = "",  # dataclass metadata's name
    factory: Callable[[], Any] | None = None,
) -> Any:
    """A schema field: its default (a list: `factory`), its check and its one-line help."""
    meta = {"check": check, "help": help}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


Problem = tuple[str, Any, str]  # (dotted key, value, what it must be)


class Schema:
    """Base of every node's schema (a dataclass). `node`: the node's dotted path in the config
    ("" = the root), the prefix of every key a refusal names; `targets`: the `_target_`s whose node
    this schema checks (a method's arguments class), else the schema checks the node at `node`."""

    node: ClassVar[str] = ""
    targets: ClassVar[tuple[str, ...]] = ()
    partial: ClassVar[bool | None] = None  # Hydra's `_partial_` for its node (a function called later)
    recursive: ClassVar[bool | None] = None  # Hydra's `_recursive_` for its node
    # fields whose default is the data's value where the data node has that key (ablate.config.compose.node)
    from_data: ClassVar[tuple[str, ...]] = ()
    declared: ClassVar[list[type[Schema]]] = []  # every schema of ablate's (a user's subclass declares none)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "targets" in cls.__dict__ or "node" in cls.__dict__:
            Schema.declared.append(cls)

    def __post_init__(self) -> None:
        """Checks first, then the next class's own set-up (TrainingArguments')."""
        # built by Hydra without recursion (`_recursive_: false`): its lists too
        for f in dataclasses.fields(self):
            value = getattr(self, f.name, None)
            if plain(value) is not value:
                setattr(self, f.name, plain(value))
        self.check()
        after = getattr(super(), "__post_init__", None)
        if after is not None:
            after()

    def check(self, at: str | None = None) -> None:
        for key, value, what in self.problems(at):
            raise ConfigError(refusal(key, value, what))

    def problems(self, at: str | None = None) -> Iterator[Problem]:
        """Every field whose value fails its check (ABSENT ones are not checked)."""
        at = self.node if at is None else at
        for f in dataclasses.fields(self):
            rule = f.metadata.get("check")
            value = getattr(self, f.name, ABSENT)
            if rule is not None and value is not ABSENT and not rule.test(value, self):
                yield f"{at + '.' if at else ''}{f.name}", value, rule.words(self, at)

    def relations(self, cfg: Mapping[str, Any]) -> Iterator[Problem]:
        """Checks against other nodes of the composed config (`cfg`, resolved): e.g. one reward weight
        per reward function. None by default."""
        return iter(())

    @classmethod
    def of(cls, values: Mapping[str, Any]) -> Schema:
        """The node's `values` as this schema, not yet checked (the fields it does not hold: defaults)."""
        self = cls.__new__(cls)
        for f in dataclasses.fields(cls):
            if f.name in values:
                value = values[f.name]
            elif f.default_factory is not dataclasses.MISSING:
                value = f.default_factory()
            else:
                value = f.default
            object.__setattr__(self, f.name, value)
        return self


def from_signature(fn: Callable[..., Any]) -> type[Schema]:
    """A schema of `fn`'s keyword settings (the parameters with a default; the others are what its caller
    passes): each field's default the function's own, its type and check its annotation's (float, int, bool,
    str, optional, and annotated-types' bounds: `Annotated[float, Ge(0)]`). `_target_` is `fn`, called later
    with the rest (`_partial_`). Made once per function."""
    import inspect
    import typing

    path = f"{fn.__module__}.{fn.__qualname__}"
    made = next((c for c in Schema.declared if c.targets == (path,)), None)
    if made is not None:
        return made
    hints = typing.get_type_hints(fn, include_extras=True)
    fields = []
    for p in inspect.signature(fn).parameters.values():
        if p.default is p.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        kind, rule = _typed(hints.get(p.name, Any))
        fields.append((p.name, kind, field(p.default, rule, f"{fn.__name__}'s {p.name}")))
    return dataclasses.make_dataclass(
        fn.__name__, fields, bases=(Schema,), namespace={"targets": (path,), "partial": True}
    )


def _typed(hint: Any) -> tuple[Any, Rule | None]:
    """An annotation as a field's type (what OmegaConf checks while composing) and its check."""
    import typing

    bounds = []
    if typing.get_origin(hint) is typing.Annotated:
        hint, *bounds = typing.get_args(hint)
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    optional = len(args) < len(typing.get_args(hint))
    base = args[0] if optional and len(args) == 1 else hint
    plain_rules = {
        float: Rule(lambda v, n: is_num(v), "a number"),
        int: Rule(lambda v, n: is_int(v), "an integer"),
        bool: BOOL,
        str: Rule(lambda v, n: isinstance(v, str), "a string"),
    }
    if base not in plain_rules:
        return Any, None
    rule = plain_rules[base]
    for b in bounds:  # annotated-types' Ge, Gt, Le, Lt (pydantic's and TRL's own vocabulary)
        for name, test, words in (
            ("ge", lambda v, x: v >= x, ">="),
            ("gt", lambda v, x: v > x, ">"),
            ("le", lambda v, x: v <= x, "<="),
            ("lt", lambda v, x: v < x, "<"),
        ):
            if getattr(b, name, None) is not None:
                x, first = getattr(b, name), rule
                rule = Rule(
                    lambda v, n, x=x, t=test, r=first: r.test(v, n) and t(v, x),
                    f"{first.words(None, '')} {words} {x}",
                )
    if optional:
        return base | None, nullable(rule)
    return base, rule


def plain(value: Any) -> Any:
    """A config node as plain Python: a node built without recursion (GRPO's method.args, `_recursive_:
    false`, so that the `_target_` nodes of tools and environments reach the trainer as config) holds Hydra's
    containers."""
    if type(value).__name__ in ("DictConfig", "ListConfig"):
        from omegaconf import OmegaConf

        return OmegaConf.to_container(value, resolve=True)
    return value


def call_mismatch(fn: Any, like: Callable[..., Any]) -> str | None:
    """Why `fn` cannot be called as `like` is (its required arguments: positionally, or by name where
    `fn` takes that name keyword-only), or None when it can."""
    import functools
    import inspect

    try:
        theirs = inspect.signature(fn, follow_wrapped=False).parameters
        ours = inspect.signature(like, follow_wrapped=False).parameters.values()
    except (TypeError, ValueError):  # a partial whose keywords its function does not take, or a builtin
        if isinstance(fn, functools.partial):
            taken = inspect.signature(fn.func, follow_wrapped=False).parameters
            if not any(p.kind == p.VAR_KEYWORD for p in taken.values()):
                extra = [k for k in fn.keywords if k not in taken]
                if extra:
                    return f"it does not take the group's {', '.join(extra)}"
        return None  # a builtin without a signature: cannot tell
    required = [p for p in ours if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    by_name = {
        p.name
        for p in required
        if p.kind == p.KEYWORD_ONLY or (p.name in theirs and theirs[p.name].kind == p.KEYWORD_ONLY)
    }
    try:
        inspect.signature(fn, follow_wrapped=False).bind(
            *[None] * sum(p.name not in by_name for p in required), **dict.fromkeys(by_name)
        )
    except TypeError as e:
        return str(e)
    return None


def fits(fn: Any, like: Callable[..., Any], key: str) -> Any:
    """`fn`, a function a node of config `key` builds for a trainer (a loss, an aggregation), when it
    takes the call the trainer makes (`like`'s); else one line. The config's own check of it, with the
    options that do fit, is ablate.config.code_checks.check_trainer_functions."""
    problem = call_mismatch(fn, like)
    if problem is not None:
        name = getattr(getattr(fn, "func", fn), "__name__", repr(fn))
        raise ConfigError(
            f"{key}: {name} does not fit: it is called like {like.__module__}.{like.__name__} ({problem})"
        )
    return fn


def schema_for(path: str, target: Any = None) -> type[Schema] | None:
    """The schema of the node at `path` whose `_target_` is `target` (of those for that target, the one made
    for `path`: +teacher=tiny's, not model=tiny's), else the one of that path that names no target."""
    # each module registers its schemas
    from ablate.schema import args, evaluation, grpo, losses, method, models, nodes, speed  # noqa: F401

    found = [c for c in Schema.declared if str(target) in c.targets]
    found += [c for c in Schema.declared if not c.targets and c.node == path]
    return next((c for c in found if c.node == path), found[0] if found else None)


def refusal(key: str, v: Any, what: str) -> str:
    """`key=value: must be ...`; a number written as a quoted string gets the spelling that makes it one.
    A problem of the key as a whole (no value: ABSENT) is `key: what`."""
    if v is ABSENT:
        return f"{key}: {what}"
    if isinstance(v, str) and _looks_numeric(v) and ("number" in what or "integer" in what):
        return (
            f"{key}='{v}' is a string (quoted), not a number: write it unquoted, {key}={v} (in a YAML file "
            f"{key.rsplit('.', 1)[-1]}: {v} without quotes; YAML 1.1 reads 1e-3 as text: write 1.0e-3)"
        )
    return f"{key}={show(v)}: must be {what}"


def _looks_numeric(v: str) -> bool:
    try:
        float(v)
    except ValueError:
        return False
    return True


def show(v: Any) -> str:
    """A value as it is written on the command line."""
    if isinstance(v, (list, tuple)) or type(v).__name__ == "ListConfig":
        return "[" + ",".join(show(x) for x in v) + "]"
    if (
        isinstance(v, float) and v.is_integer() and abs(v) < 1e15
    ):  # a typed float field holds `beta=-1` as -1.0
        return str(int(v))
    return "null" if v is None else str(v).lower() if isinstance(v, bool) else str(v)
