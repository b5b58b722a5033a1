"""GRPO losses (Shao et al. 2024, DeepSeekMath eq. 3) as pure functions of per-token log-probs.

Three pieces, composed by the trainer:
- advantages: `A_i = (r_i - mean(group)) / (std + 1e-4)` per prompt group (eq. in section 4.1.2), with
  the std taken per group (`method/grpo_scale_rewards=group`), over the whole batch (`batch`, Liu et al. 2025
  recommend it) or not at all (`none`, Dr. GRPO). A group whose rewards are all equal gets A = 0.
- per-token loss: the PPO clipped surrogate `-min(r*A, clip(r, 1-eps, 1+eps_high)*A)` with
  `r = exp(logp - old_logp)` per token, or one `r = exp(mean_t(logp - old_logp))` per completion
  (GSPO, Zheng et al. 2025: `importance_sampling_level: sequence`), optionally capped at `delta`
  (two-sided clipping), plus `beta * KL` with the k3 estimator
  `exp(ref - logp) - (ref - logp) - 1` (Schulman 2020) when beta > 0.
- per-token objective (`method/grpo_objective=clip | cispo | sapo`): the clipped surrogate above, CISPO's
  clipped-weight REINFORCE term or SAPO's soft gate; TRL's `loss_type=cispo` is objective cispo with
  the dapo aggregation, `loss_type=sapo` objective sapo with the grpo aggregation.
- aggregation over tokens (TRL's `loss_type`; here `method/grpo_aggregation=NAME`,
  conf/method/grpo_aggregation/), named and defined as in TRL 1.16: `grpo` mean over each sequence's tokens,
  then over sequences (the paper; biased towards short completions); `dapo` sum over all tokens / a token
  count fixed per round (Yu et al. 2025); `dr_grpo` sum over all tokens / (sequences * max_completion_length)
  (Liu et al. 2025); `bnpo` sum over a micro-batch's tokens / its token count.

Departures from the paper, all as in TRL: the std is the unbiased one (torch.std), rewards may be
None (NaN: such a completion is left out of its group's statistics and gets A = 0), and several
reward functions are summed with weights before normalising
(`method/grpo_reward_aggregation=sum_then_normalize`; `normalize_then_sum` normalises each function per group
first, as TRL's `multi_objective_aggregation`). Departure from TRL: rewards so large that float32 statistics
of them overflow (+-3e38) are aggregated in float64 (`headroom`), where TRL's advantages would all be 0.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

Aggregation = Callable[..., torch.Tensor]
# (inputs: LossInputs, *, epsilon, epsilon_high, beta, importance_sampling_level, delta, bias_correction_kl,
#  **own) -> (per-token loss (B, T), metrics); `method/grpo_objective=NAME`; the `objective` decorator gives a
# function of the ratio and advantages this signature
Objective = Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]]


@dataclass(frozen=True)
class LossInputs:
    """A micro-batch's tensors, as every objective takes them: B completions of T tokens."""

    logps: torch.Tensor  # (B, T) under the policy being trained (with grad)
    old_logps: torch.Tensor  # (B, T) under the policy that generated them (pi_old; logps.detach() on-policy)
    advantages: torch.Tensor  # (B,)
    mask: torch.Tensor  # (B, T) float: 1 on the completion tokens that get a loss
    ref_logps: torch.Tensor | None = None  # (B, T) under the reference policy, for the KL term (beta > 0)
    # (B, T) or (B, 1) times the policy term, not the KL term: the engine's importance-sampling correction
    # and/or the off-policy mask (ablate.losses.is_correction); None = 1
    policy_weight: torch.Tensor | None = None


