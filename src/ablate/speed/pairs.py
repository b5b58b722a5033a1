"""Batch layouts for preference pairs, and where each completion token is scored in them.

Two layouts of B pairs `(prompt, chosen, rejected)`, each giving, for every scored completion token,
the flat index of the position that predicts it (`src`, into the batch's `(rows * width)` positions),
the token (`tgt`) and its sequence (`seq`: 0..B-1 chosen, B..2B-1 rejected):

- plain (TRL's): 2B rows `[chosen; rejected]`, each `prompt + completion`, right-padded;
- shared prompt: B rows `prompt + chosen + rejected`, so each prompt is computed once (Wang et al.
  2024, "prefix sharing"). A 4-D mask keeps rejected tokens from seeing chosen ones and position ids
  restart at the prompt's end for rejected, so every rejected token sees exactly the keys, at exactly
  the positions, it sees in its plain row: the same numbers, fewer tokens (P + C + R instead of
  2P + C + R per pair).

As in the plain path, a completion token at a row's position 0 (an empty prompt) has no predictor and
is not scored.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from ablate.data.tokenize import pad


def plain_pairs(rows: list[dict[str, Any]], pad_token_id: int) -> dict[str, torch.Tensor]:
    """TRL's layout: rows 0..B-1 `prompt + chosen`, B..2B-1 `prompt + rejected`."""
    seqs, masks = [], []
    for key in ("chosen_ids", "rejected_ids"):
        for r in rows:
            seqs.append(r["prompt_ids"] + r[key])
            masks.append([0] * len(r["prompt_ids"]) + [1] * len(r[key]))
    return {
        "input_ids": pad(seqs, pad_token_id),
        "attention_mask": pad([[1] * len(s) for s in seqs], 0),
        "completion_mask": pad(masks, 0),
    }


