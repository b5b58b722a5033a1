"""GRPO loss pieces against hand-computed numbers (arithmetic in the docstrings)."""

from __future__ import annotations

import functools
import math

import pytest
import torch

from ablate.losses import grpo

NAN = float("nan")


def _table() -> torch.Tensor:
    """Two reward functions (weights 1 and 0.5), groups of 3:
    group 0: rows [1,0] [1,2] [1,4] -> weighted sums 1, 2, 3
    group 1: rows [4,2] [5,0] [3,4] -> 5, 5, 5 (zero std)
    """
    return torch.tensor([[1.0, 0.0], [1.0, 2.0], [1.0, 4.0], [4.0, 2.0], [5.0, 0.0], [3.0, 4.0]])


W = torch.tensor([1.0, 0.5])
# every objective's arguments (the trainer passes them all: none has a default); a test names what it changes
OBJECTIVE_ARGS = dict(
    epsilon=0.2,
    epsilon_high=0.2,
    beta=0.0,
    importance_sampling_level="token",
    delta=None,
    bias_correction_kl=False,
)


def _run(objective, inputs, **args):
    """`objective(inputs)` with OBJECTIVE_ARGS, `args` replacing or adding to them."""
    return objective(inputs, **{**OBJECTIVE_ARGS, **args})


def test_advantages_group_scaling_and_zero_std_group():
    """group 0: mean 2, unbiased std sqrt((1+0+1)/2) = 1 -> A = [-1, 0, 1] / (1 + 1e-4).
    group 1: all 5, std 0 -> A = 0 / 1e-4 = 0 (no signal, no blow-up).
    reward = mean(1,2,3,5,5,5) = 3.5; reward_std: deviations -2.5 -1.5 -0.5 1.5 1.5 1.5, squares
    sum to 15.5, /5 = 3.1, sqrt = 1.760682; frac_reward_zero_std = 1 of 2 groups = 0.5."""
    adv, m = grpo.sum_then_normalize(_table(), W, num_generations=3, scale=grpo.group_std)
    d = 1 + 1e-4
    torch.testing.assert_close(adv, torch.tensor([-1 / d, 0.0, 1 / d, 0.0, 0.0, 0.0]))
    assert m["reward"].item() == pytest.approx(3.5)
    assert m["reward_std"].item() == pytest.approx(math.sqrt(3.1), rel=1e-6)
    assert m["frac_reward_zero_std"].item() == pytest.approx(0.5)


def test_advantages_batch_and_none_scaling():
    """Centred per group: [-1, 0, 1, 0, 0, 0]. batch: / (1.760682 + 1e-4). none: unchanged."""
    centred = torch.tensor([-1.0, 0.0, 1.0, 0.0, 0.0, 0.0])
    adv, _ = grpo.sum_then_normalize(_table(), W, num_generations=3, scale=grpo.batch_std)
    torch.testing.assert_close(adv, centred / (math.sqrt(3.1) + 1e-4))
    adv, m = grpo.sum_then_normalize(_table(), W, num_generations=3, scale=grpo.no_std)
    torch.testing.assert_close(adv, centred)
    assert m["frac_reward_zero_std"].item() == pytest.approx(0.5)  # logged whatever the scaling


def test_frac_reward_zero_std_is_trls_for_every_scaling():
    """TRL 1.16 (grpo_trainer.py, `is_std_zero`) checks the std it scales by: with `batch` the batch's
    std (1.760682 on the table, not 0 -> 0.0, though group 1 alone has std 0), with `group` and
    `none` each group's (1 of 2 groups -> 0.5). All rewards equal: batch std 0 -> 1.0 (groups: 2 of 2).
    A config's scale is functools.partial(batch_std) (`_partial_: true`): the same."""
    for scale, expected in (
        (grpo.group_std, 0.5),
        (grpo.no_std, 0.5),
        (grpo.batch_std, 0.0),
        (functools.partial(grpo.batch_std), 0.0),
    ):
        _, m = grpo.sum_then_normalize(_table(), W, num_generations=3, scale=scale)
        assert m["frac_reward_zero_std"].item() == expected, scale
    flat = torch.full((6, 2), 2.0)  # weighted sums all 3
    for scale in (grpo.group_std, grpo.no_std, grpo.batch_std, functools.partial(grpo.batch_std)):
        _, m = grpo.sum_then_normalize(flat, W, num_generations=3, scale=scale)
        assert m["frac_reward_zero_std"].item() == 1.0, scale


