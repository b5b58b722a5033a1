"""Scoring a GRPO batch without computing its padding: rows of similar length are scored together.

A micro-batch of completions is right-padded to its longest completion (and left-padded to its longest
prompt); with sampled completions that end anywhere between 1 and `max_completion_length` tokens, much
of that rectangle is padding, which a forward and backward pass compute like any other token. Sorting
the rows by length and scoring them in groups, each trimmed to its own longest prompt and completion,
computes (nearly) only real tokens. Each row sees exactly its own tokens at the same positions as in the
whole-batch pass (left padding is masked, position ids come from the mask), so the log-probs are the
same up to float rounding (`tests/unit/test_grpo_generation.py` checks 1e-5 in fp32, and gradients);
masked (padding) positions get log-prob 0.

With `grpo_group_rows` (the default) a micro-batch is instead scored one row per prompt, `[prompt | c_1 |
... | c_k]` (`ablate.speed.groups`), so each prompt is computed once for its group, packed into one row of
real tokens (`padding_free`: `ablate.speed.packing`; attention then runs one row per completion, the
prompt's keys and values copied into each) and projected to the vocabulary only at completion positions
(`completion_only_logits`: `ablate.losses.logps.completion_logps`): `shared_prompt_logps`, tested equal to
the row-per-completion path in tests/unit/test_grpo_share_prompt.py.

The trainers call one function per batch, which follows the run's speed plan (ablate.speed.plan):
`group_logps` (GRPO) and `pair_logps` (DPO). Their plain paths, with every speed path off, stay in the
trainers (`GRPOTrainer._rows_logps`, `DPOTrainer._sequence_logps`) as the reference these equal.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext

import torch
from torch import nn

from ablate.speed.groups import shared_prompt_groups
from ablate.speed.packing import Unpad, packed_inputs, packed_kernel, rows_mask
from ablate.speed.pairs import attention_mask_for, completion_rows, mask_from_segments, plain_targets
from ablate.speed.plan import SpeedPlan
from ablate.speed.split import scored_logps

# (model, batch, with_entropy) -> (log-probs, entropies): a trainer's plain one-forward scorer of a batch
RowsLogps = Callable[[nn.Module, dict[str, torch.Tensor], bool], tuple[torch.Tensor, torch.Tensor | None]]

# a forward + backward pass's fixed cost (Python, kernel launches, small-matrix inefficiency), in tokens:
# a group is split off only when it saves more padded tokens than this
GROUP_OVERHEAD_TOKENS = 64


def length_groups(
    prompt_lengths: list[int], completion_lengths: list[int], overhead: int | None = None
) -> list[list[int]]:
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
        groups.append(order[cut[j] : j])
        j = cut[j]
    return groups[::-1]


def trim_rows(batch: dict[str, torch.Tensor], rows: torch.Tensor) -> dict[str, torch.Tensor]:
    """The prompt/completion tensors of `rows`, cut to their longest prompt (left-padded: keep the end)
    and longest completion (right-padded: keep the start)."""
    p_mask, c_mask = batch["prompt_mask"][rows], batch["completion_mask"][rows]
    p = max(int(p_mask.sum(1).max()), 1)
    c = max(int(c_mask.sum(1).max()), 1)
    return {
        "prompt_ids": batch["prompt_ids"][rows, -p:],
        "prompt_mask": p_mask[:, -p:],
        "completion_ids": batch["completion_ids"][rows, :c],
        "completion_mask": c_mask[:, :c],
    }


def scatter_rows(parts: list[torch.Tensor], groups: list[list[int]], width: int) -> torch.Tensor:
    """Per-group (rows, <= width) tensors back into one (all rows, width) tensor in the batch's row
    order, zero-padded on the right (autograd flows through)."""
    padded = torch.cat([torch.nn.functional.pad(t, (0, width - t.size(1))) for t in parts])
    order = torch.tensor([i for g in groups for i in g], device=padded.device)
    return padded[torch.argsort(order)]


def shared_prompt_logps(
    model: nn.Module,
    batch: dict[str, torch.Tensor],
    plan: SpeedPlan,
    temperature: float,
    pad_token_id: int,
    with_entropy: bool = False,
    autocast: AbstractContextManager | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log-probs (and entropies) of `batch`'s completions at `temperature`, (rows, width) as
    `completion_ids`, computed with each prompt once per group; 0 at masked (padding) positions.
    Packed with the plan's `padding_free`, the head split off with its `completion_only_logits`."""
    packed = plan.on("padding_free")
    kernel = packed_kernel(batch["prompt_ids"].device) if packed else None
    where = shared_prompt_groups(
        batch["prompt_ids"],
        batch["prompt_mask"],
        batch["completion_ids"],
        batch["completion_mask"],
        pad_token_id,
        with_mask=not packed,
    )
    inputs = {"input_ids": where["input_ids"], "position_ids": where["position_ids"]}
    src = where["src"]
    if kernel == "padded":
        # the real tokens (each prompt once) through the projections; attention one row per completion:
        # packed_inputs' 4-D mask is made from row_mask (that layout's), and Unpad puts the tokens there
        inputs, src = packed_inputs(
            {**inputs, "attention_mask": where["row_mask"]}, src, where["lengths"], kernel=kernel
        )
        rows, width = where["row_mask"].shape
        causal = inputs["unpad"].causal  # rows_mask found the rows' real tokens first (and them long)
        inputs["unpad"] = Unpad(
            where["row_index"], rows, width, where["row_source"], where["row_out"], causal
        )
    elif packed:  # the packed row itself, its document mask keeping each completion to the prompt and itself
        inputs, src = packed_inputs(inputs, src, where["lengths"], where["segment"], kernel)
    else:  # one row per prompt, a 4-D mask keeps each completion to the prompt and itself
        inputs["attention_mask"] = attention_mask_for(where["attention_mask"], plan.setting.attention)
    with autocast or nullcontext():  # the head only where a completion token is scored
        token, stats = scored_logps(
            model, inputs, src, where["tgt"], split=plan.on("completion_only_logits"), temperature=temperature
        )
    shape = batch["completion_ids"].shape
    at = (where["row"], where["col"])
    logps = token.new_zeros(shape, dtype=token.dtype).index_put(at, token)
    return logps, (
        stats["entropy"].new_zeros(shape).index_put(at, stats["entropy"]) if with_entropy else None
    )


