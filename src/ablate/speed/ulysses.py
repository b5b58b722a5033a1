"""Sequence parallelism (DeepSpeed-Ulysses: Jacobs et al. 2023): each rank of a group of N holds 1/N of
every sequence through the decoder layers; attention exchanges sequence shards for head shards.

`distributed.sequence_parallel=N` splits the world into groups of N consecutive ranks (a data-parallel x
sequence-parallel mesh: ranks 0..N-1 are group 0, and so on). The ranks of a group draw the same batches
(`share_batches`: the data loader shards over the groups, not the ranks) and run the same forward on them,
except that between the embeddings and the final norm each holds only its contiguous 1/N of the
positions (`Ulysses`, forward hooks on the model's own modules: nothing of the model's code is copied):

    embeddings [B, T, h] ─ pad T to a multiple of N, keep my chunk ─> [B, T/N, h]
    every decoder layer: q, k, v of my chunk, all heads   [B, H, T/N, d]
        all-to-all ──> all positions, my heads            [B, H/N, T, d]   the model's own attention
        all-to-all <── its output, back to my positions   [B, T/N, H, d]   kernel (sdpa, eager, packed)
    final norm ─ all-gather ─> [B, T, h]: the LM head, the log-probs and the loss run unchanged
    (or, where the trainer scores tokens through ablate.speed.split.scored_logps with the chunked head:
    SFT, DPO, GRPO, no gather: the head projects my positions' tokens only, and the [scored tokens] log-probs
    and their stats are summed over the group: `Ulysses.scoring_locally`, `Shard.scores`)

Attention sees every position of its heads with the model's own mask, position ids and kernel, so the
numbers are the one-process forward's up to float summation order (tested to 1e-5 in float32:
tests/unit/test_ulysses.py; whole runs: tests/slow/test_sequence_parallel.py). What each rank keeps for the
backward is the decoder's activations of T/N positions (the part that grows with the sequence).

The gradient: every rank of a group computes the same loss from the same gathered hidden states, so the
all-gather's backward sums the group's (equal) gradients and keeps this rank's chunk: the group's
gradients together are N times one process's, and DDP's (or FSDP's) average over the world's ranks,
N per group, makes them the data-parallel average. Trainer's token counts (which count a group's batch once
per rank, N times) cancel the same way; the logged loss and gradient norm are the one-process run's.

Departures from the paper: heads need not divide by N (DeepSpeed's later "uneven heads"): rank j gets
`ceil` or `floor` of H/N query heads and the key/value heads those need (grouped-query attention: a
key/value head is sent to each rank whose query heads read it; where a rank's heads cut a group, the
kernel gets them expanded). Where the trainer scores through the chunked head (SFT, DPO, GRPO), each
rank projects only its own positions, so neither the head's matmuls nor the hidden states it keeps for
the backward are repeated on every rank; other trainers (distillation, KTO, reward models) get the
gathered hidden states and project every position on every rank.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.nn.functional import all_reduce
from transformers import AttentionInterface
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.llama.modeling_llama import eager_attention_forward

from ablate.errors import ConfigError
from ablate.speed.head import completion_logps
from ablate.speed.split import PACKED_SDPA, PLAIN_HEAD_MODELS, SEQUENCE_SPLITS, causal_lm

PREFIX = "ablate_ulysses_"  # registered attention name: PREFIX + the kernel it wraps
# kernels whose inputs are [B, heads, T, d] and whose output is [B, T, heads, d] (transformers' contract)
WRAPPABLE = frozenset({"sdpa", "eager", PACKED_SDPA, "flash_attention_2", "flash_attention_3"})


@dataclass(frozen=True)
class Mesh:
    """This rank's place in the data-parallel x sequence-parallel mesh: `size` ranks per sequence group,
    `rank` within it, `group` its process group; `dp_rank` of `dp_size` groups."""

    size: int
    rank: int
    group: Any
    dp_rank: int
    dp_size: int

    @classmethod
    def of(cls, size: int) -> Mesh:
        """The mesh of this process (every rank calls it: creating the groups is a collective)."""
        world = dist.get_world_size() if dist.is_initialized() else 1
        if size > world or world % size:
            raise ConfigError(
                f"distributed.sequence_parallel={size}: needs a world of a multiple of {size} ranks, this "
                f"job has {world} (torchrun --nproc_per_node={size})"
            )
        rank = dist.get_rank()
        mine = None
        for start in range(0, world, size):  # every rank creates every group, in the same order
            group = dist.new_group(list(range(start, start + size)))
            if start <= rank < start + size:
                mine = group
        return cls(size, rank % size, mine, rank // size, world // size)

    def share_batches(self, loader: Any) -> Any:
        """Make accelerate's prepared `loader` give every rank of a group the same batches: it shards over
        the `dp_size` groups (as accelerate does for context-parallel ranks) instead of the ranks."""
        from accelerate.data_loader import BatchSamplerShard

        shard = getattr(loader, "batch_sampler", None)
        if not isinstance(shard, BatchSamplerShard):
            raise ConfigError(
                "distributed.sequence_parallel: the data loader is not sharded by batch (an iterable "
                f"dataset?: {type(shard).__name__}); the ranks of a sequence group must draw the same rows"
            )
        shard.num_processes, shard.process_index = self.dp_size, self.dp_rank
        return loader


def split(count: int, parts: int) -> list[tuple[int, int]]:
    """`count` heads as `parts` contiguous ranges, the first `count % parts` one larger."""
    base, extra = divmod(count, parts)
    starts = [j * base + min(j, extra) for j in range(parts + 1)]
    return list(zip(starts[:-1], starts[1:]))


class _AllToAll(torch.autograd.Function):
    """all_to_all_single of a flat tensor with per-rank sizes; its backward is the reverse exchange."""

    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, out_sizes: list[int], in_sizes: list[int], group: Any
    ) -> torch.Tensor:
        ctx.sizes, ctx.group = (out_sizes, in_sizes), group
        out = x.new_empty(sum(out_sizes))
        dist.all_to_all_single(out, x.contiguous(), out_sizes, in_sizes, group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        out_sizes, in_sizes = ctx.sizes
        back = grad.new_empty(sum(in_sizes))
        dist.all_to_all_single(back, grad.contiguous(), in_sizes, out_sizes, group=ctx.group)
        return back, None, None, None


class _Gather(torch.autograd.Function):
    """The group's chunks of dim 1 concatenated; backward: the gradients summed over the group (each rank
    computed the same loss from the gathered tensor), this rank's chunk kept (see the module docstring)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, mesh: Mesh) -> torch.Tensor:
        ctx.mesh, ctx.length = mesh, x.shape[1]
        parts = [torch.empty_like(x) for _ in range(mesh.size)]
        dist.all_gather(parts, x.contiguous(), group=mesh.group)
        return torch.cat(parts, dim=1)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.mesh.group)
        return grad.narrow(1, ctx.mesh.rank * ctx.length, ctx.length), None


