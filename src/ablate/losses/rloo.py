"""RLOO (REINFORCE Leave-One-Out; Kool et al. 2019, Ahmadian et al. 2024, arXiv:2402.14740) as TRL 1.16's
RLOOTrainer computes it: GRPO's rollouts with another advantage estimator and a per-completion objective.
Three pieces, each a config option of the GRPO trainer's seams (conf/method/rloo.yaml picks them):

- advantages (`leave_one_out`, `method/grpo_reward_aggregation`): per completion i of a group of G,
      r_i' = clip(sum_f w_f r_if, reward_clip_range) - beta * sum_t (log pi_old(y_t) - log pi_ref(y_t))
      A_i  = r_i' - mean_{j != i} r_j'         (the leave-one-out baseline, eq. 6 of Ahmadian et al.)
  then, with `normalize_advantages`, A <- (A - mean A) / (std A + 1e-4) over the generation batch. The KL is
  the first-order estimate (k1, can be negative per token) summed over the completion: a reward penalty,
  as in the RLOO paper and TRL, not GRPO's k3 loss term. A completion no reward function scored (all NaN)
  is left out of its siblings' baselines and gets A = 0; a group with one scorable completion gives it 0.
- objective (`sequence_clip`, `method/grpo_objective`): one importance ratio per completion,
  rho = exp(sum_t (log pi - log pi_old)) (summed, not GSPO's mean), in PPO's clipped surrogate
  -min(rho A, clip(rho, 1 - eps, 1 + eps_high) A) (the clip core of ablate.losses.grpo.clip);
- aggregation (`sequences`, `method/grpo_aggregation`): the mean over completions.

Metrics named as TRL logs them: `reward`, `reward_std` (of the weighted reward, before clipping and KL),
`frac_reward_zero_std` (groups whose penalised rewards are all equal), `kl` (the token mean of the k1
estimate, with beta > 0), and the clip ratios.
"""

from __future__ import annotations

import torch

from ablate.losses import grpo
from ablate.losses.grpo import LossInputs
from ablate.losses.grpo import _nanstd as nanstd  # the unbiased NaN-ignoring std GRPO's advantages use

Tensor = torch.Tensor


def leave_one_out(
    rewards_per_func: Tensor,
    weights: Tensor,
    num_generations: int,
    scale: object = None,
    *,
    token_kl: Tensor | None = None,
    mask: Tensor | None = None,
    beta: float,
    normalize_advantages: bool,
    reward_clip_range: tuple[float, float] | None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """RLOO's advantages (N,) and metrics from a reward table (N, F) of consecutive groups of
    `num_generations`. `token_kl` (N, T): log pi_old - log pi_ref per completion token, `mask` (N, T) its
    tokens: given (the trainer does with beta > 0), `beta` times its per-completion sum is subtracted from
    the reward. `scale` is GRPO's std option and is not used: RLOO's baseline needs none. `beta`,
    `normalize_advantages`, `reward_clip_range`: no default here (conf/method/rloo.yaml wires RLOOArgs')."""
    # +-3e38: float64
    dtype, rewards_per_func = (rewards_per_func.dtype, grpo.headroom(rewards_per_func, weights))
    raw = grpo.weighted_sum(rewards_per_func, weights)  # NaN: out of the baselines; advantage 0 below
    rewards = (
        raw if reward_clip_range is None else raw.clamp(min=reward_clip_range[0], max=reward_clip_range[1])
    )
    metrics: dict[str, Tensor] = {}
    if token_kl is not None and beta != 0.0:
        mask = torch.ones_like(token_kl) if mask is None else mask.to(token_kl)
        rewards = rewards - beta * (token_kl * mask).sum(-1).to(rewards)
        metrics["kl"] = grpo.masked_mean(token_kl, mask)
    grouped = rewards.view(-1, num_generations)
    scorable = (~torch.isnan(grouped)).sum(dim=1, keepdim=True)
    # NaN: no sibling to compare
    baseline = (torch.nansum(grouped, dim=1, keepdim=True) - grouped) / (scorable - 1)
    advantages = rewards - baseline.view(-1)
    if normalize_advantages:  # over the generation batch's scorable completions
        advantages = (advantages - torch.nanmean(advantages)) / (nanstd(advantages) + 1e-4)
    # one value: no std (TRL's)
    group_std = nanstd(grouped, dim=1).masked_fill(scorable.squeeze(1) < 2, torch.nan)
    metrics |= {
        "reward": torch.nanmean(raw),
        "reward_std": nanstd(raw).reshape(()),
        "frac_reward_zero_std": torch.isclose(group_std, torch.zeros_like(group_std)).to(raw.dtype).mean(),
    }
    return torch.nan_to_num(advantages, nan=0.0).to(dtype), metrics


def sequence_clip(
    inputs: LossInputs,
    *,
    epsilon: float,
    epsilon_high: float,
    beta: float,
    importance_sampling_level: str,
    delta: float | None,
    bias_correction_kl: bool,
) -> tuple[Tensor, dict[str, Tensor]]:
    """RLOO's objective, per completion (B, 1): the PPO clip on rho = exp(sum_t log-ratio). No KL term (RLOO's
    KL is a reward penalty: `leave_one_out`), so `beta` and `bias_correction_kl` are not read; nor is
    `importance_sampling_level` (the ratio is always per completion). `inputs.policy_weight` (B, 1), e.g.
    the off-policy mask, multiplies the loss."""
    log_ratio = ((inputs.logps - inputs.old_logps) * inputs.mask).sum(-1, keepdim=True)
    loss, metrics = grpo.clip.core(
        torch.exp(log_ratio),
        inputs.advantages.unsqueeze(1),
        inputs.logps,
        inputs.mask,
        epsilon,
        epsilon_high,
        delta,
    )
    return (loss if inputs.policy_weight is None else loss * inputs.policy_weight), metrics


def sequences(loss: Tensor, mask: Tensor, num_items: float, max_completion_length: int) -> Tensor:
    """The mean over completions of a per-completion loss (B, 1) (RLOO's `per_sequence_loss.mean()`)."""
    if loss.dim() != 2 or loss.shape[1] != 1:
        raise ValueError(
            f"sequences aggregates one loss per completion (B, 1), got {tuple(loss.shape)}: "
            "pick a per-token aggregation (grpo, dapo, dr_grpo, bnpo) for a per-token objective"
        )
    return loss.mean()