def group_logps(
    model: nn.Module,
    batch: dict[str, torch.Tensor],
    plan: SpeedPlan,
    rows: RowsLogps,
    temperature: float,
    pad_token_id: int,
    with_entropy: bool = False,
    autocast: AbstractContextManager | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """GRPO's per-token log-probs (and entropies) of a batch by the plan: one row per prompt group
    (`grpo_group_rows`), else rows in groups of similar length (`length_groups`), each scored by `rows`
    (the trainer's plain scorer), else `rows` on the whole batch. `autocast`: the policy's (the split
    calls its backbone around model.forward, where accelerate puts it)."""
    if plan.on("grpo_group_rows"):
        if bool(batch["prompt_mask"].sum(1).min() >= 1):
            return shared_prompt_logps(model, batch, plan, temperature, pad_token_id, with_entropy, autocast)
        # an empty prompt has no token to predict its completions' first: such a batch goes one row per
        # completion
        warnings.warn(
            "a batch with an empty prompt is scored one row per completion (not grpo_group_rows)",
            stacklevel=2,
        )
    if not plan.on("length_groups"):
        return rows(model, batch, with_entropy)
    groups = length_groups(batch["prompt_mask"].sum(1).tolist(), batch["completion_mask"].sum(1).tolist())
    if len(groups) == 1:  # the batch is its own best group: the plain pass
        return rows(model, batch, with_entropy)
    device = batch["prompt_ids"].device
    parts = [rows(model, trim_rows(batch, torch.tensor(g, device=device)), with_entropy) for g in groups]
    width = batch["completion_ids"].size(1)
    logps = scatter_rows([lp for lp, _ in parts], groups, width)
    entropy = scatter_rows([e for _, e in parts], groups, width) if with_entropy else None
    return logps, entropy


def pair_logps(
    model: nn.Module, batch: dict[str, torch.Tensor], plan: SpeedPlan
) -> tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor]:
    """DPO: log-probs of the scored completion tokens of `[chosen; rejected]` by the plan, their
    `entropy`/`mean_logit`/`correct` stats and each token's sequence `seq` (0..B-1 chosen, B..2B-1
    rejected): one row per pair (`dpo_pair_rows`: the collator built `shared_*`, ablate.speed.pairs)
    or TRL's rows, packed (`padding_free`), the head only at scored tokens (`completion_only_logits`).
    The caller supplies autocast (the split calls the backbone around model.forward)."""
    segments, rows = None, None
    if plan.on("dpo_pair_rows"):
        inputs = {"input_ids": batch["shared_input_ids"], "position_ids": batch["shared_position_ids"]}
        padded = plan.on("padding_free") and packed_kernel(batch["shared_input_ids"].device) == "padded"
        if padded:  # long rows attend one row per completion, causally (no mask): see below
            rows = completion_rows(batch["shared_segments"], batch["shared_lengths"])
            if rows_mask(rows["row_mask"]) is not None:
                rows = None  # short rows: the pair rows' 4-D mask, as measured (eager kernel in bf16)
        if rows is None and (not plan.on("padding_free") or padded):
            # the 4-D mask; absent from a batch collated for a packed row's document mask: rebuilt then
            mask = batch.get("shared_attention_mask")
            if mask is None:
                mask = mask_from_segments(batch["shared_segments"], batch["shared_lengths"])
            inputs["attention_mask"] = attention_mask_for(mask, plan.setting.attention).to(
                batch["shared_input_ids"].device
            )
        where = {k: batch[f"shared_{k}"] for k in ("src", "tgt", "seq")}
        lengths, segments = batch["shared_lengths"], batch["shared_segments"]
    else:
        inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
        where = plain_targets(batch["input_ids"], batch["completion_mask"])
        lengths = batch["attention_mask"].sum(-1)  # rows are right-padded
    if rows is not None:  # one row of real tokens; attention on TRL's rows, causal: no [width, width] mask
        inputs, where["src"] = packed_inputs(
            {**inputs, "attention_mask": rows["row_mask"]}, where["src"], lengths, kernel="padded"
        )
        inputs["unpad"] = Unpad(
            rows["row_index"], *rows["row_mask"].shape, rows["row_source"], rows["row_out"], causal=True
        )
    elif plan.on("padding_free"):  # one row of real tokens (ablate.speed.packing)
        inputs, where["src"] = packed_inputs(inputs, where["src"], lengths, segments)
    token, stats = scored_logps(
        model, inputs, where["src"], where["tgt"], split=plan.on("completion_only_logits")
    )
    return token, stats, where["seq"]