def headroom(rewards_per_func: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
    """The reward table in float64 when its weighted rewards are so large that a sum, a spread or a variance
    of them could overflow float32 (|r| past ~sqrt(3.4e38 / 4N), ~1e18 for 64 completions: a reward function
    returning +-3e38 made every statistic inf/NaN, so every advantage 0); any other table as it is, so TRL's
    float32 arithmetic holds to the bit. The advantages go back to the table's dtype."""
    if rewards_per_func.dtype == torch.float64 or rewards_per_func.numel() == 0:
        return rewards_per_func
    largest = torch.nan_to_num(rewards_per_func.abs(), nan=0.0).max().double() * rewards_per_func.shape[-1]
    if weights is not None and weights.numel():
        largest = largest * weights.abs().max().double()
    limit = (torch.finfo(rewards_per_func.dtype).max / (4 * rewards_per_func.numel())) ** 0.5
    return rewards_per_func.double() if largest > limit else rewards_per_func


def _nanstd(x: torch.Tensor, dim: int | None = None, keepdim: bool = False) -> torch.Tensor:
    """Unbiased std ignoring NaNs (torch has nanmean but no nanstd)."""
    mean = torch.nanmean(x, dim=dim, keepdim=True)
    count = (~torch.isnan(x)).sum(dim=dim, keepdim=True) if dim is not None else (~torch.isnan(x)).sum()
    var = torch.nansum((x - mean) ** 2, dim=dim, keepdim=True) / (count - 1).clamp(min=1)
    std = var.sqrt()
    return std if keepdim or dim is None else std.squeeze(dim)


def group_std(rewards: torch.Tensor) -> torch.Tensor:
    """`scale_rewards: group`: divide by each prompt group's std. rewards: (groups, G) -> (groups, 1)."""
    return _nanstd(rewards, dim=1, keepdim=True) + 1e-4


def batch_std(rewards: torch.Tensor) -> torch.Tensor:
    """`scale_rewards: batch`: divide by one std over every reward of the generation batch."""
    return (_nanstd(rewards) + 1e-4).expand(rewards.shape[0], 1)


def no_std(rewards: torch.Tensor) -> torch.Tensor:
    """`scale_rewards: none`: centre only (Dr. GRPO: dividing by the std biases towards easy/hard prompts)."""
    return torch.ones(rewards.shape[0], 1, dtype=rewards.dtype)


# the denominator of the advantage, (groups, G) -> (groups, 1) or broadcastable; a config node
# `conf/method/grpo_scale_rewards/<name>.yaml` names one (`method/grpo_scale_rewards=batch`)
Scale = Callable[[torch.Tensor], torch.Tensor]
# (rewards_per_func (N, F), weights (F,), num_generations, scale) -> (advantages (N,), metrics);
# `method/grpo_reward_aggregation=NAME` names one
Advantages = Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]]


