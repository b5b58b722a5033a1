"""Which metrics two arms may be ranked on. A metric whose definition changes with the arm's config is
not: two DPO losses' `loss` values are two different objectives (sigmoid's -log σ(βΔ) against hinge's
max(0, 1 − βΔ)), and DPO's implicit rewards β·log(π/π_ref) change scale with β. Each method's YAML
declares what defines its metrics (`defined_by: {metric: [config keys]}`); `ablate compare` reads the
declaration and the keys' values from each run's composed config (.hydra/config.yaml), so a user's
method declares its own. A run recorded without a declaration (an older ablate, a method that names
none) gets FALLBACK: its loss is its method's own. A held-out metric (`eval_loss`) is defined as its
training namesake (`loss`)."""

from __future__ import annotations

from typing import Any

from ablate.analysis.runs import Group, Run

FALLBACK = {"loss": ["method.name"]}
HELD_OUT = "eval_"  # the Trainer's prefix of held-out metrics (eval.json)


BACKENDS = ("lm_eval/", "judge/")  # eval.json's metrics of the other evaluation backends: held out by nature


def held_out_name(metric: str) -> str:
    """An eval_examples.jsonl metric's name in eval.json: `rewards/margins` -> `eval_rewards/margins` (the
    method's own eval, as the Trainer prefixes it); a backend's `lm_eval/sort/exact_match` as it is."""
    return metric if metric.startswith((HELD_OUT, *BACKENDS)) else f"{HELD_OUT}{metric}"


def bare(metric: str) -> str:
    """`eval_loss` -> `loss`: a held-out metric is defined as its training namesake."""
    return metric[len(HELD_OUT) :] if metric.startswith(HELD_OUT) else metric


def _config(run: Run) -> dict[str, Any]:
    """The run's flat config; a run dir without one (Hydra's file missing) still has its method's name."""
    return run.config or {"method.name": run.summary.get("method")}


def _declared(config: dict[str, Any]) -> dict[str, list[str]]:
    """{metric: config keys} from `method.defined_by` (flattened: `method.defined_by.<metric>`)."""
    prefix = "method.defined_by."
    found = {
        k[len(prefix) :]: [str(x) for x in v]
        for k, v in config.items()
        if k.startswith(prefix) and isinstance(v, list)
    }
    return found or FALLBACK


def _subtree(config: dict[str, Any], key: str) -> dict[str, Any]:
    """The values at `key` and under it (a loss node: its `_target_` and hyper-parameters)."""
    return {k: v for k, v in config.items() if k == key or k.startswith(key + ".")}


def differing(metric: str, a: Group, b: Group) -> dict[str, tuple[str, str]]:
    """The config keys defining `metric` (either arm's declaration) whose values differ between the arms:
    {key: (a's value, b's value) as shown}; empty when the metric means the same in both."""
    ca, cb = _config(a.runs[0]), _config(b.runs[0])
    keys = dict.fromkeys(_declared(ca).get(bare(metric), []) + _declared(cb).get(bare(metric), []))
    out = {}
    for key in keys:
        sa, sb = _subtree(ca, key), _subtree(cb, key)
        if sa != sb:
            out[key] = (_show(key, sa, sb), _show(key, sb, sa))
    names = (str(ca.get("method.name")), str(cb.get("method.name")))
    if out and names[0] != names[1]:  # arms of two methods: that says it all
        return {"method.name": names}
    return out


def _show(key: str, mine: dict[str, Any], other: dict[str, Any]) -> str:
    """A value as the user named it: a loss node by its function's name (`sigmoid`), else its leaves that
    differ from the other arm's (`label_smoothing=0.1`); `-` when the arm has no such key."""
    if not mine:
        return "-"
    target = mine.get(f"{key}._target_")
    if target is not None and target != other.get(f"{key}._target_"):
        return str(target).rsplit(".", 1)[-1]
    leaves = [(k, v) for k, v in mine.items() if other.get(k) != v]
    return ", ".join(str(v) if k == key else f"{k[len(key) + 1 :]}={v}" for k, v in leaves)


def _name(key: str) -> str:
    """`method.dpo_loss` -> `dpo_loss`; `method.name` -> `method`."""
    return "method" if key == "method.name" else key.rsplit(".", 1)[-1]


def not_compared_line(
    skipped: dict[str, list[dict[str, tuple[str, str]]]], ranked: list[str], asked: bool
) -> str:
    """One line naming the metrics left unranked and why, then what is ranked instead. `skipped`:
    {metric: [differing(...) of each pair of arms where it differs]}; `ranked`: the metrics still
    ranked; `asked`: the metrics came from --metric."""
    if not skipped:
        return ""
    reasons: dict[str, list[str]] = {}
    for metric, pairs in skipped.items():
        keys = dict.fromkeys(k for p in pairs for k in p)
        parts = []
        for key in keys:
            values = list(dict.fromkeys(v for p in pairs if key in p for v in p[key]))
            parts.append(f"{_name(key)} ({' vs '.join(values) if len(values) == 2 else ', '.join(values)})")
        reasons.setdefault(" and ".join(parts), []).append(metric)
    said = "; ".join(
        f"{', '.join(ms)} {'is' if len(ms) == 1 else 'are'} defined by each arm's {why}"
        for why, ms in reasons.items()
    )
    if ranked and all(m.startswith((HELD_OUT, *BACKENDS)) for m in ranked):
        tail = "ranking the held-out metrics instead"
    elif ranked:
        tail = "ranking the others instead" + (
            "" if asked else " (`ablate eval RUN_DIR` on each run adds held-out ones)"
        )
    else:
        tail = "nothing left to rank" + (
            ": pick another --metric"
            if asked
            else " (`ablate eval RUN_DIR` on each run adds held-out metrics)"
        )
    return f"not compared: {said}; {tail}"
