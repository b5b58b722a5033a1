"""`eval=heldout`: the method's own eval on the data's held-out split (its train split when it has none).

The method's trainer runs `evaluate()` on the split: DPO's preference accuracy and reward margins, SFT's loss
and token accuracy, a reward model's accuracy, KTO's margins. DPO's and KTO's reference is the run's starting
model (its base with the adapters off, for a `+peft` run), so the rewards measure what training changed. A
run of a method that generates its own data (GRPO, RLOO, distillation) is scored by what it generates: the
mean reward of its completions of the held-out prompts, one greedy completion each or `samples` sampled ones
(ablate.rollouts.evaluate), with the run's reward functions. Each example is also scored on its own
(`per_example`), which `ablate compare` pairs across arms (Miller 2024).
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from typing import Any

from ablate.errors import ConfigError
from ablate.evaluation.base import Evaluand, Result
from ablate.schema.evaluation import HeldOutEval
from ablate.schema.method import MethodSpec

# what evaluate() reports about a training that did not happen here (the trainer built for the eval
# trained nothing: these read 0) and its own set-up time: not the model's scores
TRAINING_ONLY = {"epoch", "num_input_tokens_seen", "eval_num_tokens", "eval_model_preparation_time"}


class HeldOut:
    """The method's eval metrics (`eval_`-prefixed, the Trainer's names) and each example's scores."""

    name = "heldout"

    def __init__(self, samples: int = HeldOutEval.samples) -> None:
        self.samples = samples  # GRPO, RLOO, distill: sampled completions per prompt (0: one greedy)

    def check(self, cfg: Any) -> None:
        """Nothing to check before training: the data and the method were checked with the run."""

    def __call__(self, run: Evaluand) -> Result:
        from hydra.utils import instantiate
        from omegaconf import OmegaConf

        cfg = run.cfg
        data = instantiate(cfg.data)
        split, dataset = ("eval", data.eval) if data.eval is not None else ("train", data.train)
        generates = MethodSpec.of(cfg.method).generates  # GRPO, RLOO, distillation (ablate.schema.method)
        with tempfile.TemporaryDirectory(prefix="ablate-eval-") as tmp:
            args = instantiate(
                cfg.method.args,
                output_dir=tmp,
                **OmegaConf.to_container(cfg.precision),
                **run.device_args,
                report_to="none",
                eval_strategy="no",
                save_strategy="no",
                **({} if generates else reference_args(cfg.method.args)),
            )
            if generates:
                metrics, examples = generated(
                    run.model.to(args.device), run.tokenizer, dataset, data.reward_funcs, args, self.samples
                )
                scored = dataset
            else:
                metrics, examples, scored = _scored(cfg, run.model, run.tokenizer, dataset, args)
        facts: dict[str, Any] = {"split": split, "examples": len(dataset)}
        if generates:
            facts["completions"] = (
                f"{self.samples} sampled per prompt" if self.samples else "greedy, one per prompt"
            )
        rows = [
            {"id": i, "index": n, **row}
            for n, (i, row) in enumerate(zip(example_ids(dataset, scored), examples))
        ]
        return Result(metrics, rows, facts)


def reference_args(method_args: Any) -> dict[str, Any]:
    """DPO and KTO: the reference scored live (the run's starting model), not precomputed."""
    return {"precompute_ref_log_probs": False} if "precompute_ref_log_probs" in method_args else {}


def _scored(
    cfg: Any, model: Any, tokenizer: Any, dataset: Any, args: Any
) -> tuple[dict[str, float], list[dict], Any]:
    """The method's own eval (its trainer's `evaluate()`), and each example scored alone; DPO's and KTO's
    reference is the run's starting model (its base with the adapters off, for a `+peft` run)."""
    from hydra.utils import instantiate

    from ablate.models.adapters import is_adapted

    extra = (
        {"ref_model": instantiate(cfg.model)[1]}
        if reference_args(cfg.method.args) and not is_adapted(model)
        else {}
    )
    # no train split: the rows are tokenised once, as the eval split they are
    trainer = instantiate(cfg.method.trainer)(
        model=model, args=args, train_dataset=None, eval_dataset=dataset, processing_class=tokenizer, **extra
    )
    metrics = {k: v for k, v in trainer.evaluate().items() if k not in TRAINING_ONLY}
    return metrics, per_example(trainer), trainer.eval_dataset


def generated(
    model: Any, tokenizer: Any, dataset: Any, reward_funcs: dict, args: Any, samples: int
) -> tuple[dict[str, float], list[dict]]:
    """A GRPO, RLOO or distillation run: the mean reward of its completions of the held-out prompts, by the
    run's reward functions (ablate.rollouts.evaluate)."""
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
