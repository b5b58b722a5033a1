"""Issue 33 B, on the layout TRL 1.16 uses: its DPO/GRPO/KTO/RLOO trainers score through a fused LM head
(`add_fused_lm_head`: the completion positions only, through `_ChunkedLogProbFunction`, no logits kept).
ablate's `completion_only_logits` (`ablate.speed.head.HeadLogps`) keeps for backward exactly what TRL's
keeps, byte for byte, and gives the same log-probs; the plain path (`speed=off`) keeps the logits too,
which is why it measured 1.06x TRL's GPU memory on the H200 (docs/benchmarks.md). Counted with autograd's
saved-tensor hooks, which see every tensor either function keeps, on any device."""

import pytest
import torch
from torch import nn

from ablate.losses.logps import logits_logps
from ablate.speed.head import completion_logps

utils = pytest.importorskip("trl.trainer.utils")


def saved_bytes(fn):
    """(fn's output, bytes of the distinct tensors autograd saved for its backward)."""
    seen = {}

    def pack(t):
        seen[(t.untyped_storage().data_ptr(), t.dtype, tuple(t.shape))] = t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, sum(seen.values())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_head_keeps_what_trls_fused_head_keeps_and_the_plain_path_keeps_the_logits_too(dtype):
    g = torch.Generator().manual_seed(0)
    n, hidden, vocab = 300, 64, 4096  # 300 completion positions; vocab >> hidden, as in an LLM
    head = nn.Linear(hidden, vocab, bias=False).to(dtype)
    h = torch.randn(n, hidden, generator=g).to(dtype).requires_grad_()
    targets = torch.randint(0, vocab, (n,), generator=g)

    ours, ours_bytes = saved_bytes(lambda: completion_logps(h, head, targets)[0])
    trl, trl_bytes = saved_bytes(
        lambda: utils._ChunkedLogProbFunction.apply(
            h, head.weight, None, targets, 1.0, utils._CHUNKED_LOGPROB_CHUNK_SIZE, None, 1.0, ("log_probs",)
        )[0]
    )
    plain, plain_bytes = saved_bytes(lambda: logits_logps(head(h), targets)[0])

    torch.testing.assert_close(ours, trl.float(), rtol=0, atol=1e-5 if dtype == torch.float32 else 2e-2)
    assert ours_bytes <= trl_bytes, (ours_bytes, trl_bytes)
    logits = n * vocab * torch.finfo(dtype).bits // 8
    assert plain_bytes >= trl_bytes + logits, (plain_bytes, trl_bytes, logits)  # the [N, vocab] logits, kept
