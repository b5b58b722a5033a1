"""The chunked LM head under FSDP2 (ablate.speed.split.scored_logps, `head_scores`): on 2 gloo ranks, a model
sharded as accelerate shards it (each decoder layer, the head, the root) scores its completion tokens with the
head inside its own call, never building the [tokens, vocab] logits, and gives the unsharded model's log-probs
and gradients. Before, FSDP's head (an `FSDPLinear`) was taken for an unknown one and the model's full logits
were built: at 8k tokens a side a DPO pair held 7.7 GB a rank where one process held 3.3 GB."""

from __future__ import annotations

import json
import textwrap

from conftest import gloo_ranks

RANK = textwrap.dedent("""
    import json
    import torch, torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from transformers import LlamaConfig, LlamaForCausalLM
    from ablate.speed.split import lm_parts, scored_logps, sharded

    dist.init_process_group("gloo")
    VOCAB, T = 512, 24

    def build():
        config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
        torch.manual_seed(0)
        return LlamaForCausalLM(config).train()

    ids = torch.randint(0, VOCAB, (2, T), generator=torch.Generator().manual_seed(1))
    src = torch.arange(5, 2 * T - 1)  # flat positions that score a token (every rank the same rows)
    tgt = ids.flatten()[src + 1]

    def score(model):
        saved = []
        pack = lambda x: (saved.append(tuple(x.shape)), x)[1]
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
            logps, stats = scored_logps(model, {"input_ids": ids}, src, tgt, split=True)
        (logps * torch.linspace(0.5, 1.5, len(src))).sum().backward()
        return logps.detach(), stats, saved

    plain = build()
    want, want_stats, _ = score(plain)
    want_grads = {n: p.grad for n, p in plain.named_parameters()}
    model = build()
    for layer in model.model.layers:  # accelerate's TRANSFORMER_BASED_WRAP, and the head on its own
        fully_shard(layer)
    fully_shard(model.lm_head)
    fully_shard(model)
    got, stats, saved = score(model)
    grads = {n: p.grad.full_tensor() for n, p in model.named_parameters()}
    print(json.dumps({
        "sharded": sharded(model), "parts": lm_parts(model) is not None,
        "logps": (got - want).abs().max().item(),
        "entropy": (stats["entropy"] - want_stats["entropy"]).abs().max().item(),
        "grads": max(((grads[n] - g).abs().max() / g.abs().max()).item() for n, g in want_grads.items()),
        "vocab_wide": [s for s in saved if len(s) > 1 and s[-1] == VOCAB and s[-2] >= len(src)],
    }), flush=True)
    dist.destroy_process_group()
""")


def test_fsdp_scores_with_the_chunked_head_and_equals_the_plain_model():
    outs = gloo_ranks(RANK)
    for code, _, err in outs:
        assert code == 0, err[-3000:]
    for _, out, _ in outs:
        r = json.loads(out.strip().splitlines()[-1])
        assert r["sharded"] and r["parts"], r  # FSDP's head is a Linear the split knows
        assert r["logps"] < 1e-5 and r["entropy"] < 1e-5, r
        assert r["grads"] < 1e-5, r  # the head's and every layer's, reduce-scattered as FSDP does
        assert r["vocab_wide"] == [], r  # no [tokens, vocab] logits kept for backward
