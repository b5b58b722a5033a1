"""SFT loss: mean negative log-likelihood of the completion tokens only (prompt tokens masked)."""

from __future__ import annotations

import torch


def nll(
    per_token_logps: torch.Tensor, mask: torch.Tensor, num_items_in_batch: int | torch.Tensor | None = None
) -> torch.Tensor:
    """-sum(logp * mask) / N, with N the number of completion tokens.

    Under gradient accumulation, `num_items_in_batch` is the token count of the whole accumulated
    batch, so the summed micro-batch losses equal the loss of one big batch (the fix transformers
    made in 4.46 for the per-micro-batch-mean bias). Without it, N is this batch's token count.
    """
    total = -(per_token_logps * mask).sum()
    n = num_items_in_batch if num_items_in_batch is not None else mask.sum()
    return total / torch.as_tensor(n, dtype=total.dtype, device=total.device).clamp_min(1)
