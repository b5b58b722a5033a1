"""Sequence parallelism's scoring through the chunked head (ablate.speed.split.scored_logps with a decoder
split by ablate.speed.ulysses): on 2 gloo ranks each rank projects only the positions it holds (no all-gather
of the final hidden states, no head matmul repeated on every rank), and the log-probs, their stats and the
gradients equal one process's, for the model as it is, under DDP and under FSDP2. Before, every rank
gathered the whole sequence's hidden states and projected every scored position."""

from __future__ import annotations

import json
import textwrap

from conftest import gloo_ranks

RANK = textwrap.dedent("""
    import json, sys
    import torch, torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel
    from transformers import LlamaConfig, LlamaForCausalLM
    from ablate.speed import split as split_module, ulysses
    from ablate.speed.split import scored_logps

    projected = []  # the rows each call of the chunked head projects
    def counting(fn):
        def project(hidden, *args, **kwargs):
            projected.append(hidden.shape[0])
            return fn(hidden, *args, **kwargs)
        return project
    split_module.completion_logps = counting(split_module.completion_logps)
    ulysses.completion_logps = counting(ulysses.completion_logps)

    dist.init_process_group("gloo")
    mesh = ulysses.Mesh.of(dist.get_world_size())
    VOCAB, T, HIDDEN = 96, 23, 32  # 23 positions: padded to 24, 12 a rank

    def build():
        config = LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=64, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=wrap != "fsdp")
        torch.manual_seed(0)
        return LlamaForCausalLM(config).train()

    ids = torch.randint(0, VOCAB, (2, T), generator=torch.Generator().manual_seed(1))
    # flat positions of [2, T] that score a token: a prompt's last position scores two (a shared prompt's)
    src = torch.cat([torch.tensor([4, 4]), torch.arange(5, T - 1), torch.arange(T + 9, 2 * T - 1)])
    tgt = torch.randint(0, VOCAB, (len(src),), generator=torch.Generator().manual_seed(2))

    def score(model):
        projected.clear()
        logps, stats = scored_logps(model, {"input_ids": ids}, src, tgt, split=True, temperature=0.7)
        (logps * torch.linspace(0.5, 1.5, len(src))).sum().backward()
        return logps.detach(), stats

    results = []
    for wrap in json.loads(sys.argv[1]):  # each in a fresh model
        plain = build()
        want, want_stats = score(plain)
        want_grads = {n: p.grad for n, p in plain.named_parameters()}
        model = build()
        split = ulysses.Ulysses(model, mesh)
        if wrap == "ddp":
            wrapped = DistributedDataParallel(model)
        elif wrap.startswith("fsdp"):  # the head its own unit (untied), or the root's (tied to the embeddings)
            for layer in model.model.layers:
                fully_shard(layer)
            if wrap == "fsdp":
                fully_shard(model.lm_head)
            wrapped = fully_shard(model)
        else:
            wrapped = model
        got, stats = score(wrapped)
        grads = {}
        for n, p in model.named_parameters():
            g = p.grad.full_tensor() if wrap.startswith("fsdp") else p.grad.clone()
            if wrap == "none":  # what DDP's average over the world does
                dist.all_reduce(g)
                g /= mesh.size
            grads[n] = g
        results.append({
            "wrap": wrap, "scored_locally": split.scored_forwards, "split": split.forwards,
            "logps": (got - want).abs().max().item(),
            "stats": max((stats[k].float() - want_stats[k].float()).abs().max().item() for k in want_stats),
            "grads": max(((grads[n] - g).abs().max() / g.abs().max()).item() for n, g in want_grads.items()),
            "projected": list(projected),
            "scored": len(src),
        })
    print(json.dumps(results), flush=True)
    dist.destroy_process_group()
""")


WRAPS = ["none", "ddp", "fsdp", "fsdp_tied"]  # FSDP2 with the head its own unit, or tied to the embeddings


def test_each_rank_scores_its_own_positions_and_equals_one_process():
    outs = gloo_ranks(RANK, json.dumps(WRAPS))  # one pair of processes for every wrapping: seconds, not tens
    for code, _, err in outs:
        assert code == 0, err[-3000:]
    ranks = [json.loads(out.strip().splitlines()[-1]) for _, out, _ in outs]
    for i, wrap in enumerate(WRAPS):
        rows = []
        for results in ranks:
            r = results[i]
            assert r["wrap"] == wrap
            assert r["split"] == 1 and r["scored_locally"] == 1, r  # split, and its hidden states kept local
            assert r["logps"] < 1e-5 and r["stats"] < 1e-5, r
            assert r["grads"] < 1e-5, r  # the head's, the tied embeddings' and every layer's
            assert len(r["projected"]) == 1 and r["projected"][0] < r["scored"], r  # this rank's rows only
            rows.append(r["projected"][0])
        assert sum(rows) == r["scored"], (wrap, rows)  # each scored position projected by one rank
