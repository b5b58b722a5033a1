"""ablate's trainers share one base on transformers.Trainer (ablate.methods.base.AblateTrainer: optimizer,
metrics, FSDP on CPU, tied-head resume) and the sampling methods one rollout base
(ablate.methods.rollout.RolloutTrainer: the round loop, round checkpoints, counters): shallow, no copied
loop."""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from datasets import Dataset
from transformers import Trainer

import ablate.methods
from ablate.methods.base import AblateTrainer
from ablate.methods.distill import DistillConfig, DistillTrainer
from ablate.methods.grpo import GRPOTrainer
from ablate.methods.rollout import RolloutTrainer
from ablate.models import tiny
from ablate.models.teachers import letter_teacher

CONF = Path(__file__).resolve().parents[2] / "conf" / "method"
MAX_BETWEEN = 3  # classes between an ablate trainer and transformers.Trainer in its MRO

# what the rollout base does for every sampling method; a method defines how one round is made
ROUND_METHODS = (
    "get_train_dataloader",
    "_get_train_sampler",
    "training_step",
    "prediction_step",
    "train",
    "_save_checkpoint",
    "_load_from_checkpoint",
    "rollout_stats",
    "summary_fields",
    "run_facts",
    "_prompt_splits",
    "_prepare_dataset",
    "_start_generator",
    "_serve_rounds",
    "_train_round",
)


def ablate_trainers() -> set[type]:
    """Every Trainer subclass defined in ablate.methods, and every trainer conf/method/ selects."""
    found = set()
    for info in pkgutil.iter_modules(ablate.methods.__path__):
        module = importlib.import_module(f"ablate.methods.{info.name}")
        found |= {
            v
            for v in vars(module).values()
            if isinstance(v, type) and issubclass(v, Trainer) and v.__module__ == module.__name__
        }
    for path in CONF.glob("*.yaml"):
        target = ((yaml.safe_load(path.read_text()) or {}).get("trainer") or {}).get("_target_")
        if target:
            module, name = target.rsplit(".", 1)
            found.add(getattr(importlib.import_module(module), name))
    return found


def between(cls: type) -> list[str]:
    mro = cls.__mro__
    return [c.__name__ for c in mro[1 : mro.index(Trainer)]]


def test_the_trainers_are_found():
    names = {c.__name__ for c in ablate_trainers()}
    assert {
        "GRPOTrainer",
        "DistillTrainer",
        "DPOTrainer",
        "SFTTrainer",
        "KTOTrainer",
        "RewardTrainer",
        "AblateTrainer",
        "RolloutTrainer",
    } <= names


@pytest.mark.parametrize("cls", sorted(ablate_trainers(), key=lambda c: c.__name__), ids=lambda c: c.__name__)
def test_every_trainer_is_at_most_three_classes_from_trainer(cls):
    assert issubclass(cls, AblateTrainer), f"{cls.__name__} does not subclass AblateTrainer"
    assert len(between(cls)) <= MAX_BETWEEN, f"{cls.__name__}: {' -> '.join(between(cls))} -> Trainer"


def test_a_deep_chain_is_measured():
    """The bound can fail: a chain of four classes between a trainer and Trainer is counted as four."""
    deep = type("Deep", (type("C", (type("B", (RolloutTrainer,), {}),), {}),), {})
    assert between(deep) == ["C", "B", "RolloutTrainer", "AblateTrainer"]


@pytest.mark.parametrize("cls", [GRPOTrainer, DistillTrainer], ids=lambda c: c.__name__)
@pytest.mark.parametrize("name", ROUND_METHODS)
def test_sampling_methods_share_the_rollout_bases_round_methods(cls, name):
    assert issubclass(cls, RolloutTrainer)
    assert name in vars(RolloutTrainer), f"RolloutTrainer has no {name}"
    if name == "_train_round" and cls is GRPOTrainer:  # async GRPO: the worker's round instead
        return
    assert name not in vars(cls), f"{cls.__name__} redefines RolloutTrainer.{name}"


def test_grpo_extends_the_served_batch_without_copying_the_loop():
    """GRPO's `_prepare_inputs` adds its token count and staleness to what the base serves (super())."""
    import inspect

    assert "super()._prepare_inputs(inputs)" in inspect.getsource(GRPOTrainer._prepare_inputs)
    assert "_prepare_inputs" not in vars(DistillTrainer)


class FixedCompletions:
    """Completes every prompt with 'ab' and EOS; counts the rounds."""

    def __init__(self, tok: Any) -> None:
        self.tok, self.rounds = tok, 0

    def __call__(self, model: Any, prompt_ids: list[list[int]]) -> list[list[int]]:
        self.rounds += 1
        ids = self.tok("ab", add_special_tokens=False)["input_ids"] + [self.tok.eos_token_id]
        return [list(ids) for _ in prompt_ids]


def _distill(out: Path, **kw: Any) -> DistillTrainer:
    tok, student = tiny(hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32)
    base = {
        "output_dir": str(out),
        "per_device_train_batch_size": 2,
        "gradient_accumulation_steps": 2,
        "max_completion_length": 4,
        "max_steps": 4,
        "learning_rate": 1e-2,
        "lr_scheduler_type": "constant",
        "report_to": "none",
        "logging_steps": 1,
        "disable_tqdm": True,
        "seed": 0,
        "use_cpu": True,
    }
    args = DistillConfig(**{**base, **kw})
    data = Dataset.from_list([{"prompt": c * 4} for c in "abcdefgh"])
    return DistillTrainer(
        model=student,
        args=args,
        train_dataset=data,
        processing_class=tok,
        teacher=lambda: letter_teacher(confidence=8.0),
        generator=FixedCompletions(tok),
    )


def _losses(trainer: DistillTrainer) -> dict[int, float]:
    return {h["step"]: h["loss"] for h in trainer.state.log_history if "loss" in h}


def test_distill_resume_keeps_the_round_counters_and_losses(tmp_path):
    """Distillation's rounds are checkpointed by the rollout base: a run resumed at step 2 reports the rounds
    before the resume too (4, not 2) and trains steps 3 and 4 to the uninterrupted run's losses."""
    full = _distill(tmp_path / "full", save_strategy="no")
    full.train()
    assert full.summary_fields()["generation_rounds"] == 4 == full.generator.rounds
    _distill(tmp_path / "run", max_steps=2, save_strategy="steps", save_steps=2).train()
    ckpt = tmp_path / "run" / "checkpoint-2"
    assert (ckpt / "trainer_state.json").is_file()
    resumed = _distill(tmp_path / "run", save_strategy="no")
    resumed.train(resume_from_checkpoint=str(ckpt))
    assert resumed.generator.rounds == 2  # only the rounds after the checkpoint are sampled
    assert resumed.summary_fields()["generation_rounds"] == 4  # the counters came back with the checkpoint
    theirs, ours = _losses(full), _losses(resumed)
    assert [ours[s] for s in (3, 4)] == pytest.approx([theirs[s] for s in (3, 4)], rel=1e-6)