def plain_targets(input_ids: torch.Tensor, completion_mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """`src`/`tgt`/`seq` of the plain layout: position t scores token t+1 where it is a completion token."""
    row, col = completion_mask[:, 1:].bool().nonzero(as_tuple=True)
    return {"src": row * input_ids.shape[1] + col, "tgt": input_ids[row, col + 1], "seq": row}


def shared_prompt_pairs(
    rows: list[dict[str, Any]], pad_token_id: int, with_mask: bool = True
) -> dict[str, torch.Tensor]:
    """The shared-prompt layout: `input_ids`, `position_ids`, a boolean `attention_mask` (B, 1, L, L)
    (True: query may attend to key), `segments` (B, L) (0 prompt, 1 chosen, 2 rejected: the same mask for
    a packed row's FlexAttention), `src`/`tgt`/`seq`, and each row's real `lengths` (the rest pads).
    `with_mask=False` leaves the 4-D mask out."""
    n = len(rows)
    width = max(len(r["prompt_ids"]) + len(r["chosen_ids"]) + len(r["rejected_ids"]) for r in rows)
    ids, pos = (
        torch.full((n, width), pad_token_id, dtype=torch.long),
        torch.zeros((n, width), dtype=torch.long),
    )
    # 0 prompt, 1 chosen, 2 rejected (ablate.speed.packing.Documents)
    segments = torch.zeros((n, width), dtype=torch.long)
    # every query sees itself: padding rows never have an all-masked softmax (NaN would reach the gradients)
    mask = torch.eye(width, dtype=torch.bool).repeat(n, 1, 1, 1) if with_mask else None
    src, tgt, seq, lengths = [], [], [], []
    for b, r in enumerate(rows):
        p, c, rj = len(r["prompt_ids"]), len(r["chosen_ids"]), len(r["rejected_ids"])
        lengths.append(p + c + rj)
        ids[b, : p + c + rj] = torch.tensor(
            r["prompt_ids"] + r["chosen_ids"] + r["rejected_ids"], dtype=torch.long
        )
        pos[b, : p + c] = torch.arange(p + c)
        # rejected continues the prompt, as in its own row
        pos[b, p + c : p + c + rj] = torch.arange(p, p + rj)
        segments[b, p : p + c], segments[b, p + c : p + c + rj] = 1, 2
        if mask is not None:
            causal = torch.ones(p + c + rj, p + c + rj, dtype=torch.bool).tril()
            causal[p + c :, p : p + c] = False  # rejected never sees chosen
            mask[b, 0, : p + c + rj, : p + c + rj] = causal
        for k in range(c):  # chosen token k sits at p + k and is predicted by p + k - 1
            if p + k >= 1:
                src.append(b * width + p + k - 1), tgt.append(r["chosen_ids"][k]), seq.append(b)
        for k in range(rj):  # rejected token k sits at p + c + k; token 0 is predicted by the prompt's end
            if p + k >= 1:
                at = p - 1 if k == 0 else p + c + k - 1
                src.append(b * width + at), tgt.append(r["rejected_ids"][k]), seq.append(n + b)
    as_long = functools.partial(torch.tensor, dtype=torch.long)
    out = {
        "input_ids": ids,
        "position_ids": pos,
        "segments": segments,
        "src": as_long(src),
        "tgt": as_long(tgt),
        "seq": as_long(seq),
        "lengths": as_long(lengths),
    }
    if mask is not None:  # a packed row with a document mask (FlexAttention) needs none: no L x L tensors
        out["attention_mask"] = mask
    return out


def completion_rows(segments: torch.Tensor, lengths: torch.Tensor) -> dict[str, torch.Tensor]:
    """Attention for the packed shared layout one row per completion, as TRL's rows: row b `[prompt |
    chosen]`, row B + b `[prompt | rejected]`, real tokens first (right padding only: causal attention needs
    no mask, and no rejected token sees a chosen one). An `ablate.speed.packing.Unpad` of the packed tokens
    (the pair rows' real tokens, one row after another): `row_mask` (2B, P + max(C, R)), `row_index` (flat
    positions into it that hold a token), `row_source` (the packed token at each: a prompt token in both of
    its rows) and `row_out` (for each packed token, the position whose attention output it takes)."""
    lengths = lengths.tolist()
    chosen, rejected = (segments == 1).sum(1).tolist(), (segments == 2).sum(1).tolist()
    prompts = [n - c - r for n, c, r in zip(lengths, chosen, rejected)]
    n = len(lengths)
    width = max(p + max(c, r) for p, c, r in zip(prompts, chosen, rejected))
    mask = torch.zeros(2 * n, width, dtype=torch.long)
    index, source, out, offset = [], [], [0] * sum(lengths), 0
    for b, (p, c, r) in enumerate(zip(prompts, chosen, rejected)):
        mask[b, : p + c], mask[n + b, : p + r] = 1, 1
        for t in range(p):  # the prompt in both rows; its output from the chosen one's
            index += [b * width + t, (n + b) * width + t]
            source += [offset + t] * 2
            out[offset + t] = b * width + t
        for row, first, count, start in ((b, p, c, p), (n + b, p, r, p + c)):
            for k in range(count):
                index.append(row * width + first + k), source.append(offset + start + k)
                out[offset + start + k] = index[-1]
        offset += p + c + r
    as_long = functools.partial(torch.tensor, dtype=torch.long, device=segments.device)
    return {
        "row_mask": mask.to(segments.device),
        "row_index": as_long(index),
        "row_source": as_long(source),
        "row_out": as_long(out),
    }


def mask_from_segments(segments: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """The shared layout's boolean (B, 1, L, L) mask rebuilt from its `segments` and `lengths` (a batch
    collated without it, for a packed row, scored by a model that takes the 4-D mask instead): causal
    over each row's real tokens, rejected (2) never seeing chosen (1), every query seeing itself."""
    width = segments.shape[1]
    at = torch.arange(width, device=segments.device)
    real = at[None, :] < lengths.to(segments.device)[:, None]
    seg_q, seg_k = segments[:, :, None], segments[:, None, :]
    mask = (
        (at[None, :, None] >= at[None, None, :])
        & real[:, None, :]
        & real[:, :, None]
        & ((seg_k == 0) | (seg_k == seg_q))
    )
    return (mask | torch.eye(width, dtype=torch.bool, device=segments.device)).unsqueeze(1)


def attention_mask_for(mask: torch.Tensor, attn_implementation: str) -> torch.Tensor:
    """The boolean 4-D mask in the form the attention kernel reads: sdpa takes it as is, eager adds it
    to the scores (0 where allowed, the float32 minimum elsewhere)."""
    if attn_implementation == "eager":
        return torch.zeros(mask.shape).masked_fill(~mask, torch.finfo(torch.float32).min)
    return mask
