"""Log-prob helpers: parity with the plain formula, masking, and the SFT token-mean loss."""

import pytest
import torch

from ablate.losses import logps
from ablate.losses.logps import selective_log_softmax, sequence_logps, token_logps
from ablate.losses.sft import nll


def test_selective_log_softmax_matches_plain_gather():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 7, 11, generator=g)
    index = torch.randint(0, 11, (3, 7), generator=g)
    plain = torch.log_softmax(logits, -1).gather(-1, index.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(selective_log_softmax(logits, index), plain)
    assert selective_log_softmax(logits.bfloat16(), index).dtype == torch.float32


def test_token_logps_shift_and_masked_sum():
    """Vocab 2, uniform logits -> every token has log-prob log(1/2).
    input_ids has 4 tokens -> 3 next-token predictions; mask [0, 1, 1] keeps the last two:
    sum = 2 * log(0.5) = -1.3862944. A masked-out token never contributes, however unlikely.
    """
    logits = torch.zeros(1, 4, 2)
    logits[0, 0] = torch.tensor([100.0, -100.0])  # predicts token 0 at position 1: masked below
    ids = torch.tensor([[0, 1, 0, 1]])
    per_token = token_logps(logits, ids)
    assert per_token.shape == (1, 3)
    total = sequence_logps(per_token, torch.tensor([[0.0, 1.0, 1.0]]))
    assert torch.allclose(total, torch.tensor([2 * torch.log(torch.tensor(0.5))]))


def test_nll_token_mean_and_accumulation_count():
    """logps [[-1, -2, -3], [-4, -5, -6]], mask [[0, 1, 1], [1, 0, 0]]:
    masked sum = -(-2 - 3 - 4) = 9 over 3 tokens -> 3.0.
    With num_items_in_batch = 6 (tokens of the whole accumulated batch): 9 / 6 = 1.5.
    """
    lp = torch.tensor([[-1.0, -2.0, -3.0], [-4.0, -5.0, -6.0]])
    mask = torch.tensor([[0.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    assert nll(lp, mask).item() == 3.0
    assert nll(lp, mask, num_items_in_batch=torch.tensor(6)).item() == 1.5


def _plain(logits, targets, temperature=1.0):
    """The plain formula, whose numbers `logits_logps` must give: float32 log-softmax, gathered."""
    z = logits.float() / temperature
    f = torch.log_softmax(z, -1)
    return (
        f.gather(-1, targets.unsqueeze(-1)).squeeze(-1),
        (-(f.exp() * f).sum(-1), z.mean(-1), logits.argmax(-1) == targets),
    )


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("chunk_elements", [None, 3 * 50])  # one block; blocks of 3 positions (3 + 3 + 1 ...)
@pytest.mark.parametrize("sliced", [False, True])  # a contiguous tensor, or a slice (blocks then one row's)
def test_logits_logps_equal_the_plain_formula_and_its_gradient(temperature, chunk_elements, sliced):
    """Log-probs, stats and the logits' gradient of `logits_logps` (blocks of rows, no float32 copy kept)
    equal the plain formula's on the whole tensor, float32; weights per token so every position counts."""
    g = torch.Generator().manual_seed(0)
    base = (torch.randn(2, 8, 50, generator=g) * 3).requires_grad_()
    targets = torch.randint(0, 50, (2, 7 if sliced else 8), generator=g)
    weights = torch.randn(targets.shape, generator=g)

    def logits():
        return base[:, :-1] if sliced else base * 1.0

    want, want_stats = _plain(logits(), targets, temperature)
    (want * weights).sum().backward()
    want_grad, base.grad = base.grad.clone(), None
    got, stats = logps.logits_logps(logits(), targets, temperature, chunk_elements=chunk_elements)
    (got * weights).sum().backward()
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(base.grad, want_grad, rtol=1e-6, atol=1e-6)
    for name, w in zip(logps.STATS, want_stats):
        assert not stats[name].requires_grad
        if name == "correct":
            assert torch.equal(stats[name], w)
        else:
            torch.testing.assert_close(stats[name], w, rtol=1e-5, atol=1e-6)


def test_logits_logps_keeps_no_float32_copy_of_bf16_logits():
    """What backward keeps of bf16 logits is the logits themselves (and one float per position), not a
    float32 copy of them (the plain formula's `.float()`: twice their bytes)."""
    logits = torch.randn(4, 16, 1000).bfloat16().requires_grad_()
    targets = torch.randint(0, 1000, (4, 16))
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        logps.logits_logps(logits, targets)
    assert sum(t.numel() * t.element_size() for t in saved) < logits.numel() * logits.element_size() + 4096
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        saved.clear()
        logps.selective_log_softmax(logits, targets)
    assert sum(t.numel() * t.element_size() for t in saved) >= 2 * logits.numel() * logits.element_size()


def test_shifted_logps_of_the_last_k_positions():
    """Logits of the last K positions only (`logits_to_keep=K`) score the last K - 1 tokens: the same
    numbers as the whole logits' last K - 1 (`token_logps`)."""
    g = torch.Generator().manual_seed(1)
    full = torch.randn(2, 9, 30, generator=g)
    ids = torch.randint(0, 30, (2, 9), generator=g)
    whole = logps.token_logps(full, ids)
    got, stats = logps.shifted_logps(full[:, -4:].contiguous(), ids)
    assert got.shape == (2, 3) and stats["entropy"].shape == (2, 3)
    torch.testing.assert_close(got, whole[:, -3:])
    torch.testing.assert_close(logps.shifted_logps(full, ids)[0], whole)
