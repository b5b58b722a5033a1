"""`ablate eval RUN_DIR [overrides]`: score a run's saved model with its method's eval metrics.

The run's config is composed again from its own overrides (run.json) plus the ones given here
(`data=...`, `data.max_eval_samples=...`; a given key replaces the run's), the policy is the run's
`model/` (adapters included), and the method's trainer runs `evaluate()` on the data's eval split
(its train split when it has none). DPO's reference is the run's starting model (its base with the
adapters off, for a `+peft` run), so rewards/margins measure what training changed. The metrics go
to `<run_dir>/eval.json` and are printed. Each example's own scores go to
`<run_dir>/eval_examples.jsonl`, which `ablate compare` pairs across arms (Miller 2024). A run of a
method that generates its own data (GRPO, RLOO, distillation) is scored by what it generates: the mean
reward of its completions of the held-out prompts, one greedy completion each or `--samples N` sampled
ones (ablate.rollouts.evaluate), with the run's reward functions.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from ablate.analysis.runs import override_key
from ablate.cli.exits import fail
from ablate.record import rundir
from ablate.schema.method import MethodSpec

EVAL = rundir.EVAL
# what evaluate() reports about a training that did not happen here (the trainer built for the eval
# trained nothing: these read 0) and its own set-up time: not the model's scores
TRAINING_ONLY = {"epoch", "num_input_tokens_seen", "eval_num_tokens", "eval_model_preparation_time"}


def compose_run_config(run_dir: Path, overrides: list[str]) -> Any:
    """The run's config with `overrides` on top (a key given here replaces the run's own override)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from ablate.config.compose import register_resolvers
    from ablate.errors import ConfigError
    from ablate.paths import conf_dir

    info = rundir.read_json(run_dir / rundir.RUN)
    if info is None:
        raise ConfigError(f"{run_dir} is not an ablate run dir (no {rundir.RUN})")
    given = {override_key(o) for o in overrides}
    merged = [o for o in info.get("overrides", []) if override_key(o) not in given] + overrides
    register_resolvers()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=conf_dir(), version_base="1.3"):
        return compose(config_name="config", overrides=merged), merged


def evaluate(run_dir: Path, overrides: list[str], samples: int = 0) -> dict[str, Any]:
    from hydra.utils import instantiate
    from omegaconf import OmegaConf
    from transformers import set_seed

    from ablate.cli.generate import load_run_model
    from ablate.config.machine import check_precision
    from ablate.process.setup import quiet_libraries

    cfg, merged = compose_run_config(run_dir, overrides)
    quiet_libraries()  # no dataset bars, no pin_memory warning on a CPU, as in a training run
    set_seed(cfg.seed)
    tokenizer, model = load_run_model(run_dir)
    data = instantiate(cfg.data)
    split, dataset = ("eval", data.eval) if data.eval is not None else ("train", data.train)
    generates = MethodSpec.of(cfg.method).generates  # GRPO, RLOO, distillation (ablate.schema.method)
    device_args = check_precision(cfg.precision)
    with tempfile.TemporaryDirectory(prefix="ablate-eval-") as tmp:
        args = instantiate(
            cfg.method.args,
            output_dir=tmp,
            **OmegaConf.to_container(cfg.precision),
            **device_args,
            report_to="none",
            eval_strategy="no",
            save_strategy="no",
            **({} if generates else _reference_args(cfg.method.args)),
        )
        if generates:
            metrics, examples = _generated(
                model.to(args.device), tokenizer, dataset, data.reward_funcs, args, samples
            )
            scored = dataset
        else:
            metrics, examples, scored = _scored(cfg, model, tokenizer, dataset, args)
    result = {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "method": cfg.method.name,
        "overrides": merged,
        "split": split,
        "examples": len(dataset),
        "metrics": metrics,
    }
    if generates:
        result["completions"] = f"{samples} sampled per prompt" if samples else "greedy, one per prompt"
    rundir.write_json(run_dir / EVAL, result)
    ids = example_ids(dataset, scored)
    rundir.write_examples(
        run_dir, [{"id": i, "index": n, **row} for n, (i, row) in enumerate(zip(ids, examples))]
    )
    return result


def _reference_args(method_args: Any) -> dict[str, Any]:
    """DPO and KTO: the reference scored live (the run's starting model), not precomputed."""
    return {"precompute_ref_log_probs": False} if "precompute_ref_log_probs" in method_args else {}


