"""The engine/trainer mismatch correction against TRL 1.16's, one whole GRPO step: generation round and loss.

Both trainers get the same completions, with the same engine log-probs, from a stand-in for vLLM: TRL's
through `vllm_generation` (as its colocated engine returns them, `use_vllm` on), ablate's through its
generator seam (`Completions`). The engine's log-probs are the policy's own plus fixed offsets and noise (and one
NaN, a token the engine could not score), so the ratios spread over both sides of the bounds. Each
trainer then scores, rewards and computes its loss: the same loss and the same metrics (|delta| <= 1e-5),
for every `vllm_importance_sampling_mode`, with GSPO's sequence-level ratio, the KL term, and the
off-policy sequence mask (with and without the correction).
"""

from __future__ import annotations

import copy
import functools

import pytest
import torch
from datasets import Dataset

trl = pytest.importorskip("trl")
from trl.trainer import grpo_trainer  # noqa: E402

from ablate.losses import grpo as grpo_losses  # noqa: E402
from ablate.methods.grpo import GRPOConfig, GRPOTrainer  # noqa: E402
from ablate.models import tiny  # noqa: E402
from ablate.rollouts.generation import Completions  # noqa: E402

COMPLETIONS = [
    [65, 66, 67, 68, 69],
    [70, 71],
    [72, 73, 74, 75],
    [76],
    [77, 78, 79],
    [80, 81, 82, 83, 84, 85],
    [86, 87],
    [88, 89, 90, 91],
]
# per completion, added to each of its tokens' engine log-prob: row 0's sequence ratio ~ e^(5 * 0.4) > 3,
# row 5's ~ e^(-6 * 0.25) < 0.5, so the sequence modes mask/clamp some completions, not all
OFFSET = [-0.4, 0.0, 0.1, 0.0, -0.1, 0.25, 0.0, 0.0]
SAMPLING = (
    "sampling/sampling_logp_difference/mean",
    "sampling/sampling_logp_difference/max",
    "sampling/importance_sampling_ratio/min",
    "sampling/importance_sampling_ratio/mean",
    "sampling/importance_sampling_ratio/max",
)
CLIP = ("clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean", "entropy")


def _reward(completion_ids: list[list[int]], **kwargs: object) -> list[float]:
    return [float(len(ids) % 3) + 0.1 * ids[0] % 2 for ids in completion_ids]


