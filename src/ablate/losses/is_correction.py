"""Corrections for completions sampled by an engine other than the trainer (vLLM), as TRL 1.16 applies them.

An inference engine samples from *its* numbers: other kernels, another dtype, its own top-k/top-p
processing, so its per-token log-probs `sampling_logps` differ from the trainer's `logps` of the same
tokens even with the same weights. The policy gradient then uses samples from the engine's
distribution as if they were the trainer's. Two pure functions re-weight or drop them:

- `importance_sampling_correction` (TRL's `vllm_importance_sampling_correction`, on by default whenever
  vLLM generates; the "truncated importance sampling" of Yao et al. 2025, "Your Efficient RL Framework
  Secretly Brings You Off-Policy RL Training", and its masked variant from Liu et al. 2025, "When Speed
  Kills Stability"): the policy term of each token is multiplied by `rho = pi_trainer / pi_engine`, per
  token or one per completion (`exp` of the summed token log-ratios), kept within [clip_min, clip_max]
  by truncation (`*_truncate`: rho <- clamp(rho)) or by masking (`*_mask`: rho <- 0 outside).
- `off_policy_mask` (TRL's `off_policy_mask_threshold`; DeepSeek-V3.2, arXiv:2512.02556, eq. 9): a
  completion with a negative advantage whose mean token KL from the sampling policy to the current one
  exceeds the threshold gets no policy loss.

Both only multiply the policy term; the KL-to-reference term is added after them, as in TRL.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from ablate.schema.grpo import IS_MODES

Constraint = Callable[[torch.Tensor, float | None, float | None], torch.Tensor]


def truncate(ratio: torch.Tensor, clip_min: float | None, clip_max: float | None) -> torch.Tensor:
    """`*_truncate`: clamp the ratio into [clip_min, clip_max] (a None bound is no bound)."""
    if clip_min is None and clip_max is None:
        return ratio
    return torch.clamp(ratio, min=clip_min, max=clip_max)


def mask_outside(ratio: torch.Tensor, clip_min: float | None, clip_max: float | None) -> torch.Tensor:
    """`*_mask`: a ratio outside [clip_min, clip_max] becomes 0 (its token or completion: no policy loss)."""
    return ratio.masked_fill(_outside(ratio, clip_min, clip_max), 0.0)


# TRL's vllm_importance_sampling_mode (its names: the config's schema, IS_MODES) -> (one ratio per
# completion?, how out-of-range ratios are handled): `<token|sequence>_<truncate|mask>`
MODES: dict[str, tuple[bool, Constraint]] = {
    mode: (mode.startswith("sequence_"), truncate if mode.endswith("_truncate") else mask_outside)
    for mode in IS_MODES
}


def importance_sampling_correction(
    logps: torch.Tensor,
    sampling_logps: torch.Tensor,
    mask: torch.Tensor,
    *,
    mode: str = "sequence_mask",
    clip_min: float | None = None,
    clip_max: float | None = 3.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The weight on each token's policy loss that corrects for sampling by the engine, and TRL's metrics.

    logps: (B, T) the trainer's log-probs of the sampled tokens under the policy that generated them
    (TRL's `old_per_token_logps`); sampling_logps: (B, T) the engine's (NaN where it gave none: such a
    token counts as ratio 1, as in TRL); mask: (B, T) float, 1 on completion tokens.
    Returns (weight, metrics): weight (B, T) for `token_*` modes, (B, 1) for `sequence_*` modes.

    `sequence_*`: rho = exp(sum_t mask * (logps - sampling_logps)); `token_*`: per token. Example
    (sequence_mask, clip_max 3): a completion of two tokens with logps - sampling_logps = (0.5, 0.6)
    has rho = e^1.1 = 3.004 > 3 -> 0 (no policy loss); (0.5, 0.5): e^1.0 = 2.718 -> kept as 2.718;
    sequence_truncate would give min(3.004, 3) = 3 and 2.718.

    Metrics (TRL's names): `sampling/sampling_logp_difference/{mean,max}` of |logps - sampling_logps|
    over the completion tokens (NaN left out), `sampling/importance_sampling_ratio/{min,mean,max}` of the
    weight after truncation/masking, over completion tokens (token modes) or completions (sequence modes);
    and ablate's `sampling/importance_sampling_ratio/masked_fraction`: the share of those whose ratio was
    outside [clip_min, clip_max] (masked to 0 by `*_mask`, clamped by `*_truncate`). Empty -> 0, as in TRL.
    """
    per_sequence, constrain = MODES[mode]  # the value is checked by its schema (ablate.schema.grpo)
    diff = torch.nan_to_num((logps - sampling_logps) * mask, nan=0.0)  # unscored tokens: ratio 1
    log_ratio = diff.sum(-1, keepdim=True) if per_sequence else diff
    raw = torch.exp(log_ratio)
    weight = constrain(raw, clip_min, clip_max)
    token = mask.bool()
    delta = (logps - sampling_logps).abs()
    delta = delta[token & ~torch.isnan(delta)]
    pick = (lambda x: x.flatten()) if per_sequence else (lambda x: x[token])
    flat, outside = pick(weight), pick(_outside(raw, clip_min, clip_max)).float()
    metrics = {
        "sampling/sampling_logp_difference/mean": _or_zero(delta, torch.mean),
        "sampling/sampling_logp_difference/max": _or_zero(delta, torch.max),
        "sampling/importance_sampling_ratio/min": _or_zero(flat, torch.min),
        "sampling/importance_sampling_ratio/mean": _or_zero(flat, torch.mean),
        "sampling/importance_sampling_ratio/max": _or_zero(flat, torch.max),
        "sampling/importance_sampling_ratio/masked_fraction": _or_zero(outside, torch.mean),
    }
    return weight, metrics