def _scored(
    cfg: Any, model: Any, tokenizer: Any, dataset: Any, args: Any
) -> tuple[dict[str, float], list[dict], Any]:
    """The method's own eval (its trainer's `evaluate()`: DPO and reward accuracy, SFT loss and token
    accuracy, KTO margins), and each example scored alone; DPO's and KTO's reference is the run's starting
    model (its base with the adapters off, for a `+peft` run), so rewards measure what training changed."""
    from hydra.utils import instantiate

    from ablate.models.adapters import is_adapted

    extra = (
        {"ref_model": instantiate(cfg.model)[1]}
        if _reference_args(cfg.method.args) and not is_adapted(model)
        else {}
    )
    # no train split: the rows are tokenised once, as the eval split they are
    trainer = instantiate(cfg.method.trainer)(
        model=model, args=args, train_dataset=None, eval_dataset=dataset, processing_class=tokenizer, **extra
    )
    metrics = {k: v for k, v in trainer.evaluate().items() if k not in TRAINING_ONLY}
    return metrics, per_example(trainer), trainer.eval_dataset


def _generated(
    model: Any, tokenizer: Any, dataset: Any, reward_funcs: dict, args: Any, samples: int
) -> tuple[dict[str, float], list[dict]]:
    """A GRPO, RLOO or distillation run: the mean reward of its completions of the held-out prompts, by the
    run's reward functions (ablate.rollouts.evaluate)."""
    from ablate.errors import ConfigError
    from ablate.rollouts.evaluate import reward_eval

    if not reward_funcs:
        raise ConfigError(
            "ablate eval scores what this run generates with its data's reward functions, and its data "
            "has none (data.reward_funcs): give data=... with reward functions"
        )
    return reward_eval(
        model, tokenizer, dataset, reward_funcs, args, samples, args.per_device_eval_batch_size
    )


def per_example(trainer: Any) -> list[dict[str, float]]:
    """Each eval example scored alone, in dataset order (a batch of one through the trainer's own
    `prediction_step`): its loss and the method's metrics (its MetricsBuffer, running totals left
    out), which for one example are that example's own. One more forward per example, run after
    `trainer.evaluate()`, whose numbers (eval.json) it leaves as they are."""
    import torch

    buffer = getattr(trainer, "metrics", None)
    totals = getattr(buffer, "totals", set())
    if buffer is not None:
        buffer.pop("eval")  # nothing of evaluate()'s may leak into the first example
    model = trainer.model_wrapped
    model.eval()
    rows = []
    with torch.no_grad():
        for i in range(len(trainer.eval_dataset)):
            loss, _, _ = trainer.prediction_step(
                model, trainer.data_collator([trainer.eval_dataset[i]]), prediction_loss_only=True
            )
            row = {} if loss is None else {"loss": float(loss.float().mean())}
            if buffer is not None:
                row.update(
                    {
                        k: v
                        for name, v in buffer.pop("eval").items()
                        if (k := name.removeprefix("eval_")) not in totals
                    }
                )
            rows.append(row)
    return rows


def example_ids(raw: Any, scored: Any) -> list[str]:
    """Each scored example's id: a hash of its raw row when no row was dropped in tokenising (the same
    id under any tokenizer, so runs of different models pair up), else of its scored token ids (the
    rows left no longer line up with the raw ones)."""
    if len(raw) == len(scored):
        rows = list(raw)
    else:
        rows = list(scored.select_columns([c for c in scored.column_names if c.endswith("_ids")]))
    return [hashlib.sha1(json.dumps(r, sort_keys=True, default=str).encode()).hexdigest()[:16] for r in rows]


def eval_cmd(args: Any) -> None:
    """`ablate eval RUN_DIR [--samples N] [key=value ...]` (arguments: ablate.cli.parser)."""
    from hydra.errors import HydraException

    from ablate.errors import USER_ERRORS

    try:
        run_dir = rundir.given_run(args.run_dir).resolve()  # `last`: the newest run
        rundir.check_given(run_dir)  # at once: before the heavy imports
        result = evaluate(run_dir, args.overrides, args.samples)
    except USER_ERRORS as e:
        fail(str(e))
    except HydraException as e:
        fail(str(e).strip().splitlines()[0])
    how = f", {result['completions']}" if "completions" in result else ""
    print(f"{result['method']} eval on the {result['split']} split ({result['examples']} examples{how}):")
    width = max([28, *map(len, result["metrics"])])
    for k, v in sorted(result["metrics"].items()):
        print(f"  {k:<{width}} {v:.4g}" if isinstance(v, float) else f"  {k:<{width}} {v}")
    print(f"wrote {run_dir / EVAL}")
    print(f"wrote {run_dir / rundir.EXAMPLES} (each example's scores, for ablate compare)")
