"""Per-token log-probs from logits: the one place model outputs become loss inputs."""

from __future__ import annotations

import torch
import torch.utils.checkpoint


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


# Logits of at most this many elements exist at once in `completion_logps` (64 MB in float32): a
# [tokens, vocab] tensor dominates a step's memory at 50k-150k vocabularies.
LOGITS_CHUNK_ELEMENTS = 1 << 24


def completion_logps(
    hidden: torch.Tensor,
    lm_head: torch.nn.Module,
    targets: torch.Tensor,
    chunk_elements: int = LOGITS_CHUNK_ELEMENTS,
    temperature: float = 1.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Log-prob of `targets[i]` given `hidden[i]` (N, H): `lm_head` applied only to the N positions
    that score a completion token (prompt logits are never used), in chunks of rows. With a
    `temperature` (GRPO scores at its sampling temperature) the logits are divided by it first, and the
    stats are those of the scaled distribution (TRL's entropy).

    Returns (logps (N,), stats) where stats are TRL's per-token metrics inputs, without gradient:
    `entropy`, `mean_logit` (the vocabulary-mean logit) and `correct` (argmax == target).
    With more than one chunk each chunk is checkpointed: its logits are recomputed in backward instead
    of kept, so memory holds one chunk's logits, never all of them. The numbers are the plain path's
    (`token_logps` on the full logits), as tested.
    """
    vocab = lm_head.weight.shape[0]
    rows = max(1, chunk_elements // vocab)
    chunks = [(hidden[i:i + rows], targets[i:i + rows]) for i in range(0, hidden.shape[0], rows)]
    outs = []
    for h, t in chunks:
        if len(chunks) > 1 and torch.is_grad_enabled():
            outs.append(torch.utils.checkpoint.checkpoint(_chunk_logps, lm_head, h, t, temperature,
                                                          use_reentrant=False))
        else:
            outs.append(_chunk_logps(lm_head, h, t, temperature))
    if not outs:  # no completion token scored: an empty, still-connected result
        outs.append(_chunk_logps(lm_head, hidden[:0], targets[:0], temperature))
    logps, entropy, mean_logit, correct = (torch.cat(x) for x in zip(*outs))
    return logps, {"entropy": entropy, "mean_logit": mean_logit, "correct": correct}


def _chunk_logps(
    lm_head: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    logits = lm_head(hidden)  # the module call, so autocast treats it as the model's own forward does
    if temperature != 1.0:  # DPO's numbers stay those of the unscaled logits, bit for bit
        logits = logits / temperature
    logps = selective_log_softmax(logits, targets)
    return (logps, *logit_stats(logits, targets))


# Rows of logits whose statistics are computed at once (4 MB in float32): the float32 temporaries
# (log-softmax, its exp, their product) of one block exist at a time, not those of a whole chunk, which
# would come on top of the step's activations at its memory peak, the end of the forward pass.
STATS_BLOCK_ELEMENTS = 1 << 20


@torch.no_grad()
def logit_stats(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per position: entropy of the float32 softmax, vocabulary-mean logit, argmax == target.
    Computed in blocks of rows (each row's statistics are its own: the same numbers)."""
    shape, vocab = logits.shape[:-1], logits.shape[-1]
    flat, flat_targets = logits.reshape(-1, vocab), targets.reshape(-1)
    rows = max(1, STATS_BLOCK_ELEMENTS // vocab)
    blocks = [_block_stats(flat[i:i + rows], flat_targets[i:i + rows]) for i in range(0, flat.shape[0], rows)]
    if not blocks:
        blocks = [_block_stats(flat, flat_targets)]
    return tuple(torch.cat(x).reshape(shape) for x in zip(*blocks))  # type: ignore[return-value]


def _block_stats(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    f = logits.float()
    logp = torch.log_softmax(f, dim=-1)
    return -(logp.exp() * logp).sum(-1), f.mean(-1), logits.argmax(-1) == targets


def per_sequence(values: torch.Tensor, seq: torch.Tensor, n_seq: int) -> torch.Tensor:
    """Sum of `values` (N,) per sequence id `seq` (N,) in [0, n_seq): log pi(y|x) per sequence."""
    return values.new_zeros(n_seq).index_add(0, seq, values)
