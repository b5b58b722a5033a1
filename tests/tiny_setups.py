"""What several test files build the same way: a model moved off its initial weights, a tiny DPO or GRPO
run's config (and GRPO's prompts), and a batch of three groups of three completions.

A module the tests import (`from tiny_setups import ...`: tests/ is on their path, as for
tests/conftest.py), heavy imports inside the functions so that importing it costs nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def moved(model: Any, seed: int = 1, scale: float = 0.05) -> Any:
    """`model` with each weight plus scale * N(0, 1) (seeded), in place: log-probs away from the near-uniform
    ones of the initial weights (where any error would hide), every gradient nonzero; moved from a copy of
    a reference, log-ratios to it not 0."""
    import torch

    with torch.no_grad():
        g = torch.Generator().manual_seed(seed)
        for p in model.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g))
    return model


def dpo_config(path: Path, **overrides: Any) -> Any:
    """The DPOConfig of three tiny DPO optimizer steps writing in `path`: 3 pairs a step, lr 1e-3, beta 0.3,
    every step logged, nothing saved, on the CPU; `overrides` replace or add arguments."""
    from ablate.methods.dpo import DPOConfig

    kw = dict(
        output_dir=str(path),
        per_device_train_batch_size=3,
        report_to="none",
        use_cpu=True,
        max_steps=3,
        learning_rate=1e-3,
        logging_steps=1,
        save_strategy="no",
        beta=0.3,
        disable_tqdm=True,
    )
    return DPOConfig(**(kw | overrides))


def grpo_config(path: Path, **overrides: Any) -> Any:
    """The GRPOConfig of a tiny GRPO run writing under `path`/out: groups of 2, 4 completions per micro-step
    of up to 4 tokens, every step logged, nothing saved, seed 0, on the CPU; `overrides` replace or add
    arguments."""
    from ablate.methods.grpo import GRPOConfig

    kw = dict(
        output_dir=str(path / "out"),
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=4,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
        seed=0,
        use_cpu=True,
    )
    return GRPOConfig(**(kw | overrides))


def numbered_prompts(n: int) -> Any:
    """A dataset of n distinct prompts p00, p01, ... (a test reads which ones a round or a step took)."""
    from datasets import Dataset

    return Dataset.from_dict({"prompt": [f"p{i:02d}" for i in range(n)]})


def three_groups(tok: Any) -> dict[str, Any]:
    """3 groups of 3 (prompts of 4, 12 and 1 tokens: left padding), completions of 1 to 5 tokens (right
    padding): a GRPO batch in TRL's layout."""
    from ablate.rollouts.generation import left_pad, right_pad

    prompts = [tok(t, add_special_tokens=False)["input_ids"] for t in ("abc:", "hello there:", "x")]
    completions = [
        [70, 71, 72],
        [73],
        [80, 81, 82, 83, 84],
        [90, 91],
        [74],
        [75, 76, 77],
        [78, 79, 80, 81],
        [92],
        [93, 94],
    ]
    p_ids, p_mask = left_pad([p for p in prompts for _ in range(3)], tok.pad_token_id)
    c_ids, c_mask = right_pad(completions, tok.pad_token_id)
    return {"prompt_ids": p_ids, "prompt_mask": p_mask, "completion_ids": c_ids, "completion_mask": c_mask}


def three_groups_trainer(path: Path, tok: Any, model: Any, **overrides: Any) -> Any:
    """A GRPOTrainer that scores `three_groups`' batch: 9 completions per micro-step in groups of 3, up to 5
    tokens, temperature 0.7, every reward 0 (its tests score log-probs; they do not train)."""
    from datasets import Dataset

    from ablate.methods.grpo import GRPOConfig, GRPOTrainer

    kw = dict(
        output_dir=str(path),
        per_device_train_batch_size=9,
        num_generations=3,
        max_completion_length=5,
        temperature=0.7,
        report_to="none",
        use_cpu=True,
    )
    return GRPOTrainer(
        model=model,
        args=GRPOConfig(**(kw | overrides)),
        train_dataset=Dataset.from_dict({"prompt": ["ab"] * 3}),
        processing_class=tok,
        reward_funcs={"zero": lambda completions, **_: [0.0] * len(completions)},
    )