class Engine:
    """The fixed completions and their 'engine' log-probs: the policy's at generation, plus noise."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model, self.prompts = model, []

    def logps(self, prompts: list[list[int]]) -> list[list[float]]:
        g = torch.Generator().manual_seed(3)
        out = []
        for p, c in zip(prompts, COMPLETIONS):
            ids = torch.tensor([p + c])
            with torch.no_grad():
                logits = self.model(input_ids=ids).logits[0, len(p) - 1 : -1].float()
            lp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(c)[:, None])[:, 0]
            out.append((lp + OFFSET[len(out)] + 0.2 * torch.randn(len(c), generator=g)).tolist())
        out[2][1] = float("nan")  # a token the engine gave no log-prob for
        return out

    # TRL's colocated-engine interface (trl.generation.vllm_generation.VLLMGeneration)
    def sync_weights(self) -> None:
        pass

    def generate(
        self, prompts: list[list[int]], images: object, num_generations: int, profiler: object
    ) -> tuple:
        self.prompts.append(prompts)
        lps = [
            [[None if lp != lp else lp] for lp in row] for row in self.logps(prompts)
        ]  # NaN -> None, as vLLM's
        return prompts, [list(c) for c in COMPLETIONS], lps, None

    # ablate's generator seam
    def __call__(self, model: torch.nn.Module, prompt_ids: list[list[int]]) -> Completions:
        self.prompts.append(prompt_ids)
        return Completions(ids=[list(c) for c in COMPLETIONS], logps=self.logps(prompt_ids))


CASES = {  # id -> GRPOConfig fields
    "sequence_mask": {},  # TRL's defaults: sequence_mask, clip_max 3
    "sequence_truncate": {
        "vllm_importance_sampling_mode": "sequence_truncate",
        "vllm_importance_sampling_clip_min": 0.5,
    },
    "token_mask": {
        "vllm_importance_sampling_mode": "token_mask",
        "vllm_importance_sampling_clip_min": 0.7,
        "vllm_importance_sampling_clip_max": 1.3,
    },
    "token_truncate": {
        "vllm_importance_sampling_mode": "token_truncate",
        "vllm_importance_sampling_clip_max": 1.3,
    },
    "gspo_sequence_mask": {"importance_sampling_level": "sequence", "vllm_importance_sampling_clip_min": 0.5},
    "kl_token_truncate": {
        "vllm_importance_sampling_mode": "token_truncate",
        "vllm_importance_sampling_clip_max": 1.3,
        "beta": 0.04,
    },
    "off_policy_mask": {"off_policy_mask_threshold": 0.05},
    "off_policy_mask_only": {"off_policy_mask_threshold": 0.05, "vllm_importance_sampling_correction": False},
}


@pytest.mark.parametrize("case", list(CASES))
def test_engine_correction_matches_trl(tmp_path, case):
    fields = CASES[case]
    tok, policy = tiny()
    ds = Dataset.from_list([{"prompt": "ab:"}, {"prompt": "cd:"}])
    common = (
        dict(
            per_device_train_batch_size=8,
            num_generations=4,
            max_completion_length=8,
            report_to="none",
            use_cpu=True,
            bf16=False,
            epsilon=0.1,
            epsilon_high=0.15,
        )
        | fields
    )
    trl_args = trl.GRPOConfig(output_dir=str(tmp_path / "trl"), loss_type="dapo", **(common | {"beta": 0.0}))
    theirs = trl.GRPOTrainer(
        model=copy.deepcopy(policy),
        reward_funcs=[_reward],
        train_dataset=ds,
        processing_class=tok,
        args=trl_args,
    )
    theirs.beta = common.get(
        "beta", 0.0
    )  # TRL builds a reference from a hub path when beta > 0: set it after
    if theirs.beta:  # as TRL's __init__ prepares its reference: the fused log-prob head
        theirs.ref_model = copy.deepcopy(policy).eval()
        grpo_trainer.add_fused_lm_head(theirs.ref_model, temperature=theirs.temperature)
    theirs.use_vllm, theirs.vllm_generation, theirs._last_loaded_step = True, Engine(theirs.model), -1
    ours = GRPOTrainer(
        model=copy.deepcopy(policy),
        reward_funcs={"r": _reward},
        train_dataset=ds,
        processing_class=tok,
        aggregation=functools.partial(grpo_losses.dapo),
        args=GRPOConfig(output_dir=str(tmp_path / "ours"), **common),
    )
    ours.generator = Engine(ours.model)
    theirs.model.train(), ours.model.train()
    theirs.current_gradient_accumulation_steps = 1  # set by Trainer's loop; one micro-batch per step here

    out = theirs._generate_and_score_completions([{"prompt": p} for p in ("ab:", "cd:") for _ in range(4)])
    rows = [ours.train_dataset[i] for i in (0, 0, 0, 0, 1, 1, 1, 1)]
    rollout = ours._generate_and_score(rows, "train")
    assert (
        theirs.vllm_generation.prompts == ours.generator.prompts
    )  # the same prompt ids reached both engines
    torch.testing.assert_close(rollout.advantages, out["advantages"], rtol=0, atol=1e-6)
    loss_theirs = theirs.compute_loss(theirs.model, out)
    loss_ours = ours.compute_loss(ours.model, rollout)
    assert abs(loss_ours.item() - loss_theirs.item()) <= 1e-5, (loss_ours.item(), loss_theirs.item())

    m_theirs = {k: v[-1] for k, v in theirs._metrics["train"].items()}
    m_ours = ours.metrics.pop("train")
    names = CLIP + (SAMPLING if common.get("vllm_importance_sampling_correction", True) else ())
    names += ("kl",) if common.get("beta") else ()
    for name in names:
        assert abs(float(m_ours[name]) - m_theirs[name]) <= 1e-5, (name, float(m_ours[name]), m_theirs[name])
    if "vllm_importance_sampling_correction" in fields:  # off: no engine-ratio metrics logged (as TRL)
        assert not any(k.startswith("sampling/") for k in m_ours)
    # the fixture exercises what it compares: some ratios outside the bounds, not all; some completions dropped
    if "vllm_importance_sampling_correction" not in fields:
        assert 0 < float(m_ours["sampling/importance_sampling_ratio/masked_fraction"]) < 1
    if "off_policy_mask_threshold" in fields:
        assert 0 < float(m_ours["off_policy/masked_fraction"]) < 1
