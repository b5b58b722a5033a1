"""Per-token log-probs from logits: the one place model outputs become loss inputs."""

from __future__ import annotations

from typing import Any

import torch


def selective_log_softmax(logits: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """`log_softmax(logits).gather(-1, index)` without materialising the full log-softmax.

    `logsumexp` over the vocabulary per position, then the chosen logit minus it; the same numbers as
    the plain formula (parity-tested), with memory O(B*T) instead of O(B*T*V) for the result.
    Computed in float32 so bf16 logits do not lose the small differences DPO depends on.
    """
    logits = logits.float()
    picked = torch.gather(logits, -1, index.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


def token_logps(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """Log-prob of each next token: position t scores `input_ids[:, t+1]`. Shape (B, T-1)."""
    return selective_log_softmax(logits[:, :-1], input_ids[:, 1:])


def sequence_logps(per_token_logps: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Sum of per-token log-probs over the masked (completion) tokens: log pi(y|x). Shape (B,)."""
    return (per_token_logps * mask).sum(dim=-1)


# Logits of at most this many elements are in float32 at once (their chunk's log-softmax, its exp, ...), per
# device type: 64 MB on a CPU, where these temporaries come on top of a step's activations; 256 MB on a
# GPU, whose matmuls need more rows than that to run at speed (a [tokens, vocab] tensor in float32
# dominates a step's memory at 50k-150k vocabularies).
LOGITS_CHUNK_ELEMENTS = {"cpu": 1 << 24, "cuda": 1 << 26}


def chunk_rows(vocab: int, device: torch.device | str, chunk_elements: int | None = None) -> int:
    """Rows of [rows, vocab] logits handled at once on `device` (at least 1)."""
    kind = torch.device(device).type
    return max(1, (chunk_elements or LOGITS_CHUNK_ELEMENTS.get(kind, LOGITS_CHUNK_ELEMENTS["cuda"])) // vocab)


def block_logps(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0, stats: bool = True
) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, ...]]:
    """One block of rows [n, V] (any float dtype): (log-prob of each target, the logsumexp, stats) in
    float32, where stats are (entropy, vocabulary-mean logit, argmax == target) of the float32 logits
    divided by `temperature` (empty with `stats=False`). The same ops as `selective_log_softmax` on
    `logits.float() / temperature`, so the same numbers."""
    z = logits.float()
    if temperature != 1.0:
        z = z / temperature
    lse = torch.logsumexp(z, dim=-1)
    picked = z.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    if not stats:
        return picked - lse, lse, ()
    logp = z - lse.unsqueeze(-1)
    p = logp.exp()
    entropy = -(p.mul_(logp)).sum(-1)
    return picked - lse, lse, (entropy, z.mean(-1), logits.argmax(-1) == targets)


def block_grad(
    logits: torch.Tensor,
    targets: torch.Tensor,
    lse: torch.Tensor,
    grad: torch.Tensor,
    temperature: float = 1.0,
) -> torch.Tensor:
    """d(sum grad * logp)/d(logits) of one block, in float32: grad * (onehot(target) - softmax(z)) / T, with
    z = logits.float() / T and its softmax exp(z - lse), as autograd computes it for `block_logps`."""
    z = logits.float()
    if temperature != 1.0:
        z = z / temperature
    g = grad.float().unsqueeze(-1)
    out = torch.exp(z.sub_(lse.unsqueeze(-1))).mul_(-g)  # logsumexp's backward: -grad * softmax
    out.scatter_add_(-1, targets.unsqueeze(-1), g)  # gather's backward: +grad at the target
    return out / temperature if temperature != 1.0 else out


def _blocks(n_rows: int, rows: int, length: int) -> list[tuple[int, slice]]:
    """(row, positions) blocks of a [n_rows, length, V] tensor, each at most `rows` positions of one row:
    every block a contiguous view, even of a sliced tensor."""
    return [(r, slice(t, min(t + rows, length))) for r in range(n_rows) for t in range(0, length, rows)]


class LogitsLogps(torch.autograd.Function):
    """Log-probs of `targets` [B, T] under `logits` [B, T, V] (a model's output, any dtype), in blocks of
    rows: no float32 copy of the whole tensor is made, and backward saves only the logits themselves
    (which the model made anyway) and one logsumexp per position, recomputing each block's softmax
    there. The plain formula (`selective_log_softmax` on `logits.float()`) saves a float32 copy of the
    logits and, in backward, several float32 temporaries of their size: 3-5x the logits' memory, the
    largest tensors of a step at 50k+ vocabularies (TRL computes it row by row for the same reason).
    The stats (entropy, mean logit, argmax == target: TRL's token metrics) come from the same pass,
    without gradient, so no caller keeps the logits for them."""

    @staticmethod
    def forward(
        ctx: Any, logits: torch.Tensor, targets: torch.Tensor, temperature: float, rows: int, with_stats: bool
    ) -> tuple[torch.Tensor, ...]:
        b, t = targets.shape
        logps = logits.new_empty((b, t), dtype=torch.float32)
        lse = torch.empty_like(logps)
        stats = (
            torch.empty_like(logps),
            torch.empty_like(logps),
            torch.empty((b, t), dtype=torch.bool, device=logits.device),
        )
        for r, at in _blocks(b, rows, t):
            lp, ls, st = block_logps(logits[r, at], targets[r, at], temperature, with_stats)
            logps[r, at], lse[r, at] = lp, ls
            for out, value in zip(stats, st):
                out[r, at] = value
        ctx.save_for_backward(logits, targets, lse)
        ctx.temperature, ctx.rows = temperature, rows
        if not with_stats:
            return (logps,)
        ctx.mark_non_differentiable(*stats)
        return (logps, *stats)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor, *_: Any) -> tuple[torch.Tensor | None, None, None, None, None]:
        logits, targets, lse = ctx.saved_tensors
        out = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
        b, t = targets.shape
        for r, at in _blocks(b, ctx.rows, t):
            out[r, at] = block_grad(logits[r, at], targets[r, at], lse[r, at], grad[r, at], ctx.temperature)
        return out, None, None, None, None


STATS = ("entropy", "mean_logit", "correct")


def logits_logps(
    logits: torch.Tensor,
    targets: torch.Tensor,
    temperature: float = 1.0,
    with_stats: bool = True,
    chunk_elements: int | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Log-prob (float32) of `targets` (B, T) under `logits` (B, T, V) divided by `temperature`, and with
    `with_stats` TRL's per-token metric inputs (`STATS`, no gradient), the same numbers as
    `selective_log_softmax` and `logit_stats` on the whole tensor, without their float32 copies of it
    (`LogitsLogps`). A position's target is its own: shift before calling (`token_logps` does)."""
    shape = targets.shape
    if logits.is_contiguous() or logits.dim() == 2:  # one row of every position: blocks span rows
        logits, targets = logits.reshape(1, -1, logits.shape[-1]), targets.reshape(1, -1)
    rows = chunk_rows(logits.shape[-1], logits.device, chunk_elements)
    out = LogitsLogps.apply(logits, targets, temperature, rows, with_stats)
    return out[0].view(shape), {name: x.view(shape) for name, x in zip(STATS, out[1:])}


def shifted_logps(
    logits: torch.Tensor, input_ids: torch.Tensor, temperature: float = 1.0, with_stats: bool = True
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """`token_logps` (and stats) through `logits_logps`: position t scores `input_ids[:, t+1]`, shape
    (B, T-1). The logits' last `K` positions may be all there is (a model called with `logits_to_keep=K`:
    they score the last K-1 tokens). The last position, which scores nothing, is computed against a
    dummy target and dropped: the logits are passed whole, never as a slice (whose backward would
    allocate the whole gradient a second time)."""
    k = logits.shape[1]
    targets = torch.cat([input_ids[:, input_ids.shape[1] - k + 1 :], input_ids[:, :1]], dim=1)
    logps, stats = logits_logps(logits, targets, temperature, with_stats)
    return logps[:, :-1], {name: x[:, :-1] for name, x in stats.items()}


def per_sequence(values: torch.Tensor, seq: torch.Tensor, n_seq: int) -> torch.Tensor:
    """Sum of `values` (N,) per sequence id `seq` (N,) in [0, n_seq): log pi(y|x) per sequence."""
    return values.new_zeros(n_seq).index_add(0, seq, values)
