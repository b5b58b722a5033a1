"""ablate's trainers lean on a few private members of transformers.Trainer (overridden or called).
Private members change without deprecation, so their signatures are pinned here: a transformers
upgrade that changes one fails this test, not a training run. The list is found by reading ablate's
source, so a newly used private member fails the test until it is recorded below. The public hooks
ablate overrides (AblateTrainer's create_optimizer / create_scheduler / create_accelerator_and_postprocess)
are pinned the same way."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest
from transformers import Trainer

import ablate

SRC = Path(ablate.__file__).resolve().parent
# name -> Trainer's parameter names (methods) or "attribute" (set in Trainer.__init__ or on the class).
# loss_is_scaled_for_ga appeared in transformers 5.19 (the floor in pyproject.toml is 5.24: the version the tests ran).
PINNED: dict[str, tuple[str, ...] | str] = {
    "_prepare_inputs": ("self", "inputs"),
    "_get_dataloader": (
        "self",
        "dataset",
        "description",
        "batch_size",
        "sampler_fn",
        "is_training",
        "dataloader_key",
    ),
    "_get_train_sampler": ("self", "train_dataset"),
    "_get_eval_sampler": ("self", "eval_dataset"),
    "_save_checkpoint": ("self", "model", "trial"),
    "_save": ("self", "output_dir", "state_dict"),  # ablate.methods.base: model/ from the gathered state dict
    "_load_from_checkpoint": ("self", "resume_from_checkpoint", "model"),
    "_issue_warnings_after_load": ("self", "load_result"),  # ablate.methods.base: a tied head resumed quietly
    "_train_batch_size": "attribute",
    "loss_is_scaled_for_ga": "attribute",
    "_created_lr_scheduler": "attribute",  # set with the schedule, as Trainer.create_scheduler does
    # public hooks Trainer calls while preparing training (ablate.methods.base.AblateTrainer)
    "create_optimizer": ("self", "model"),
    "create_scheduler": ("self", "num_training_steps", "optimizer"),
    "create_accelerator_and_postprocess": ("self",),  # distributed=fsdp on CPU ranks (ablate.methods.fsdp)
}
_TRAINER_SOURCE = inspect.getsource(Trainer)


def used_private_members() -> set[str]:
    """Private Trainer members ablate's code overrides (def _x in a Trainer subclass) or uses
    (self._x, super()._x, trainer._x), plus the hooks ablate sets by name."""
    used = {"loss_is_scaled_for_ga"}
    for path in SRC.rglob("*.py"):
        text = path.read_text()
        names = set(re.findall(r"(?:self|super\(\)|trainer)\.(_[a-z][a-z0-9_]*)", text))
        names |= set(re.findall(r"^    def (_[a-z][a-z0-9_]*)\(", text, flags=re.M))
        used |= {n for n in names if hasattr(Trainer, n) or re.search(rf"self\.{n}\s*=", _TRAINER_SOURCE)}
    return used


def test_every_used_private_member_is_pinned():
    unpinned = used_private_members() - set(PINNED)
    assert not unpinned, f"ablate uses private Trainer members not pinned in this test: {sorted(unpinned)}"


@pytest.mark.parametrize("name", sorted(PINNED))
def test_private_member_signature(name):
    expected = PINNED[name]
    if expected == "attribute":
        assert hasattr(Trainer, name) or re.search(rf"self\.{name}\s*=", _TRAINER_SOURCE), (
            f"Trainer has no {name}"
        )
        return
    member = getattr(Trainer, name, None)
    assert callable(member), f"transformers.Trainer.{name} is gone"
    assert tuple(inspect.signature(member).parameters) == expected, inspect.signature(member)


def test_optimizer_hooks_are_overridden_where_pinned():
    """AblateTrainer overrides exactly the pinned hooks (so the signature checks above cover them)."""
    from ablate.methods.base import AblateTrainer

    hooks = {n for n in vars(AblateTrainer) if n.startswith("create_")}
    assert hooks == {"create_optimizer", "create_scheduler", "create_accelerator_and_postprocess"}
    assert hooks <= set(PINNED)


@pytest.mark.parametrize("name", sorted(n for n, e in PINNED.items() if e != "attribute"))
def test_overrides_accept_trainers_arguments(name):
    """An override takes the same positional arguments as the member it replaces (Trainer calls it)."""
    from ablate.methods import base as ablate_base
    from ablate.methods import distill, dpo, grpo, kto, reward, rollout, sft

    base = list(inspect.signature(getattr(Trainer, name)).parameters.values())
    for cls in (
        ablate_base.AblateTrainer,
        rollout.RolloutTrainer,
        dpo.DPOTrainer,
        sft.SFTTrainer,
        grpo.GRPOTrainer,
        distill.DistillTrainer,
        kto.KTOTrainer,
        reward.RewardTrainer,
    ):
        if name in vars(cls):
            params = list(inspect.signature(vars(cls)[name]).parameters.values())
            assert len(params) == len(base), f"{cls.__name__}.{name}{inspect.signature(vars(cls)[name])}"
            for mine, theirs in zip(params, base):
                assert (mine.default is inspect.Parameter.empty) == (
                    theirs.default is inspect.Parameter.empty
                ), f"{cls.__name__}.{name}: {mine} vs Trainer's {theirs}"
