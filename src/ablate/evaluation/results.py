"""Which evaluations a run asks for and has, running them, and what eval.json and eval_examples.jsonl hold
after (ablate.record.lifecycle.evaluate reads and writes the files: this module touches none).

`eval=[heldout,lm_eval,judge]` composes to `cfg.eval = {heldout: {...}, lm_eval: {...}, judge: {...}}`; each
node builds a backend (its `_target_`). eval.json's `evals` lists the backends it holds; it is written last
(atomically), so a run killed while it evaluates keeps the eval.json of before, and the same command again (a
sweep's `--resume`, `ablate eval SWEEP_DIR`) runs what `evals` lacks. A backend run again replaces its own
metrics and rows (each row names its backend: `eval`); the others' stay.
"""

from __future__ import annotations

import time
from typing import Any

from ablate.errors import ConfigError
from ablate.evaluation.base import Evaluand, Result

HELD_OUT = "heldout"  # the backend `ablate eval RUN` runs when the run's config names none
# the metrics each backend writes, by name prefix (an eval.json from before backends: held-out only)
PREFIXES = {HELD_OUT: "eval_", "lm_eval": "lm_eval/", "judge": "judge/"}
HELD_FACTS = ("split", "examples", "completions")  # the held-out backend's facts, at eval.json's top


def names(cfg: Any) -> list[str]:
    """The evaluations the config asks for (`eval=[...]`), in its order."""
    node = cfg.get("eval") if hasattr(cfg, "get") else None
    return [str(k) for k in node] if node else []


def done(record: dict[str, Any]) -> list[str]:
    """The backends an eval.json record holds."""
    if "evals" in record:
        return [str(n) for n in record["evals"]]
    return [HELD_OUT] if record.get("metrics") else []  # `ablate eval` before the group existed


def pending(cfg: Any, record: dict[str, Any]) -> list[str]:
    """What the config asks for and the eval.json record does not hold yet."""
    have = done(record)
    return [n for n in names(cfg) if n not in have]


def check(cfg: Any, swept: frozenset[str] = frozenset()) -> None:
    """Each evaluation's refusals before anything is trained or loaded: a value its schema refuses or one
    left `???` (ablate eval composes with no other check), an unknown lm-eval task, the extra missing, the hub
    needed offline, no judge: one line (ConfigError). `swept`: keys a multirun sweeps (each job checks its
    own)."""
    from omegaconf import OmegaConf

    from ablate.schema import refusal, schema_for

    judge = [("judge", cfg.judge)] if cfg.get("judge") else []
    nodes = [(f"eval.{n}", cfg.eval[n]) for n in names(cfg)] + judge
    checked = [(p, n) for p, n in nodes if not any(s == p or s.startswith(f"{p}.") for s in swept)]
    for path, node in checked:
        if missing := sorted(OmegaConf.missing_keys(node)):
            raise ConfigError(f"{missing[0]} is required: add {missing[0]}=...")  # its full key
        schema = schema_for(path, node.get("_target_"))
        values = OmegaConf.to_container(node, resolve=True)
        found = (
            schema.of({k: v for k, v in values.items() if k in schema.__dataclass_fields__})
            if schema
            else None
        )
        for key, value, what in found.problems(path) if found else []:
            raise ConfigError(refusal(key, value, what))
    for path, _ in checked:  # then what the backends check (a judge built, lm-eval's tasks), every node valid
        if path.startswith("eval."):
            backend(cfg, path[5:]).check(cfg)


def backend(cfg: Any, name: str) -> Any:
    """The backend of `cfg.eval[name]` (held-out's defaults when the config has no such node)."""
    from hydra.utils import instantiate

    node = cfg.eval[name] if name in names(cfg) else {"_target_": "ablate.evaluation.heldout.HeldOut"}
    try:
        return instantiate(node)
    except Exception as e:  # Hydra wraps the backend's own one line
        if isinstance(e.__cause__, ConfigError):
            raise ConfigError(str(e.__cause__)) from None
        raise


def run(cfg: Any, evaluand: Evaluand, asked: list[str]) -> dict[str, Result]:
    """Each backend asked, on the model under evaluation."""
    return {name: backend(cfg, name)(evaluand) for name in asked}


def merged(
    before: dict[str, Any],
    rows: list[dict[str, Any]],
    results: dict[str, Result],
    method: str,
    overrides: list[str],
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """eval.json's new record and eval_examples.jsonl's rows: `results`, and of the record and rows `before`
    what the other backends had written."""
    kept = [n for n in done(before) if n not in results]
    keep = tuple(PREFIXES.get(n, f"{n}/") for n in kept)
    metrics = {k: v for k, v in (before.get("metrics") or {}).items() if k.startswith(keep)}
    record = {k: v for k, v in before.items() if k in kept or (HELD_OUT in kept and k in HELD_FACTS)}
    record.update(time=time.strftime("%Y-%m-%dT%H:%M:%S"), method=method, overrides=overrides)
    out = [r for r in rows if r.get("eval", HELD_OUT) in kept]
    for name, result in results.items():
        metrics.update(result.metrics)
        if name == HELD_OUT:  # at the top, where `ablate compare` reads which data it scored
            record.update(result.facts)
        else:
            record[name] = result.facts
        out += [{**row, "eval": name} for row in result.examples]
    record.update(evals=[*kept, *results], metrics=metrics)
    return record, out


def summary_line(record: dict[str, Any], compare_metrics: list[str]) -> str:
    """`eval.json: eval_rewards/accuracies 0.98, lm_eval/ablate_sort/exact_match 1, judge/win_rate 0.56`: the
    method's key metrics held out, and the other backends' (standard errors left out)."""
    key = [f"eval_{m}" for m in compare_metrics]
    shown = [
        f"{k} {v:.4g}"
        for k, v in record["metrics"].items()
        if (k in key or k.startswith(("lm_eval/", "judge/"))) and "_stderr" not in k
    ]
    return "eval.json: " + ", ".join(shown)