def off_policy_mask(
    advantages: torch.Tensor,
    logps: torch.Tensor,
    sampling_logps: torch.Tensor,
    mask: torch.Tensor,
    threshold: float,
) -> torch.Tensor:
    """DeepSeek-V3.2's off-policy sequence mask (TRL's `get_off_policy_mask`): (B, 1), 1 = keep, 0 = drop.

    advantages: (B, 1); logps: (B, T) under the current policy (detached here); sampling_logps: (B, T)
    under the policy that sampled (the engine's, else pi_old; NaN = no evidence, counted as 0).
    A completion is dropped when its advantage is negative AND its mean token KL estimate
    `mean_t(sampling_logps - logps)` exceeds `threshold`. Example (threshold 0.5): two tokens with
    sampling - current = (0.4, 0.8): mean 0.6 > 0.5 -> dropped if A < 0, kept if A >= 0; (0.4, 0.4):
    0.4 -> kept. A completion without tokens has mean 0 (kept).
    """
    kl = torch.nan_to_num(sampling_logps - logps.detach(), nan=0.0)
    mean_kl = (kl * mask).sum(1, keepdim=True) / mask.sum(1, keepdim=True).clamp(min=1.0)
    return ((advantages >= 0) | (mean_kl <= threshold)).to(mask.dtype)


def policy_weight(
    logps: torch.Tensor,
    old: torch.Tensor,
    sampling: torch.Tensor | None,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    args: Any,
) -> tuple[torch.Tensor | None, dict[str, torch.Tensor]]:
    """The weight on GRPO's policy term (None = 1): TRL's correction for an engine's sampling (only when the
    generator returned its log-probs, `sampling`, i.e. vLLM) and the off-policy sequence mask. `old` is the
    trainer's log-probs under the generating policy (TRL's old_per_token_logps); `args`: GRPOConfig's
    vllm_importance_sampling_* and off_policy_mask_threshold."""
    weight, metrics = None, {}
    if sampling is not None and args.vllm_importance_sampling_correction:
        weight, metrics = importance_sampling_correction(
            old,
            sampling,
            mask,
            mode=args.vllm_importance_sampling_mode,
            clip_min=args.vllm_importance_sampling_clip_min,
            clip_max=args.vllm_importance_sampling_clip_max,
        )
    if (
        args.off_policy_mask_threshold is not None
    ):  # against the engine's log-probs when there are some, as TRL
        keep = off_policy_mask(
            advantages.unsqueeze(1),
            logps,
            old if sampling is None else sampling,
            mask,
            args.off_policy_mask_threshold,
        )
        metrics["off_policy/masked_fraction"] = 1 - keep.mean()
        weight = keep if weight is None else weight * keep
    return weight, metrics


def _outside(ratio: torch.Tensor, clip_min: float | None, clip_max: float | None) -> torch.Tensor:
    lo = -math.inf if clip_min is None else clip_min
    hi = math.inf if clip_max is None else clip_max
    return (ratio < lo) | (ratio > hi)


def _or_zero(x: torch.Tensor, fn: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    return fn(x) if x.numel() else torch.zeros((), device=x.device)
