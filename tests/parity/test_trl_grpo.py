"""GRPO loss parity with TRL 1.16 on one shared, fixed batch of completions: for every loss type both
have (grpo, dapo, dr_grpo, bnpo; cispo and sapo as ablate's objective + aggregation), token- and
sequence-level (GSPO) ratios, with and without the KL term and two-sided clipping, the same loss and
metrics (|delta| <= 1e-5) from `compute_loss` on the same model.

The batch is fixed (no generation): prompts of equal length (TRL scores without position ids, ablate
with left-padding-aware ones: equal here), completions of different lengths (right padding), an old
policy that differs from the current one (ratios != 1, so clipping acts) and mixed-sign advantages.
"""

from __future__ import annotations

import copy
import functools

import pytest
import torch
from datasets import Dataset

trl = pytest.importorskip("trl")

from ablate.losses import grpo as grpo_losses  # noqa: E402
from ablate.methods.grpo import GRPOConfig, GRPOTrainer  # noqa: E402
from ablate.models import tiny  # noqa: E402
from ablate.rollouts.buffer import Rollout  # noqa: E402
from tiny_setups import moved  # noqa: E402

LOSSES = {
    "grpo": grpo_losses.grpo,
    "dapo": grpo_losses.dapo,
    "dr_grpo": grpo_losses.dr_grpo,
    "bnpo": grpo_losses.bnpo,
}
CLIP = (
    "clip_ratio/low_mean",
    "clip_ratio/high_mean",
    "clip_ratio/region_mean",
    "clip_ratio/low_min",
    "clip_ratio/high_max",
)
METRICS = {"cispo": ("cispo_clip_ratio", "entropy", "kl"), "sapo": ("entropy", "kl")}


def _reward(completions: list, **kwargs: object) -> list[float]:
    return [0.0] * len(completions)


def _batch(tok, old_model, ref_model) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    prompts = [tok(p, add_special_tokens=False)["input_ids"] for p in ("ab:", "cd:", "ef:", "gh:")]
    lengths = [5, 2, 4, 1]
    width = max(lengths)
    completion_ids = torch.randint(3, 200, (4, width), generator=g)
    completion_mask = torch.tensor([[1] * n + [0] * (width - n) for n in lengths])
    completion_ids = completion_ids.masked_fill(completion_mask == 0, tok.pad_token_id)
    batch = {
        "prompt_ids": torch.tensor(prompts),
        "prompt_mask": torch.ones(4, len(prompts[0]), dtype=torch.long),
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "advantages": torch.tensor([1.0, -0.5, 0.3, -1.2]),
    }

    def logps(model: torch.nn.Module) -> torch.Tensor:
        ids = torch.cat([batch["prompt_ids"], completion_ids], 1)
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[:, -width - 1 : -1]
        return torch.log_softmax(logits.float(), -1).gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)

    batch["old"], batch["ref"] = logps(old_model), logps(ref_model)
    return batch


# TRL's loss_type -> ablate's (objective, aggregation)
SAPO = {  # TRL's temperatures, as conf/method/grpo_objective/sapo.yaml sets them
    f"temperature_{s}": trl.GRPOConfig.__dataclass_fields__[f"sapo_temperature_{s}"].default
    for s in ("pos", "neg")
}
OBJECTIVES = {
    "cispo": (grpo_losses.cispo, grpo_losses.dapo),
    "sapo": (functools.partial(grpo_losses.sapo, **SAPO), grpo_losses.grpo),
}
CASES = [
    (loss, level, beta, delta)
    for loss in LOSSES
    for level in ("token", "sequence")
    for beta, delta in ((0.0, None), (0.04, None), (0.0, 1.2))
]
CASES += [
    (loss, level, beta, None)
    for loss in OBJECTIVES
    for level in ("token", "sequence")
    for beta in (0.0, 0.04)
]


@pytest.mark.parametrize(
    "loss_type,level,beta,delta", CASES, ids=[f"{c[0]}-{c[1]}-beta{c[2]}-delta{c[3]}" for c in CASES]
)
def test_grpo_loss_matches_trl(tmp_path, loss_type, level, beta, delta):
    objective, aggregation = OBJECTIVES.get(loss_type, (grpo_losses.clip, LOSSES.get(loss_type)))
    if loss_type == "cispo":
        common_eps = {"epsilon_high": 1.02}  # the cap itself for cispo: low enough that some ratios exceed it
    else:
        common_eps = {}
    tok, policy = tiny()
    old, ref = moved(copy.deepcopy(policy), 1, 0.02), moved(copy.deepcopy(policy), 2, 0.02)
    b = _batch(tok, old, ref)
    ds = Dataset.from_list([{"prompt": "ab:"}] * 4)
    common = (
        dict(
            per_device_train_batch_size=4,
            num_generations=4,
            max_completion_length=8,
            beta=beta,
            epsilon=0.1,
            epsilon_high=0.15,
            delta=delta,
            importance_sampling_level=level,
            report_to="none",
            use_cpu=True,
            bf16=False,
        )
        | common_eps
    )
    # TRL builds its reference from a hub path when beta > 0: build with beta 0, then set it (the loss
    # reads self.beta and the batch's reference log-probs)
    trl_args = trl.GRPOConfig(
        output_dir=str(tmp_path / "trl"), loss_type=loss_type, **(common | {"beta": 0.0})
    )
    theirs = trl.GRPOTrainer(
        model=copy.deepcopy(policy),
        reward_funcs=[_reward],
        train_dataset=ds,
        processing_class=tok,
        args=trl_args,
    )
    theirs.beta = beta
    ours = GRPOTrainer(
        model=copy.deepcopy(policy),
        reward_funcs={"zero": _reward},
        train_dataset=ds,
        processing_class=tok,
        aggregation=functools.partial(aggregation),
        objective=objective,
        args=GRPOConfig(output_dir=str(tmp_path / "ours"), **common),
    )
    keys = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "advantages")
    inputs_theirs = {k: b[k] for k in keys} | {
        "old_per_token_logps": b["old"],
        "ref_per_token_logps": b["ref"],
        "num_items_in_batch": b["completion_mask"].sum(),
    }
    inputs_ours = Rollout(
        **{k: b[k] for k in keys},
        old_logps=b["old"],
        ref_logps=b["ref"],
        num_items=b["completion_mask"].sum().float(),
    )
    theirs.model.train(), ours.model.train()
    theirs.current_gradient_accumulation_steps = 1  # set by Trainer's loop; one micro-batch per step here
    loss_theirs = theirs.compute_loss(theirs.model, inputs_theirs)
    loss_ours = ours.compute_loss(ours.model, inputs_ours)
    assert abs(loss_ours.item() - loss_theirs.item()) <= 1e-5, (loss_ours.item(), loss_theirs.item())
    m_theirs = {k: v[-1] for k, v in theirs._metrics["train"].items()}
    m_ours = ours.metrics.pop("train")
    for name in METRICS.get(loss_type, (*CLIP, "entropy", "kl")):
        if name == "kl" and beta == 0.0:
            assert "kl" not in m_ours
            continue
        assert abs(m_ours[name] - m_theirs[name]) <= 1e-5, (name, m_ours[name], m_theirs[name])
    if (
        level == "token" and loss_type != "sapo"
    ):  # the fixture exercises clipping (else comparing it proves little)
        assert m_ours.get("clip_ratio/region_mean", m_ours.get("cispo_clip_ratio")) > 0
