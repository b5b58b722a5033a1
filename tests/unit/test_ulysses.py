"""Ulysses sequence parallelism (ablate.speed.ulysses): a decoder split over 2 gloo ranks gives the
one-process forward and, summed over the group, N times its gradients (what DDP's average over the world
turns into one process's), for the attention kernels and head layouts it wraps; its refusals; the data
loader that gives a sequence group's ranks the same batches. Whole runs: tests/slow/test_sequence_parallel.py."""

from __future__ import annotations

import json
import textwrap

import pytest
from conftest import gloo_ranks
import torch
from torch.utils.data import BatchSampler

from ablate.errors import ConfigError
from ablate.speed import ulysses

RANK = textwrap.dedent("""
    import json, sys
    import torch, torch.distributed as dist
    from transformers import LlamaConfig, LlamaForCausalLM
    from ablate.speed import ulysses
    from ablate.speed.packing import packed_inputs, use_packed_attention

    dist.init_process_group("gloo")
    mesh = ulysses.Mesh.of(dist.get_world_size())

    def build(heads, kv, attention):
        config = LlamaConfig(vocab_size=50, hidden_size=8 * heads, intermediate_size=32, num_hidden_layers=2,
                             num_attention_heads=heads, num_key_value_heads=kv, tie_word_embeddings=True)
        torch.manual_seed(0)
        model = LlamaForCausalLM(config)
        model.set_attn_implementation(attention)
        return model

    def step(model, inputs):
        model.zero_grad()
        logits = model(**inputs, use_cache=False).logits
        weights = torch.linspace(0, 1, logits.shape[1])[None, :]  # every position's log-prob matters
        (logits.log_softmax(-1)[..., 3] * weights).sum().backward()
        return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    results = []
    for case in json.loads(sys.argv[1]):
        heads, kv, attention, length, layout = case
        model = build(heads, kv, attention)
        ids = torch.randint(0, 50, (2, length), generator=torch.Generator().manual_seed(length))
        mask = torch.ones(2, length, dtype=torch.long)
        mask[1, length - 3 :] = 0  # a padded row
        inputs = {"input_ids": ids, "attention_mask": mask}
        if layout == "packed":  # ablate.speed.packing's padding-free row, its 4-D mask and Unpad
            assert use_packed_attention(model)
            inputs, _ = packed_inputs(inputs, torch.tensor([0]), mask.sum(1), kernel="padded")
        if layout == "checkpointed":
            model.gradient_checkpointing_enable()
        model.train()
        plain, plain_grads = step(model, inputs)
        split = ulysses.Ulysses(model, mesh)
        logits, grads = step(model, inputs)
        for g in grads.values():
            dist.all_reduce(g)
        with torch.no_grad():  # a forward with a KV cache (generation) is not split
            cached = model(input_ids=ids[:, :4], use_cache=True).logits
        split.remove(model)
        whole = model(input_ids=ids[:, :4], use_cache=True).logits.detach()
        results.append({
            "case": case,
            "logits": (logits - plain).abs().max().item(),
            "grads": max(((grads[n] / mesh.size - g).abs().max() / g.abs().max()).item()
                         for n, g in plain_grads.items()),
            "cached": (cached - whole).abs().max().item(),
            "attention": model.config._attn_implementation,
        })
    print(json.dumps(results), flush=True)
    dist.destroy_process_group()
""")

CASES = [
    (4, 4, "sdpa", 12, "padded"),  # heads and positions divide by 2
    (4, 2, "eager", 11, "padded"),  # grouped-query attention, eager kernel, 11 positions padded to 12
    (3, 1, "sdpa", 7, "padded"),  # uneven heads (2 and 1), one key/value head sent to both ranks
    (6, 3, "sdpa", 9, "padded"),  # 3 heads each: rank 1's cut a group of 2 (expanded for the kernel)
    (4, 4, "sdpa", 10, "packed"),  # the padding-free layout
    (4, 2, "sdpa", 13, "checkpointed"),  # gradient checkpointing: the recompute exchanges again
]