def weighted_sum(rewards_per_func: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Each completion's weighted sum of its rewards (N,); NaN where every function returned None
    (unscorable: out of the baseline and the statistics, advantage 0)."""
    rewards = (rewards_per_func * weights.to(rewards_per_func).unsqueeze(0)).nansum(dim=1)
    rewards[torch.isnan(rewards_per_func).all(dim=1)] = torch.nan
    return rewards


def frac_zero_std(grouped: torch.Tensor, scale: Scale) -> torch.Tensor:
    """TRL 1.16's `frac_reward_zero_std`: the fraction of completions whose advantage std is zero, that
    std being the batch's with `scale_rewards: batch` (so 0 or 1), else each group's (`none` too,
    which divides by nothing but logs it). grouped: (groups, G) rewards, NaN = unscorable."""
    if getattr(scale, "func", scale) is batch_std:  # a config's scale is functools.partial(batch_std)
        return torch.isclose(_nanstd(grouped), torch.zeros((), dtype=grouped.dtype)).float()
    return torch.isclose(_nanstd(grouped, dim=1), torch.zeros((), dtype=grouped.dtype)).float().mean()


def sum_then_normalize(
    rewards_per_func: torch.Tensor, weights: torch.Tensor, num_generations: int, scale: Scale = group_std
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Group-relative advantages from a reward table.

    rewards_per_func: (N, F), one column per reward function, NaN where a function returned None;
    rows are consecutive groups of `num_generations` completions of one prompt. Returns (A (N,),
    metrics) with TRL's metric names: `reward`, `reward_std`, `frac_reward_zero_std`.
    """
    dtype, rewards_per_func = rewards_per_func.dtype, headroom(rewards_per_func, weights)
    rewards = weighted_sum(rewards_per_func, weights)
    grouped = rewards.view(-1, num_generations)
    centred = grouped - torch.nanmean(grouped, dim=1, keepdim=True)
    scaled = centred / scale(grouped)
    metrics = {
        "reward": torch.nanmean(rewards),
        "reward_std": _nanstd(rewards),
        "frac_reward_zero_std": frac_zero_std(grouped, scale),
    }
    return torch.nan_to_num(scaled.reshape(-1), nan=0.0).to(dtype), metrics


def normalize_then_sum(
    rewards_per_func: torch.Tensor, weights: torch.Tensor, num_generations: int, scale: Scale = group_std
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """TRL's `multi_objective_aggregation: normalize_then_sum` (GDPO): each reward function is normalised
    within its group first, so a reward with a large range cannot drown the others; the weighted sum
    is then centred and divided by its std over the whole batch (`scale` is not used, as in TRL).
    Same inputs and metrics as `advantages` (`reward`, `reward_std` are of the raw weighted sum)."""
    dtype, rewards_per_func = rewards_per_func.dtype, headroom(rewards_per_func, weights)
    all_nan = torch.isnan(rewards_per_func).all(dim=1)
    grouped = rewards_per_func.view(-1, num_generations, rewards_per_func.shape[1])
    per_func = (grouped - torch.nanmean(grouped, dim=1, keepdim=True)) / (
        _nanstd(grouped, dim=1, keepdim=True) + 1e-4
    )
    summed = (per_func.reshape(rewards_per_func.shape) * weights.to(rewards_per_func).unsqueeze(0)).nansum(
        dim=1
    )
    summed[all_nan] = torch.nan
    std = _nanstd(summed)
    adv = (summed - torch.nanmean(summed)) / (std + 1e-4)
    raw = weighted_sum(rewards_per_func, weights)
    metrics = {
        "reward": torch.nanmean(raw),
        "reward_std": _nanstd(raw),
        "frac_reward_zero_std": torch.isclose(std, torch.zeros((), dtype=std.dtype)).float(),
    }
    return torch.nan_to_num(adv, nan=0.0).to(dtype), metrics


def objective(core: Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]]) -> Objective:
    """The signature every `method/grpo_objective` shares, around `core`, which holds only what differs.

    The objective made: `(inputs: LossInputs, *, epsilon, epsilon_high, beta, importance_sampling_level,
    delta, bias_correction_kl, **own)` -> (loss (B, T), metrics), each argument without a default of its own:
    the trainer passes method.args' (GRPOArgs declares them, once). `importance_sampling_level`: `token`
    (PPO/GRPO: one ratio per token) or `sequence` (GSPO, Zheng et al. 2025: one ratio per completion, exp of
    the mean token log-ratio, shared by its tokens). `beta` > 0
    adds the k3 KL to `ref_logps`; `bias_correction_kl` multiplies it by the (uncapped) ratio, so its gradient
    is unbiased for samples from the old policy (TRL 1.16's default, `use_bias_correction_kl`); the logged
    `kl` is the corrected one, as in TRL. `inputs.policy_weight`, when set, multiplies the core's loss before
    the KL term is added (TRL's order). `core(ratio, adv, logps, mask, epsilon, epsilon_high, delta, **own)`
    -> (loss, metrics): ratio (B, T) or (B, 1) at the sequence level, adv (B, 1); `own` are its config's extra
    fields."""

    def run(
        inputs: LossInputs,
        *,
        epsilon: float,
        epsilon_high: float,
        beta: float,
        importance_sampling_level: str,
        delta: float | None,
        bias_correction_kl: bool,
        **own: float,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        logps, mask, adv = inputs.logps, inputs.mask, inputs.advantages.unsqueeze(1)
        ratio = _ratio(logps, inputs.old_logps, mask, importance_sampling_level)
        loss, metrics = core(ratio, adv, logps, mask, epsilon, epsilon_high, delta, **own)
        if inputs.policy_weight is not None:  # (B, 1) loss x (B, T) weight -> (B, T), as TRL broadcasts
            loss = loss * inputs.policy_weight
        is_weight = ratio if bias_correction_kl else None
        return _with_kl(loss.expand_as(logps), metrics, logps, inputs.ref_logps, beta, is_weight, mask)

    run.__name__, run.__qualname__, run.__doc__ = core.__name__, core.__qualname__, core.__doc__
    # the part that differs, for objectives built on it (rloo.sequence_clip)
    run.core = core  # type: ignore[attr-defined]
    return run


@objective
def clip(
    ratio: torch.Tensor,
    adv: torch.Tensor,
    logps: torch.Tensor,
    mask: torch.Tensor,
    epsilon: float,
    epsilon_high: float,
    delta: float | None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped surrogate per token (+ beta * k3 KL: `objective`).

    `delta`: two-sided clipping (TRL's; Tulu-3 style): the unclipped ratio is also capped at delta, so a
    negative advantage cannot push an already-large ratio without bound.
    Metrics named as in TRL (`clip_ratio/low_mean`, `clip_ratio/high_mean`, `clip_ratio/region_mean`,
    `kl` when beta > 0): masked token means, or means over completions at the sequence level. A token
    is "clipped" when the clip removes its gradient: r < 1-eps with A < 0, or r > 1+eps_high with A > 0.
    """
    clipped = torch.clamp(ratio, 1 - epsilon, 1 + epsilon_high)
    if delta is not None:
        ratio = torch.clamp(ratio, max=delta)
    loss = -torch.min(ratio * adv, clipped * adv)
    low = (ratio < 1 - epsilon) & (adv < 0)
    high = (ratio > 1 + epsilon_high) & (adv > 0)
    metrics = {
        "clip_ratio/low_mean": _level_mean(low.float(), mask),
        "clip_ratio/high_mean": _level_mean(high.float(), mask),
        "clip_ratio/region_mean": _level_mean((low | high).float(), mask),
        # the extremes over completions of each completion's clipped fraction (TRL's names)
        "clip_ratio/low_min": _per_sequence(low.float(), mask).nan_to_num(nan=float("inf")).min(),
        "clip_ratio/high_max": _per_sequence(high.float(), mask).nan_to_num(nan=float("-inf")).max(),
    }
    return loss, metrics


@objective
def cispo(
    ratio: torch.Tensor,
    adv: torch.Tensor,
    logps: torch.Tensor,
    mask: torch.Tensor,
    epsilon: float,
    epsilon_high: float,
    delta: float | None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """CISPO (MiniMax-M1, arXiv:2506.13585): `-sg(min(r, epsilon_high)) * A * logp`, a REINFORCE term
    weighted by the clipped, gradient-stopped ratio: no token loses its gradient, large ratios only
    lose weight. As in TRL, `epsilon_high` is the cap itself (ScaleRL, arXiv:2510.13786, recommends
    5.0); `epsilon` and `delta` are unused.
    Metric `cispo_clip_ratio`: tokens with r > epsilon_high and A > 0."""
    loss = -torch.clamp(ratio, max=epsilon_high).detach() * adv * logps
    capped = ((ratio > epsilon_high) & (adv > 0)).float()
    return loss, {"cispo_clip_ratio": _level_mean(capped, mask)}


@objective
def sapo(
    ratio: torch.Tensor,
    adv: torch.Tensor,
    logps: torch.Tensor,
    mask: torch.Tensor,
    epsilon: float,
    epsilon_high: float,
    delta: float | None,
    temperature_pos: float,
    temperature_neg: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """SAPO (Soft Adaptive Policy Optimization, arXiv:2511.20347): the hard clip replaced by a smooth
    gate, `-sigmoid(tau (r - 1)) * 4/tau * A` with tau = temperature_pos where A > 0, else temperature_neg;
    its gradient is 1 at r = 1 and fades smoothly as r leaves 1. Epsilons and delta are unused."""
    tau = torch.where(adv > 0, temperature_pos, temperature_neg)
    return -torch.sigmoid(tau * (ratio - 1)) * 4 / tau * adv, {}


def _level_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """A metric's mean: over the masked tokens (B, T), or over completions at the sequence level (B, 1)."""
    return masked_mean(x, mask) if x.shape[1] > 1 else x.mean()


def _sequence_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Each completion's masked token mean (B,), 0 for one with no tokens."""
    return (x * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)


def _per_sequence(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Each completion's masked token mean (B,) (NaN for one with no tokens); (B, 1) values as they are."""
    return x.squeeze(1) if x.shape[1] == 1 else (x * mask).sum(-1) / mask.sum(-1)


def _ratio(logps: torch.Tensor, old_logps: torch.Tensor, mask: torch.Tensor, level: str) -> torch.Tensor:
    """Importance ratio pi/pi_old: per token (B, T), or per completion (B, 1) from the mean log-ratio."""
    log_ratio = logps - old_logps
    if {"token": False, "sequence": True}[level]:  # the value is checked by its schema (ablate.schema.grpo)
        log_ratio = _sequence_mean(log_ratio, mask).unsqueeze(1)
    return torch.exp(log_ratio)


def _with_kl(
    loss: torch.Tensor,
    metrics: dict[str, torch.Tensor],
    logps: torch.Tensor,
    ref_logps: torch.Tensor | None,
    beta: float,
    is_weight: torch.Tensor | None,
    mask: torch.Tensor,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Add beta * k3 KL to the reference (times the importance weight when given); log `kl`."""
    if beta == 0.0:
        return loss, metrics
    if ref_logps is None:
        raise ValueError("beta > 0 needs ref_logps")
    kl = torch.exp(ref_logps - logps) - (ref_logps - logps) - 1
    if is_weight is not None:
        kl = kl * is_weight
    metrics["kl"] = masked_mean(kl.detach(), mask)
    return loss + beta * kl, metrics


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of x over the tokens where mask is 1 (0 when there are none)."""
    return (x * mask).sum() / mask.sum().clamp(min=1.0)


def grpo(
    loss: torch.Tensor, mask: torch.Tensor, num_items: float, max_completion_length: int
) -> torch.Tensor:
    """Mean over each sequence's tokens, then mean over sequences (the GRPO paper, eq. 3)."""
    return _sequence_mean(loss, mask).mean()


def dapo(
    loss: torch.Tensor, mask: torch.Tensor, num_items: float, max_completion_length: int
) -> torch.Tensor:
    """Sum over all tokens / `num_items` (DAPO's token-level mean: every token weighs the same, however
    long its completion). The trainer passes the mean completion tokens per micro-batch of the
    generation round, so with its 1/accumulation scaling this is TRL's tokens-per-window normaliser."""
    return (loss * mask).sum() / max(num_items, 1.0)


def bnpo(
    loss: torch.Tensor, mask: torch.Tensor, num_items: float, max_completion_length: int
) -> torch.Tensor:
    """Sum over the micro-batch's tokens / its token count (TRL's bnpo: a token mean per micro-batch)."""
    return masked_mean(loss, mask)


def dr_grpo(
    loss: torch.Tensor, mask: torch.Tensor, num_items: float, max_completion_length: int
) -> torch.Tensor:
    """Sum over all tokens / (sequences * max_completion_length): a constant normaliser (Dr. GRPO)."""
    return (loss * mask).sum() / (loss.size(0) * max_completion_length)