class _Grouped:
    """The attention module as the kernel sees it with its key/value heads already one per query head."""

    num_key_value_groups = 1

    def __init__(self, module: nn.Module) -> None:
        self._module = module

    def __getattr__(self, name: str) -> Any:
        return getattr(self._module, name)


@dataclass
class Shard:
    """One forward's split: the real `length` T, padded to `padded` (a multiple of N); each decoder layer
    gets it as the `sequence_parallel` keyword, which reaches the attention function (and is kept with a
    checkpointed layer's inputs, so its recompute exchanges the same way)."""

    plan: Ulysses
    length: int
    padded: int
    rope: Any = None  # this rank's chunk of the rotary embeddings, made at the first layer

    def local(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's chunk of dim 1 (after padding it to `padded` with zeros)."""
        if self.padded > self.length:
            x = nn.functional.pad(x, (0, 0) * (x.dim() - 2) + (0, self.padded - self.length))
        n = self.padded // self.plan.mesh.size
        return x.narrow(1, self.plan.mesh.rank * n, n)

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        return _Gather.apply(x, self.plan.mesh)[:, : self.length]

    def scores(
        self, hidden: torch.Tensor, head: nn.Linear, src: torch.Tensor, tgt: torch.Tensor, temperature: float
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """`completion_logps` of tokens `tgt` at flat positions `src` of the whole [B, T] forward, from this
        rank's final hidden states `hidden` [B, T/N, h]: the head projects the positions this rank holds,
        and the group's log-probs and stats are summed (each position is one rank's)."""
        mesh = self.plan.mesh
        n = self.padded // mesh.size
        row, pos = src // self.length, src % self.length
        mine = ((pos >= mesh.rank * n) & (pos < (mesh.rank + 1) * n)).nonzero().squeeze(1)
        local = row[mine] * n + pos[mine] - mesh.rank * n
        logps, stats = completion_logps(hidden.flatten(0, 1)[local], head, tgt[mine], temperature=temperature)
        # torch's all_reduce sums the gradients in backward too (each rank computed the same loss from the
        # sum: `_Gather`'s convention)
        whole = all_reduce(logps.new_zeros(src.shape[0]).index_put((mine,), logps), group=mesh.group)
        names = list(stats)  # the stats (no gradient) in one collective
        parts = torch.zeros(len(names), src.shape[0], dtype=torch.float32, device=logps.device)
        parts[:, mine] = torch.stack([stats[k].float() for k in names])
        dist.all_reduce(parts, group=mesh.group)
        return whole, {k: part.to(stats[k].dtype) for k, part in zip(names, parts)}

    def attend(
        self,
        kernel: Callable[..., Any],
        module: nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: Any,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, None]:
        p, me = self.plan, self.plan.mesh.rank
        q = p.to_heads(query, p.q_ranges)[:, :, : self.length]
        k = p.to_heads(key, p.kv_ranges)[:, :, : self.length]
        v = p.to_heads(value, p.kv_ranges)[:, :, : self.length]
        if p.expand is not None:  # my query heads cut a key/value group: one key/value head per query head
            k, v, module = k[:, p.expand], v[:, p.expand], _Grouped(module)
        out, _ = kernel(module, q, k, v, attention_mask, **kwargs)  # [B, T, my heads, d]
        out = nn.functional.pad(out, (0, 0, 0, 0, 0, self.padded - self.length))
        return p.to_positions(out, self.padded // p.mesh.size, p.q_ranges[me]), None


class Ulysses:
    """A model's decoder split over a sequence group: hooks on its backbone (decide whether a forward is
    split: no KV cache, i.e. training and scoring, not generation), its decoder layers (cut the hidden
    states and rotary embeddings to this rank's chunk) and its final norm (gather them), and its attention
    switched to `PREFIX + kernel`."""

    def __init__(self, model: nn.Module, mesh: Mesh) -> None:
        lm = causal_lm(model)
        config = lm.config
        self.backbone = getattr(lm, lm.base_model_prefix)
        self.mesh, self.config = mesh, config
        heads, kv = config.num_attention_heads, config.num_key_value_heads or config.num_attention_heads
        groups = heads // kv
        self.q_ranges = split(heads, mesh.size)
        # the key/value heads each rank's query heads read
        self.kv_ranges = [(a // groups, -(-b // groups)) for a, b in self.q_ranges]
        a, b = self.q_ranges[mesh.rank]
        lo = self.kv_ranges[mesh.rank][0]
        whole = (
            a % groups == 0 and b % groups == 0
        )  # my query heads hold whole groups: the kernel groups them
        self.expand = None if whole else torch.tensor([(h // groups) - lo for h in range(a, b)])
        self.shard: Shard | None = None
        self.forwards = 0  # forwards split so far (the run's log says how many)
        self.local = False  # `scoring_locally`: the final norm keeps this rank's positions (no gather)
        self.scored: Shard | None = None  # the split of the forward whose hidden states stayed local
        self.scored_forwards = 0  # of `forwards`, those scored on this rank's positions only
        # what ablate.speed.split.scored_logps finds, however the model is wrapped
        SEQUENCE_SPLITS[lm] = self
        self.handles = [
            self.backbone.register_forward_pre_hook(self._start, with_kwargs=True),
            self.backbone.layers[0].register_forward_pre_hook(self._cut_hidden, with_kwargs=True),
            *(
                layer.register_forward_pre_hook(self._cut_layer, with_kwargs=True)
                for layer in self.backbone.layers
            ),
            self.backbone.norm.register_forward_hook(self._gather),
        ]
        inner = config._attn_implementation
        register(inner)
        lm.set_attn_implementation(PREFIX + inner)

    # ---- the exchanges (flat all_to_all_single with per-rank sizes) ----

    def to_heads(self, x: torch.Tensor, ranges: list[tuple[int, int]]) -> torch.Tensor:
        """[B, H, T/N, d] (my positions, all heads) -> [B, my heads, T, d] (all positions)."""
        b, _, n, d = x.shape
        send = torch.cat([x[:, lo:hi].reshape(-1) for lo, hi in ranges])
        lo, hi = ranges[self.mesh.rank]
        mine = b * (hi - lo) * n * d
        got = _AllToAll.apply(
            send, [mine] * self.mesh.size, [b * (h - lo_) * n * d for lo_, h in ranges], self.mesh.group
        )
        return torch.cat([part.view(b, hi - lo, n, d) for part in got.split(mine)], dim=2)

    def to_positions(self, y: torch.Tensor, n: int, mine: tuple[int, int]) -> torch.Tensor:
        """[B, T, my heads, d] -> [B, T/N, H, d] (my positions, all heads)."""
        b, _, heads, d = y.shape
        send = torch.cat([y[:, i * n : (i + 1) * n].reshape(-1) for i in range(self.mesh.size)])
        sizes = [b * n * (hi - lo) * d for lo, hi in self.q_ranges]
        got = _AllToAll.apply(send, sizes, [b * n * heads * d] * self.mesh.size, self.mesh.group)
        parts = [part.view(b, n, hi - lo, d) for part, (lo, hi) in zip(got.split(sizes), self.q_ranges)]
        return torch.cat(parts, dim=2)

    # ---- the hooks ----

    def _start(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        """A forward without a KV cache (training, scoring) is split; generation's are not."""
        self.shard = None
        use_cache = kwargs.get("use_cache")
        use_cache = self.config.use_cache if use_cache is None else use_cache
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        if use_cache or cache is not None:
            return
        ids = kwargs.get("input_ids", args[0] if args else None)
        seq = ids if ids is not None else kwargs["inputs_embeds"]
        self._same_rows(seq)
        n = self.mesh.size
        self.shard = Shard(self, seq.shape[1], n * math.ceil(seq.shape[1] / n))
        self.forwards += 1

    def _same_rows(self, seq: torch.Tensor) -> None:
        """Every rank of the group must hold the same rows (one number per rank compared: cheap)."""
        weights = torch.arange(1, seq.shape[1] + 1, device=seq.device, dtype=torch.float64)
        flat = seq.double() if seq.dim() == 2 else seq.double().sum(-1)
        mark = torch.stack(
            [torch.tensor(float(seq.numel()), dtype=torch.float64), (flat * weights).sum().cpu()]
        )
        marks = [torch.empty_like(mark) for _ in range(self.mesh.size)]
        dist.all_gather(marks, mark, group=self.mesh.group)
        if any(not torch.equal(m, marks[0]) for m in marks):
            raise RuntimeError(
                "sequence parallelism: the ranks of a sequence group hold different rows in one forward "
                "(their data or samples differ); every rank of a group must run the same batch"
            )

    def _cut_hidden(self, module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        if self.shard is None:
            return None
        if args:
            return (self.shard.local(args[0]), *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": self.shard.local(kwargs["hidden_states"])}

    def _cut_layer(self, module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        shard = self.shard
        if shard is None:
            return None
        if shard.rope is None:
            shard.rope = tuple(shard.local(x) for x in kwargs["position_embeddings"])
        return args, {**kwargs, "position_embeddings": shard.rope, "sequence_parallel": shard}

    def _gather(self, module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor | None:
        shard, self.shard = self.shard, None
        if shard is not None and self.local:  # the head scores this rank's positions (`Shard.scores`)
            self.scored = shard
            self.scored_forwards += 1
            return None
        return None if shard is None else shard.gather(output)

    @contextlib.contextmanager
    def scoring_locally(self) -> Iterator[None]:
        """For the block, a split forward's final hidden states stay this rank's [B, T/N, h] (no all-gather)
        and `scored` is their split, for `Shard.scores`; a forward not split leaves it None (the whole
        hidden states, as without the block)."""
        self.local, self.scored = True, None
        try:
            yield
        finally:
            self.local, self.scored = False, None

    def remove(self, model: nn.Module) -> None:
        """`model` (the one given) as it was: its hooks removed, its attention the kernel it wrapped."""
        for h in self.handles:
            h.remove()
        SEQUENCE_SPLITS.pop(causal_lm(model), None)
        causal_lm(model).set_attn_implementation(self.config._attn_implementation.removeprefix(PREFIX))

    def describe(self) -> str:
        """One line for the log: the mesh and this rank's heads."""
        a, b = self.q_ranges[self.mesh.rank]
        lo, hi = self.kv_ranges[self.mesh.rank]
        return (
            f"sequence parallelism: {self.mesh.size} ranks per sequence, {self.mesh.dp_size} data-parallel "
            f"group(s); attention {self.config._attn_implementation.removeprefix(PREFIX)} on query heads "
            f"{a}-{b - 1}, key/value heads {lo}-{hi - 1} of this rank"
        )


def register(inner: str) -> str:
    """`PREFIX + inner` as a transformers attention function (and its mask function, the inner's): the
    inner kernel on the heads this rank holds, or unchanged where no `sequence_parallel` is passed."""
    name = PREFIX + inner

    def attention(
        module: nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: Any,
        sequence_parallel: Shard | None = None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, Any]:
        kernel = eager_attention_forward if inner == "eager" else ALL_ATTENTION_FUNCTIONS[inner]
        if sequence_parallel is None:  # generation, or a forward the hooks did not split
            return kernel(module, query, key, value, attention_mask, **kwargs)
        return sequence_parallel.attend(kernel, module, query, key, value, attention_mask, **kwargs)

    AttentionInterface.register(name, attention)
    AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS[inner])
    return name


def check(model: nn.Module, size: int) -> None:
    """One line for a model this cannot split: another family, an attention kernel it cannot wrap,
    fewer heads than ranks."""
    lm = causal_lm(model)
    config = getattr(lm, "config", None)
    kind = getattr(config, "model_type", None)
    if kind not in PLAIN_HEAD_MODELS:
        raise ConfigError(
            f"distributed.sequence_parallel={size}: model_type {kind} is not one of "
            f"{', '.join(sorted(PLAIN_HEAD_MODELS))} (the decoders whose attention it wraps)"
        )
    attention = config._attn_implementation
    if attention not in WRAPPABLE:
        raise ConfigError(
            f"distributed.sequence_parallel={size}: attention {attention} cannot be wrapped (its inputs "
            f"are not transformers' [batch, heads, tokens, dim]); use one of {', '.join(sorted(WRAPPABLE))}"
        )
    if config.num_attention_heads < size:
        raise ConfigError(
            f"distributed.sequence_parallel={size}: the model has {config.num_attention_heads} attention "
            f"heads, fewer than the {size} ranks that share them; use at most {config.num_attention_heads}"
        )


def check_trainer(trainer: Any) -> None:
    """One line for what a split decoder cannot run with: compiled layers (the exchanges are collectives
    inside them) and rounds sampled by a worker process (async GRPO: a group's ranks would sample apart)."""
    plan = getattr(trainer, "speed_plan", None)
    if plan is not None and plan.on("compile"):
        raise ConfigError(
            "distributed.sequence_parallel: speed.compile=true compiles the decoder layers, which hold the "
            "all-to-all exchanges; set speed.compile=false"
        )
    if getattr(trainer, "ahead", None) is not None:
        raise ConfigError(
            "distributed.sequence_parallel: rounds sampled ahead by a worker (method.args.max_staleness > 0) "
            "would differ between the ranks of a sequence group; use synchronous rounds"
        )
