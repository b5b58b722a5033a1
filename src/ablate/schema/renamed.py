"""Config groups renamed so that their names say what they configure, old -> new, for one release:
an old spelling still works (ablate.config.moved rewrites it, saying so once), and a run recorded
with one (run.json's overrides and config) still resumes, and compares, as the same run."""

from __future__ import annotations

from typing import Any

GROUPS = {  # a group's old path -> its new one; its node (the path with dots) moved with it
    "perf": "speed",  # the switches of ablate.speed
    "method/loss": "method/dpo_loss",  # DPO's only
    "method/aggregation": "method/grpo_aggregation",  # GRPO's only, as the next three
    "method/objective": "method/grpo_objective",
    "method/scale_rewards": "method/grpo_scale_rewards",
    "method/reward_aggregation": "method/grpo_reward_aggregation",
    "method/generator": "method/rollouts",  # the engine of ablate.rollouts
    "model/lr": "optimizer/lr",  # the optimizer's lr a model is fine-tuned at (no node of its own)
}
NODES = {old.replace("/", "."): new.replace("/", ".") for old, new in GROUPS.items() if old != "model/lr"}


def current(override: str) -> tuple[str, str | None]:
    """`override` in today's names, and the old name it used (None: nothing to rename)."""
    body = override.lstrip("+~")
    prefix = override[: len(override) - len(body)]
    key, eq, value = body.partition("=")
    for table in (GROUPS, NODES):
        for old, new in table.items():
            if key == old or key.startswith((old + ".", old + "@")):
                if old == "model/lr":  # optimizer/lr is in the defaults list already: an override, not an append
                    prefix = prefix.replace("+", "")
                return f"{prefix}{new}{key[len(old):]}{eq}{value}", old
    return override, None


def current_overrides(overrides: list[str]) -> list[str]:
    return [current(str(o))[0] for o in overrides]


def current_config(config: dict[str, Any]) -> dict[str, Any]:
    """A recorded (resolved) config with its nodes under today's names (each node moved within its parent)."""
    out = dict(config)
    for old, new in NODES.items():
        *path, leaf = old.split(".")
        parent = out
        for part in path:
            if not isinstance(parent.get(part), dict):
                break
            parent[part] = parent = dict(parent[part])
        else:
            if leaf in parent:
                parent[new.rsplit(".", 1)[-1]] = parent.pop(leaf)
    return out
