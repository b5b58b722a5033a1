"""The shared-prompt layout of a GRPO micro-batch: one row per prompt, `[prompt | c_1 | ... | c_k]`.

A GRPO micro-batch holds whole groups, k completions sampled from the same prompt. Scored one row per
completion (`[left-padded prompt | completion]`, TRL's layout), a prompt of P tokens goes through the
model k times. Here each distinct prompt is one row followed by its completions' real tokens, with a
boolean 4-D mask in which completion i sees the prompt and its own earlier tokens only, and position
ids that continue from the prompt's end for every completion (P, P+1, ...: what its own row gives it,
where position ids come from the mask under left padding). So every completion token sees exactly the
keys, at exactly the positions, it sees in its own row: the same numbers, P + sum(C_i) tokens instead
of k·P + sum(C_i). The DPO version (two completions) is `ablate.speed.pairs.shared_prompt_pairs`.

Consecutive rows with the same real prompt tokens form a group (the group size is not assumed).
Completion padding (completion_mask 0) is left out of the rows; `row`/`col` say where each scored
token sits in the `(rows, width)` layout of `completion_ids`, so results can be put back there.

The 4-D mask makes a row's attention cost grow with the square of its length (P + k·C), k times more
than the k rows of TRL's layout when completions are long; a padding-free forward
(`ablate.speed.packing`) does not need it: the packed tokens (each prompt once) go through the
projections, and attention runs on TRL's layout, one row `[prompt | c_i]` per completion, with the
prompt's keys and values copied into each of its rows (`row_index`/`row_source`/`row_out`, an
`ablate.speed.packing.Unpad`, and `row_mask`, that layout's 2-D mask).
"""

from __future__ import annotations

import torch


def prompt_groups(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> list[list[int]]:
    """Row indices in runs of consecutive rows with equal real (unmasked) prompt tokens."""
    groups: list[list[int]] = []
    last: list[int] | None = None
    for r, (ids, mask) in enumerate(zip(prompt_ids.tolist(), prompt_mask.tolist())):
        real = [t for t, m in zip(ids, mask) if m]
        if real != last:
            groups.append([])
            last = real
        groups[-1].append(r)
    return groups


def shared_prompt_groups(
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    pad_token_id: int,
    with_mask: bool = True,
) -> dict[str, torch.Tensor]:
    """The shared-prompt layout of left-padded prompts and right-padded completions (rows, ·): one row
    per prompt group, with `input_ids`, `position_ids` (G, L), a boolean `attention_mask` (G, 1, L, L)
    (True: query may attend to key), `segment` (G, L) (0: the prompt, k: the group's k-th completion;
    the same mask for ablate.speed.packing.Documents), each row's real `lengths` (G,) (the rest pads), and per
    scored completion token: `src` (flat index into G*L of the position that predicts it), `tgt` (the token),
    `row`/`col` (its place in `completion_ids`). Every prompt needs at least one token (its last one predicts
    each completion's first).

    For attention one row per completion, over the packed tokens (the groups' rows' real tokens, one
    row after another): `row_mask` (rows, P + C) (the prompt, then the completion, then padding: right
    padding only, so causal attention needs no mask: ablate.speed.packing.rows_mask), `row_index` (flat
    positions into it that hold a token), `row_source` (the packed token at each) and `row_out` (for each
    packed token, the position whose attention output it takes).
    `with_mask=False` leaves out the 4-D `attention_mask` (large for long rows; the packed path does not
    use it)."""
    groups = prompt_groups(prompt_ids, prompt_mask)
    p_real = [
        [t for t, m in zip(ids, mask) if m] for ids, mask in zip(prompt_ids.tolist(), prompt_mask.tolist())
    ]
    c_cols = [[j for j, m in enumerate(mask) if m] for mask in completion_mask.tolist()]
    c_ids = completion_ids.tolist()
    if any(not p_real[g[0]] for g in groups):
        raise ValueError("shared_prompt_groups: an empty prompt cannot predict its completions' first token")
    lengths = [len(p_real[g[0]]) + sum(len(c_cols[r]) for r in g) for g in groups]
    width = max(lengths)
    n = len(groups)
    ids = torch.full((n, width), pad_token_id, dtype=torch.long)
    pos = torch.zeros((n, width), dtype=torch.long)
    segment = torch.zeros((n, width), dtype=torch.long)  # 0: the prompt, k: the group's k-th completion
    # every query sees itself: padding rows never have an all-masked softmax (NaN would reach the gradients)
    mask = torch.eye(width, dtype=torch.bool).repeat(n, 1, 1, 1) if with_mask else None
    src, tgt, row, col = [], [], [], []
    # one row per completion: prompt width pw (left-padded), completion width cw (right-padded)
    pw, cw = max(len(x) for x in p_real), max(max(len(x) for x in c_cols), 1)
    row_index, row_source, row_out = [], [], [0] * sum(lengths)
    offset = 0  # the group row's first token in the packed row
    for b, g in enumerate(groups):
        p = len(p_real[g[0]])
        ids[b, :p] = torch.tensor(p_real[g[0]])
        pos[b, :p] = torch.arange(p)
        if mask is not None:
            mask[b, 0, :p, :p] = torch.ones(p, p, dtype=torch.bool).tril()
        for t in range(p):  # the prompt in each of its completions' rows; its output from the first's
            row_index += [r * (pw + cw) + t for r in g]
            row_source += [offset + t] * len(g)
            row_out[offset + t] = g[0] * (pw + cw) + t
        start = p
        for k_th, r in enumerate(g, start=1):
            cols = c_cols[r]
            c, end = len(cols), start + len(cols)
            segment[b, start:end] = k_th
            ids[b, start:end] = torch.tensor([c_ids[r][j] for j in cols], dtype=torch.long)
            pos[b, start:end] = torch.arange(p, p + c)  # continues the prompt, as in the completion's own row
            if mask is not None:
                mask[b, 0, start:end, :p] = True  # the prompt
                # itself, causally
                mask[b, 0, start:end, start:end] = torch.ones(c, c, dtype=torch.bool).tril()
            # token k sits at start + k; the first is predicted by the prompt's end
            for k, j in enumerate(cols):
                src.append(b * width + (p - 1 if k == 0 else start + k - 1))
                tgt.append(c_ids[r][j]), row.append(r), col.append(j)
                row_index.append(r * (pw + cw) + p + j), row_source.append(offset + start + k)
                row_out[offset + start + k] = row_index[-1]
            start = end
        offset += lengths[b]
    row_mask = torch.zeros(len(c_cols) * (pw + cw), dtype=torch.long)
    row_mask[torch.tensor(row_index, dtype=torch.long)] = 1
    out = {"input_ids": ids, "position_ids": pos, "segment": segment, "row_mask": row_mask.view(-1, pw + cw)}
    flat = dict(lengths=lengths, src=src, tgt=tgt, row=row, col=col, row_index=row_index)
    flat.update(row_source=row_source, row_out=row_out)
    out.update({k: torch.tensor(v, dtype=torch.long) for k, v in flat.items()})
    if mask is not None:
        out["attention_mask"] = mask
    return {k: v.to(prompt_ids.device) for k, v in out.items()}