def test_two_ranks_equal_one_process(tmp_path):
    outs = gloo_ranks(RANK, json.dumps(CASES))
    for code, _, err in outs:
        assert code == 0, err[-3000:]
    for rank_results in (json.loads(out.strip().splitlines()[-1]) for _, out, _ in outs):
        assert [r["case"] for r in rank_results] == [list(c) for c in CASES]
        for r in rank_results:
            assert r["logits"] < 1e-5, r
            assert r["grads"] < 1e-5, r
            assert r["cached"] == 0.0, r  # generation's forwards run the kernel as it is
            assert not r["attention"].startswith(ulysses.PREFIX), r  # remove() put it back


def test_heads_are_split_in_contiguous_ranges_the_first_ones_larger():
    assert ulysses.split(4, 2) == [(0, 2), (2, 4)]
    assert ulysses.split(9, 2) == [(0, 5), (5, 9)]  # SmolLM2-135M's 9 heads over 2 ranks
    assert ulysses.split(6, 4) == [(0, 2), (2, 4), (4, 5), (5, 6)]


def _llama(heads: int, attention: str = "sdpa", model_type: str = "llama") -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=16,
        hidden_size=4 * heads,
        intermediate_size=8,
        num_hidden_layers=1,
        num_attention_heads=heads,
    )
    model = LlamaForCausalLM(config)
    model.config._attn_implementation = attention
    model.config.model_type = model_type
    return model


@pytest.mark.parametrize(
    "model, size, says",
    [
        (_llama(2), 4, "the model has 2 attention heads, fewer than the 4 ranks"),
        (_llama(4, "flex_attention"), 2, "attention flex_attention cannot be wrapped"),
        (_llama(4, model_type="gpt2"), 2, "model_type gpt2 is not one of llama, mistral, qwen2, qwen3"),
    ],
)
def test_what_it_cannot_split_is_one_line(model, size, says):
    with pytest.raises(ConfigError, match=says) as e:
        ulysses.check(model, size)
    assert "\n" not in str(e.value)
    ulysses.check(_llama(4), 2)  # and a model it can split passes


def test_the_ranks_of_a_sequence_group_draw_the_same_batches():
    from accelerate.data_loader import BatchSamplerShard

    class Loader:  # what accelerate's prepared loader exposes: its sharded batch sampler
        def __init__(self, rank: int) -> None:
            self.batch_sampler = BatchSamplerShard(BatchSampler(range(16), 2, False), 4, rank)

    drawn = []
    for rank in range(4):  # 4 ranks, 2 per sequence group: 2 data-parallel groups
        mesh = ulysses.Mesh(size=2, rank=rank % 2, group=None, dp_rank=rank // 2, dp_size=2)
        drawn.append(list(mesh.share_batches(Loader(rank)).batch_sampler))
    assert drawn[0] == drawn[1] == [[0, 1], [4, 5], [8, 9], [12, 13]]
    assert drawn[2] == drawn[3] == [[2, 3], [6, 7], [10, 11], [14, 15]]


def test_a_loader_not_sharded_by_batch_is_refused():
    class Iterable:
        batch_sampler = None

    mesh = ulysses.Mesh(size=2, rank=0, group=None, dp_rank=0, dp_size=1)
    with pytest.raises(ConfigError, match="the ranks of a sequence group must draw the same rows"):
        mesh.share_batches(Iterable())


@pytest.mark.parametrize(
    "size, processes, says",
    [
        (0, 2, "must be a whole number of ranks, 1 or more"),
        (2.5, 2, "must be a whole number of ranks, 1 or more"),
        (3, 2, "splits each sequence over 3 ranks, but this job has 2"),
        (2, 6, None),
        (2, None, None),  # a sweep's driver: the job's ranks are not known here
    ],
)
def test_the_config_check(size, processes, says):
    from ablate.config.machine import check_sequence_parallel

    if says is None:
        check_sequence_parallel(size, processes)
        return
    with pytest.raises(ConfigError, match=says):
        check_sequence_parallel(size, processes)