def test_advantages_unscorable_completion_is_left_out():
    """Group [None, 2, 4] (both functions returned None for the first): mean 3, std sqrt(2)
    -> A = [0, -1/(sqrt 2 + 1e-4), 1/(sqrt 2 + 1e-4)]. One function None, the other 2: counts as 2."""
    table = torch.tensor([[NAN, NAN], [2.0, 0.0], [4.0, 0.0], [NAN, 4.0], [2.0, 0.0], [0.0, 4.0]])
    adv, _ = grpo.sum_then_normalize(table, W, num_generations=3)
    s = math.sqrt(2) + 1e-4
    torch.testing.assert_close(adv[:3], torch.tensor([0.0, -1 / s, 1 / s]))
    # group 1: sums 2, 2, 2 -> zero std -> all 0
    torch.testing.assert_close(adv[3:], torch.zeros(3))


def _huge() -> torch.Tensor:
    """One function, groups of 4 whose rewards are +-3e38 (finite float32): their float32 mean, spread and
    variance all overflow. In float64 each group is [-3e38, 3e38, -3e38, 3e38]: mean 0, unbiased std
    sqrt(4 * 9e76 / 3) = 3.4641e38, so A = r / std = +-0.8660 (the 1e-4 is lost at this scale)."""
    return torch.tensor([[-3e38], [3e38], [-3e38], [3e38]] * 2)


U = math.sqrt(3) / 2  # a huge group's advantages, +-U (see _huge)


@pytest.mark.parametrize(
    "aggregate,size",
    [
        (grpo.sum_then_normalize, U),
        # then over the batch: +-U, unbiased std U * sqrt(8/7), + 1e-4
        (grpo.normalize_then_sum, U / (U * math.sqrt(8 / 7) + 1e-4)),
    ],
    ids=["sum_then_normalize", "normalize_then_sum"],
)
def test_rewards_near_float32s_largest_give_finite_advantages(aggregate, size):
    adv, m = aggregate(_huge(), torch.ones(1), num_generations=4)
    assert adv.dtype == torch.float32
    torch.testing.assert_close(adv, torch.tensor([-1.0, 1.0, -1.0, 1.0] * 2) * size)
    assert math.isfinite(m["reward_std"].item()) and m["reward"].item() == 0.0


def test_rloo_rewards_near_float32s_largest_give_finite_advantages():
    """Leave-one-out: 3e38 against its siblings' mean (3e38 - 2 * 3e38) / 3 = -1e38 -> A = 4e38 (float32 holds it)."""
    from ablate.losses import rloo

    adv, m = rloo.leave_one_out(
        _huge(),
        torch.ones(1),
        num_generations=4,
        beta=0.0,
        normalize_advantages=False,
        reward_clip_range=None,
    )
    torch.testing.assert_close(adv, torch.tensor([-4e38, 4e38, -4e38, 4e38] * 2))
    assert math.isfinite(m["reward_std"].item())


def test_ordinary_rewards_keep_float32_arithmetic_to_the_bit():
    """headroom leaves an ordinary table as it is (TRL's float32 numbers, bit for bit)."""
    table = torch.randn(64, 3, generator=torch.Generator().manual_seed(0)) * 1e6
    assert grpo.headroom(table, torch.ones(3)) is table
    assert grpo.headroom(_huge()).dtype == torch.float64
    grouped = (table * W.new_tensor([1.0, 0.5, 2.0])).nansum(dim=1).view(-1, 8)
    expected = (grouped - grouped.nanmean(dim=1, keepdim=True)) / (
        grpo._nanstd(grouped, dim=1, keepdim=True) + 1e-4
    )
    adv, _ = grpo.sum_then_normalize(table, torch.tensor([1.0, 0.5, 2.0]), num_generations=8)
    assert torch.equal(adv, expected.reshape(-1))


def _ratios() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """ratios [[1.5, 0.9], [0.5, 1.1]], A = [1, -2], mask [[1, 1], [1, 0]], old logps 0."""
    r = torch.tensor([[1.5, 0.9], [0.5, 1.1]])
    logps = r.log().requires_grad_(True)
    return logps, torch.zeros(2, 2), torch.tensor([1.0, -2.0]), torch.tensor([[1.0, 1.0], [1.0, 0.0]])


