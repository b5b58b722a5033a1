"""What the side-by-side benchmarks build alike: the Trainer arguments every measured run shares, and a
DPO, SFT or GRPO trainer of either side (TRL 1.16's, or ablate's) from the same arguments, so that the two
sides of a table differ only where the sides themselves differ.

    common = sides.trainer_args(f"/tmp/bench-{impl}", steps, per_device_train_batch_size=8, beta=0.1)
    trainer = sides.trainer("dpo", impl, model=model, tok=tok, train=train, args=common, callbacks=[rec])

Used by dpo_vs_trl.py, grpo_vs_trl.py, gpu_sides.py and long_context.py (children: one process a side).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable


def trainer_args(output_dir: str, steps: int, **kw: Any) -> dict[str, Any]:
    """The keyword arguments of a benchmark's TrainingArguments (TRL's config or ablate's): `steps`
    optimizer steps, each logged (the recorder reads the loss and gradient norm of every step), nothing
    saved or reported, a constant learning rate of 1e-5 from seed 0; `kw` adds to or replaces them."""
    return {
        "output_dir": output_dir,
        "max_steps": steps,
        "logging_steps": 1,
        "report_to": "none",
        "save_strategy": "no",
        "seed": 0,
        "disable_tqdm": True,
        "learning_rate": 1e-5,
        "lr_scheduler_type": "constant",
        **kw,
    }


@dataclass(frozen=True)
class Method:
    """One method's trainer and config class names (the same in `trl` and `ablate.methods.<module>`) and
    what TRL's side is given on top of the shared arguments (its leanest settings, as ablate's defaults)."""

    module: str  # ablate.methods.<module>
    trainer: str
    config: str
    trl_config: dict[str, Any] = field(default_factory=dict)  # TRL's config only
    trl_trainer: dict[str, Any] = field(default_factory=dict)  # TRL's trainer only


METHODS = {
    # with precompute_ref_log_probs TRL 1.16 scores the reference with the policy before training and keeps
    # no second model (its leanest configuration, as ablate's)
    "dpo": Method("dpo", "DPOTrainer", "DPOConfig", trl_trainer={"ref_model": None}),
    "sft": Method("sft", "SFTTrainer", "SFTConfig"),
    # dapo on TRL's side too, named: the loss the tables compare (and ablate's GRPO default)
    "grpo": Method("grpo", "GRPOTrainer", "GRPOConfig", trl_config={"loss_type": "dapo"}),
}


def trainer(
    method: str,
    side: str,
    *,
    model: Any,
    tok: Any,
    train: Any,
    args: dict[str, Any],
    callbacks: list[Any],
    rewards: tuple[Callable, ...] = (),
    perf: Any = None,
    **kw: Any,
) -> Any:
    """`method`'s trainer on `side` ("trl": TRL's; any other: ablate's, with the speed switches `perf`,
    None for its defaults) over the same model, tokenizer, data, arguments and callbacks. `rewards`: GRPO's
    reward functions (TRL takes a list, ablate a dict by name); `kw` goes to that side's trainer (TRL's
    `rollout_func`, ablate's `generator`, `sequence_parallel`)."""
    m = METHODS[method]
    common: dict[str, Any] = {
        "model": model,
        "train_dataset": train,
        "processing_class": tok,
        "callbacks": callbacks,
    }
    if side == "trl":
        import trl

        if rewards:
            common["reward_funcs"] = list(rewards)
        config = getattr(trl, m.config)(**m.trl_config, **args)
        return getattr(trl, m.trainer)(args=config, **common, **m.trl_trainer, **kw)
    module = importlib.import_module(f"ablate.methods.{m.module}")
    if rewards:
        common["reward_funcs"] = {f.__name__: f for f in rewards}
    config = getattr(module, m.config)(**args)
    return getattr(module, m.trainer)(args=config, perf=perf, **common, **kw)
