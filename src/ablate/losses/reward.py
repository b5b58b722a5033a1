"""Reward-model losses (Bradley-Terry) as pure functions of the scalar rewards of chosen and rejected.

A reward model scores a whole sequence with one number, `r = score(h_last)` (the classification head on
the hidden state of its last token). On a preference pair (chosen c, rejected r), per pair:

    loss = -log sigmoid(r_c - r_r - m) + lambda * (r_c + r_r)^2

- the Bradley-Terry likelihood of the observed preference (Bradley & Terry 1952; InstructGPT, Ouyang
  et al. 2022, eq. 1); `m` is a per-pair margin (TRL's optional `margin` column: the chosen response
  must win by at least m, Llama 2, Touvron et al. 2023, eq. 2), 0 when the data has none;
- `lambda = center_rewards_coefficient` pulls the rewards towards zero mean (Eisenstein et al. 2023,
  arXiv:2312.09244, eq. 2), unused when None. Bradley-Terry only sees differences, so without it the
  scale's offset drifts freely.

The mean over pairs of this per-pair loss is TRL 1.16's RewardTrainer loss exactly (it takes the two
terms' batch means separately; the sum of means is the mean of sums). Metrics named as TRL logs them
(`reward_metrics`): `accuracy` (r_c > r_r), `margin` (r_c - r_r), `mean_reward`, `min_reward`,
`max_reward` over the batch's 2B rewards.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

Tensor = torch.Tensor


def bradley_terry(
    r_c: Tensor, r_r: Tensor, margin: Tensor | None = None, center_rewards_coefficient: float | None = None
) -> tuple[Tensor, dict[str, Tensor]]:
    """Per-pair loss (B,): `-logsig(r_c - r_r - margin)`, plus `lambda (r_c + r_r)^2` with a coefficient."""
    delta = r_c - r_r if margin is None else r_c - r_r - margin.to(r_c)
    loss = -F.logsigmoid(delta)
    if center_rewards_coefficient is not None:
        loss = loss + center_rewards_coefficient * (r_c + r_r) ** 2
    return loss, {}


@torch.no_grad()
def reward_metrics(r_c: Tensor, r_r: Tensor) -> dict[str, Tensor]:
    """TRL's RewardTrainer metrics of one batch (the trainer averages them over a logging window)."""
    both = torch.cat([r_c, r_r])
    return {
        "accuracy": (r_c > r_r).float().mean(),
        "margin": (r_c - r_r).mean(),
        "mean_reward": both.mean(),
        "min_reward": both.min(),
        "max_reward": both.max(),
    }