def test_clipped_surrogate_active_and_inactive():
    """eps 0.2:  row 0 (A=1):  r=1.5 -> min(1.5, 1.2) = 1.2 -> -1.2 (high clip); r=0.9 -> -0.9.
                 row 1 (A=-2): r=0.5 -> min(-1.0, 0.8*-2=-1.6) = -1.6 -> 1.6 (low clip); r=1.1 -> 2.2.
    Clip metrics over the 3 unmasked tokens: low 1/3, high 1/3, region 2/3 (the masked 2.2 not counted).
    Gradient: a clipped token has none; unclipped d(-r*A)/dlogp = -r*A: -0.9 and (masked token) 2.2."""
    logps, old, adv, mask = _ratios()
    loss, m = _run(grpo.clip, grpo.LossInputs(logps, old, adv, mask))
    torch.testing.assert_close(loss, torch.tensor([[-1.2, -0.9], [1.6, 2.2]]))
    assert m["clip_ratio/low_mean"].item() == pytest.approx(1 / 3)
    assert m["clip_ratio/high_mean"].item() == pytest.approx(1 / 3)
    assert m["clip_ratio/region_mean"].item() == pytest.approx(2 / 3)
    # per completion: low-clipped fractions [0/2, 1/1] -> min 0; high-clipped [1/2, 0/1] -> max 0.5
    assert m["clip_ratio/low_min"].item() == 0.0 and m["clip_ratio/high_max"].item() == pytest.approx(0.5)
    assert "kl" not in m
    loss.sum().backward()
    torch.testing.assert_close(logps.grad, torch.tensor([[0.0, -0.9], [0.0, 2.2]]))


def test_epsilon_high_widens_only_the_upper_clip():
    """eps_low 0.2, eps_high 0.6: r=1.5 < 1.6 is no longer clipped -> -1.5; r=0.5 still low-clipped."""
    logps, old, adv, mask = _ratios()
    loss, m = _run(grpo.clip, grpo.LossInputs(logps, old, adv, mask), epsilon_high=0.6)
    torch.testing.assert_close(loss, torch.tensor([[-1.5, -0.9], [1.6, 2.2]]))
    assert m["clip_ratio/high_mean"].item() == 0.0
    assert m["clip_ratio/low_mean"].item() == pytest.approx(1 / 3)


def test_k3_kl_term():
    """ref 0, logp = log r: kl = 1/r + log r - 1:
    r=1.5: 0.666667 + 0.405465 - 1 = 0.072132; r=0.9: 1.111111 - 0.105361 - 1 = 0.005750;
    r=0.5: 2 - 0.693147 - 1 = 0.306853; r=1.1: 0.909091 + 0.095310 - 1 = 0.004401 (masked).
    loss += 0.1 * kl; metric kl = (0.072132 + 0.005750 + 0.306853) / 3 = 0.128245."""
    logps, old, adv, mask = _ratios()
    inputs = grpo.LossInputs(logps, old, adv, mask, ref_logps=torch.zeros(2, 2))
    loss, m = _run(grpo.clip, inputs, beta=0.1)
    kl = torch.tensor([[0.072132, 0.005750], [0.306853, 0.004401]])
    torch.testing.assert_close(loss, torch.tensor([[-1.2, -0.9], [1.6, 2.2]]) + 0.1 * kl, atol=1e-5, rtol=0)
    assert m["kl"].item() == pytest.approx(0.128245, abs=1e-5)
    with pytest.raises(ValueError):
        _run(grpo.clip, grpo.LossInputs(logps, old, adv, mask), beta=0.1)


L = torch.tensor([[-1.2, -0.9], [1.6, 2.2]])
MASK = torch.tensor([[1.0, 1.0], [1.0, 0.0]])


def test_aggregation_grpo():
    """Per-sequence token means: (-1.2 - 0.9) / 2 = -1.05 and 1.6 / 1 = 1.6; mean = 0.275."""
    assert grpo.grpo(L, MASK, num_items=3, max_completion_length=4).item() == pytest.approx(0.275)


def test_aggregation_dapo():
    """Masked sum -1.2 - 0.9 + 1.6 = -0.5 over num_items: /3 = -0.166667, /4 = -0.125."""
    assert grpo.dapo(L, MASK, num_items=3, max_completion_length=4).item() == pytest.approx(-0.5 / 3)
    assert grpo.dapo(L, MASK, num_items=4, max_completion_length=4).item() == pytest.approx(-0.125)


