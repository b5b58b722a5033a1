"""Scoring a GRPO batch without computing its padding: rows of similar length are scored together.

A micro-batch of completions is right-padded to its longest completion (and left-padded to its longest
prompt); with sampled completions that end anywhere between 1 and `max_completion_length` tokens, much
of that rectangle is padding, which a forward and backward pass compute like any other token. Sorting
the rows by length and scoring them in groups, each trimmed to its own longest prompt and completion,
computes (nearly) only real tokens. Each row sees exactly its own tokens at the same positions as in the
whole-batch pass (left padding is masked, position ids come from the mask), so the log-probs are the
same up to float rounding (`tests/unit/test_grpo_generation.py` checks 1e-5 in fp32, and gradients);
masked (padding) positions get log-prob 0.

With `share_prompt` (the default) a micro-batch is instead scored one row per prompt, `[prompt | c_1 |
... | c_k]` (`ablate.speed.groups`), so each prompt is computed once for its group, packed into one row of
real tokens (`ablate.speed.packing`; attention then runs one row per completion, the prompt's keys and
values copied into each) and projected to the vocabulary only at completion positions
(`ablate.losses.logps.completion_logps`): `shared_prompt_logps`, tested equal to the row-per-completion
path in tests/unit/test_grpo_share_prompt.py.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext

import torch
from torch import nn

from ablate.speed.groups import shared_prompt_groups
from ablate.speed.packing import Unpad, packed_inputs, takes_packed
from ablate.speed.pairs import attention_mask_for
from ablate.speed.split import causal_lm, scored_logps, takes_custom_mask

# a forward + backward pass's fixed cost (Python, kernel launches, small-matrix inefficiency), in tokens:
# a group is split off only when it saves more padded tokens than this
GROUP_OVERHEAD_TOKENS = 64


def length_groups(prompt_lengths: list[int], completion_lengths: list[int],
                  overhead: int | None = None) -> list[list[int]]:
    """Row indices split into groups (contiguous in length order) minimising the tokens computed,
    rows x (longest prompt + longest completion) per group, plus `overhead` per group (a small DP;
    default GROUP_OVERHEAD_TOKENS)."""
    overhead = GROUP_OVERHEAD_TOKENS if overhead is None else overhead
    order = sorted(range(len(prompt_lengths)), key=lambda i: (prompt_lengths[i] + completion_lengths[i], i))
    n = len(order)
    best = [0.0] + [float("inf")] * n  # best[j]: cost of scoring order[:j]
    cut = [0] * (n + 1)
    for j in range(1, n + 1):
        p = c = 0
        for i in range(j - 1, -1, -1):  # group order[i:j]
            p, c = max(p, prompt_lengths[order[i]]), max(c, completion_lengths[order[i]])
            cost = best[i] + (j - i) * (p + max(c, 1)) + overhead
            if cost <= best[j]:  # ties: the larger group
                best[j], cut[j] = cost, i
    groups, j = [], n
    while j > 0:
        groups.append(order[cut[j]:j])
        j = cut[j]
    return groups[::-1]


def trim_rows(batch: dict[str, torch.Tensor], rows: torch.Tensor) -> dict[str, torch.Tensor]:
    """The prompt/completion tensors of `rows`, cut to their longest prompt (left-padded: keep the end)
    and longest completion (right-padded: keep the start)."""
    p_mask, c_mask = batch["prompt_mask"][rows], batch["completion_mask"][rows]
    p = max(int(p_mask.sum(1).max()), 1)
    c = max(int(c_mask.sum(1).max()), 1)
    return {"prompt_ids": batch["prompt_ids"][rows, -p:], "prompt_mask": p_mask[:, -p:],
            "completion_ids": batch["completion_ids"][rows, :c], "completion_mask": c_mask[:, :c]}


def scatter_rows(parts: list[torch.Tensor], groups: list[list[int]], width: int) -> torch.Tensor:
    """Per-group (rows, <= width) tensors back into one (all rows, width) tensor in the batch's row
    order, zero-padded on the right (autograd flows through)."""
    padded = torch.cat([torch.nn.functional.pad(t, (0, width - t.size(1))) for t in parts])
    order = torch.tensor([i for g in groups for i in g], device=padded.device)
    return padded[torch.argsort(order)]


def takes_shared_prompt(model: nn.Module, batch: dict[str, torch.Tensor]) -> bool:
    """Whether `shared_prompt_logps` can score `batch` with `model` (not wrapped: the split and the
    custom mask bypass a wrapper's forward): a supported family with a mask-taking attention, no peft
    prompt learning, every prompt at least one token long."""
    return takes_custom_mask(model) and bool(batch["prompt_mask"].sum(1).min() >= 1)


def shared_prompt_logps(
    model: nn.Module, batch: dict[str, torch.Tensor], temperature: float, pad_token_id: int,
    with_entropy: bool = False, autocast: AbstractContextManager | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log-probs (and entropies) of `batch`'s completions at `temperature`, (rows, width) as
    `completion_ids`, computed with each prompt once per group; 0 at masked (padding) positions."""
    packed = takes_packed(model)
    where = shared_prompt_groups(batch["prompt_ids"], batch["prompt_mask"], batch["completion_ids"],
                                 batch["completion_mask"], pad_token_id, with_mask=not packed)
    inputs = {"input_ids": where["input_ids"], "position_ids": where["position_ids"]}
    src = where["src"]
    if packed:  # the real tokens (each prompt once) through the projections; attention one row per completion:
        # packed_inputs' 4-D mask is made from row_mask (that layout's), and Unpad puts the tokens there
        inputs, src = packed_inputs({**inputs, "attention_mask": where["row_mask"]}, src, where["lengths"])
        rows, width = where["row_mask"].shape
        inputs["unpad"] = Unpad(where["row_index"], rows, width, where["row_source"], where["row_out"])
    else:  # one row per prompt, a 4-D mask keeps each completion to the prompt and itself
        mask = attention_mask_for(where["attention_mask"], causal_lm(model).config._attn_implementation)
        inputs["attention_mask"] = mask
    with autocast or nullcontext():  # the head only where a completion token is scored
        token, stats = scored_logps(model, inputs, src, where["tgt"], temperature=temperature)
    shape = batch["completion_ids"].shape
    at = (where["row"], where["col"])
    logps = token.new_zeros(shape, dtype=token.dtype).index_put(at, token)
    return logps, (stats["entropy"].new_zeros(shape).index_put(at, stats["entropy"]) if with_entropy else None)
