"""Log-prob helpers: parity with the plain formula, masking, and the SFT token-mean loss."""

import torch

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


def test_logit_stats_in_blocks_equal_the_whole_tensor(monkeypatch):
    """Entropy, mean logit and argmax == target of 7 rows computed in blocks of 3 rows (3 + 3 + 1) and of
    a [2, 3, V] tensor equal the one-shot formula on the whole tensor; an empty input gives empty stats."""
    from ablate.losses import logps

    g = torch.Generator().manual_seed(0)
    logits, targets = torch.randn(7, 50, generator=g) * 3, torch.randint(0, 50, (7,), generator=g)
    f = torch.log_softmax(logits, -1)
    expected = (-(f.exp() * f).sum(-1), logits.mean(-1), logits.argmax(-1) == targets)
    monkeypatch.setattr(logps, "STATS_BLOCK_ELEMENTS", 3 * 50)
    for got, want in zip(logps.logit_stats(logits, targets), expected):
        assert torch.equal(got, want)
    cube = logps.logit_stats(logits[:6].reshape(2, 3, 50), targets[:6].reshape(2, 3))
    assert all(c.shape == (2, 3) and torch.equal(c.flatten(), w[:6]) for c, w in zip(cube, expected))
    assert all(x.numel() == 0 for x in logps.logit_stats(logits[:0], targets[:0]))