def test_aggregation_dr_grpo():
    """Masked sum -0.5 over (2 sequences * max_completion_length 4) = -0.0625."""
    assert grpo.dr_grpo(L, MASK, num_items=3, max_completion_length=4).item() == pytest.approx(-0.0625)


def test_fully_masked_sequence_counts_zero_not_nan():
    """A completion with no tokens (masked out entirely) adds 0, not 0/0: grpo = (-1.05 + 0) / 2."""
    mask = torch.tensor([[1.0, 1.0], [0.0, 0.0]])
    assert grpo.grpo(L, mask, num_items=2, max_completion_length=4).item() == pytest.approx(-0.525)
    assert grpo.masked_mean(L, torch.zeros(2, 2)).item() == 0.0


def test_aggregation_bnpo():
    """Masked sum -0.5 over the micro-batch's 3 tokens (num_items ignored) = -0.166667."""
    assert grpo.bnpo(L, MASK, num_items=10, max_completion_length=4).item() == pytest.approx(-0.5 / 3)


def test_sequence_level_ratio_gspo():
    """One ratio per completion: exp of the masked mean token log-ratio.
    row 0 (A=1): (log 1.5 + log 0.9) / 2 = log sqrt(1.35) -> r = 1.161895, inside [0.8, 1.2] -> -1.161895
    on both tokens; row 1 (A=-2): only token 0 counts -> r = 0.5 -> min(-1, 0.8 * -2) = -1.6 -> 1.6.
    Clip metrics are per completion: row 1 low-clipped -> low 1/2, high 0, region 1/2."""
    logps, old, adv, mask = _ratios()
    loss, m = _run(grpo.clip, grpo.LossInputs(logps, old, adv, mask), importance_sampling_level="sequence")
    r0 = math.sqrt(1.35)
    torch.testing.assert_close(loss, torch.tensor([[-r0, -r0], [1.6, 1.6]]))
    assert m["clip_ratio/low_mean"].item() == pytest.approx(0.5)
    assert m["clip_ratio/high_mean"].item() == 0.0 and m["clip_ratio/region_mean"].item() == pytest.approx(
        0.5
    )
    with pytest.raises(KeyError):  # not a level: the config's schema refuses it (tests/unit/test_schema.py)
        _run(grpo.clip, grpo.LossInputs(logps, old, adv, mask), importance_sampling_level="tokens")


def test_delta_caps_the_ratio_of_negative_advantages():
    """r = 1.5, A = -2, eps 0.2: without delta min(1.5 * -2, 1.2 * -2) = -3 -> loss 3;
    delta = 1.3 caps r: min(1.3 * -2, -2.4) = -2.6 -> loss 2.6."""
    logps, old, adv, mask = (
        torch.tensor([[math.log(1.5)]]),
        torch.zeros(1, 1),
        torch.tensor([-2.0]),
        torch.ones(1, 1),
    )
    inputs = grpo.LossInputs(logps, old, adv, mask)
    assert _run(grpo.clip, inputs)[0].item() == pytest.approx(3.0)
    assert _run(grpo.clip, inputs, delta=1.3)[0].item() == pytest.approx(2.6)


def test_kl_bias_correction_multiplies_by_the_ratio():
    """As test_k3_kl_term, times the ratio: kl * r = [[0.072132 * 1.5, 0.005750 * 0.9], [0.306853 * 0.5, .]]
    = [[0.108198, 0.005175], [0.153427, .]]; metric = (0.108198 + 0.005175 + 0.153427) / 3 = 0.088933."""
    logps, old, adv, mask = _ratios()
    inputs = grpo.LossInputs(logps, old, adv, mask, ref_logps=torch.zeros(2, 2))
    loss, m = _run(grpo.clip, inputs, beta=0.1, bias_correction_kl=True)
    kl = torch.tensor([[0.108198, 0.005175], [0.153427, 0.004401 * 1.1]])
    torch.testing.assert_close(loss, torch.tensor([[-1.2, -0.9], [1.6, 2.2]]) + 0.1 * kl, atol=1e-5, rtol=0)
    assert m["kl"].item() == pytest.approx(0.088933, abs=1e-5)


def test_cispo_hand_computed():
    """epsilon_high = 1.2 is the cap: weights sg(min(r, 1.2)) = [[1.2, 0.9], [0.5, 1.1]]; loss = -w A log r:
    row 0 (A=1):  -1.2 log 1.5 = -0.486558;  -0.9 log 0.9 = 0.094824
    row 1 (A=-2): 1.0 log 0.5 = -0.693147;   2.2 log 1.1 = 0.209682
    gradient -w A (nothing is cut): [[-1.2, -0.9], [1.0, 2.2]]; cispo_clip_ratio: r=1.5 > 1.2 with A > 0,
    1 of the 3 unmasked tokens."""
    logps, old, adv, mask = _ratios()
    loss, m = _run(grpo.cispo, grpo.LossInputs(logps, old, adv, mask), epsilon_high=1.2)
    torch.testing.assert_close(
        loss, torch.tensor([[-0.486558, 0.094824], [-0.693147, 0.209682]]), atol=1e-5, rtol=0
    )
    assert m["cispo_clip_ratio"].item() == pytest.approx(1 / 3)
    loss.sum().backward()
    torch.testing.assert_close(logps.grad, torch.tensor([[-1.2, -0.9], [1.0, 2.2]]))


def test_sapo_hand_computed():
    """-sig(tau (r - 1)) 4/tau A, tau 1 where A > 0 else 1.05:
    row 0 (A=1):  -4 sig(0.5) = -2.489837;  -4 sig(-0.1) = -1.900083
    row 1 (A=-2): 8/1.05 sig(-0.525) = 2.831877;  8/1.05 sig(0.105) = 4.009340."""
    logps, old, adv, mask = _ratios()
    loss, m = _run(
        grpo.sapo, grpo.LossInputs(logps, old, adv, mask), temperature_pos=1.0, temperature_neg=1.05
    )
    torch.testing.assert_close(
        loss, torch.tensor([[-2.489837, -1.900083], [2.831877, 4.009340]]), atol=1e-5, rtol=0
    )
    assert m == {}


def test_normalize_then_sum():
    """Each function normalised in its group first (the table above, weights 1 and 0.5):
    group 0: f0 = [1, 1, 1] -> 0 (std 0); f1 = [0, 2, 4] -> [-2, 0, 2] / (2 + 1e-4) -> x 0.5 = [-0.499975, 0, 0.499975]
    group 1: f0 = [4, 5, 3] -> [0, 1, -1] / 1.0001 = [0, 0.999900, -0.999900];
             f1 = [2, 0, 4] -> x 0.5: [0, -0.499975, 0.499975]  -> sums [0, 0.499925, -0.499925]
    batch: mean 0, std sqrt((2 * 0.499975^2 + 2 * 0.499925^2) / 5) = 0.447169 -> A = x / (0.447169 + 1e-4).
    reward / reward_std are of the raw weighted sums (3.5 and 1.760682, as with sum_then_normalize)."""
    adv, m = grpo.normalize_then_sum(_table(), W, num_generations=3)
    x = torch.tensor([-0.499975, 0.0, 0.499975, 0.0, 0.499925, -0.499925])
    torch.testing.assert_close(adv, x / (0.447169 + 1e-4), atol=1e-5, rtol=0)
    assert m["reward"].item() == pytest.approx(3.5) and m["reward_std"].item() == pytest.approx(
        math.sqrt(3.1), rel=1e-6
    )
    assert m["frac_reward_zero_std"].item() == 0.0


def test_nan_or_inf_advantages_stop_the_round_in_one_line():
    """An aggregation of the user's that makes NaN (0/0) is named, with the step, before any loss is computed."""
    from ablate.rollouts.rewarding import check_advantages

    def ratio(rewards_per_func, weights, num_generations, scale=None):
        return rewards_per_func.sum(1) / 0.0, {}

    check_advantages(torch.tensor([0.5, -0.5]), ratio, 3)  # finite: nothing said
    with pytest.raises(FloatingPointError) as e:
        check_advantages(ratio(torch.zeros(2, 1), None, 2)[0], ratio, 3)
    assert str(e.value).startswith(
        "the advantages are NaN/inf at step 3, made by method.grpo_reward_aggregation "
        "(test_grpo_loss.test_nan_or_inf_advantages_stop_the_round_in_one_line.<locals>.ratio)"
    )
