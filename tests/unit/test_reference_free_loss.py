"""ORPO, CPO (sigmoid, hinge, ipo), SimPO and AlphaPO's shape (ablate.losses.reference_free) against hand-computed values (arithmetic in each docstring).

The pairs of tests/unit/test_dpo_loss.py, beta = 0.5 (sp(x) = log(1 + e^x) = -logsig(-x)); no reference:
    logp_c = [-1, -2, -4], logp_r = [-3, -2, -1], n_c = [2, 4, 1], n_r = [1, 2, 4]
    per-token means a_c = logp_c / n_c = [-0.5, -0.5, -4], a_r = logp_r / n_r = [-3, -1, -0.25]
    the chosen NLL, a token mean over the batch: -(-1 - 2 - 4) / (2 + 4 + 1) = 7 / 7 = 1
    sp(-1) = 0.3132617, sp(0) = log 2 = 0.6931472, sp(1.5) = 1.7014133, sp(2.125) = 2.2378223
"""

import math
from pathlib import Path

import pytest
import torch
from hydra.utils import instantiate

from ablate.losses import reference_free as rf

LOSS_DIR = Path(__file__).resolve().parents[2] / "conf" / "method" / "dpo_loss"
LOG2 = math.log(2)


def t(*xs: float) -> torch.Tensor:
    return torch.tensor(xs, dtype=torch.float64)


def pairs(ref: float = -2.0) -> tuple[torch.Tensor, ...]:
    return t(-1, -2, -4), t(-3, -2, -1), t(ref, ref, ref), t(ref, ref, ref), t(2, 4, 1), t(1, 2, 4)


def close(x: torch.Tensor, *expected: float) -> None:
    torch.testing.assert_close(x.double(), t(*expected), rtol=0, atol=1e-6)


def test_cpo():
    """z = b (logp_c - logp_r) = 0.5 [2, 0, -3] = [1, 0, -1.5]; sp(-z) = [0.3132617, log 2, 1.7014133];
    + cpo_alpha * NLL = + 1 * 1: [1.3132617, 1.6931472, 2.7014133]. Pair 2 is the zero margin (log 2)."""
    loss, m = rf.cpo(*pairs(), beta=0.5)
    close(loss, 1.3132617, 1 + LOG2, 2.7014133)
    close(m["rewards/chosen"], -0.5, -1, -2)  # b logp_c: the summed log-probs (TRL's CPO, loss_type=sigmoid)
    close(m["rewards/margins"], 1, 0, -1.5)
    close(m["rewards/accuracies"], 1, 0, 0)  # a tie is not a win
    assert m["nll_loss"].item() == pytest.approx(1.0)


def test_cpo_without_nll_and_with_label_smoothing():
    """cpo_alpha = 0, ls = 0.1: 0.9 sp(-z) + 0.1 sp(z) = sp(-z) + 0.1 z = [0.4132617, 0.6931472, 1.5514133]."""
    close(rf.cpo(*pairs(), beta=0.5, cpo_alpha=0.0, label_smoothing=0.1)[0], 0.4132617, LOG2, 1.5514133)


def test_cpo_hinge():
    """z = b (logp_c - logp_r) = [1, 0, -1.5]; relu(1 - z) = [0, 1, 2.5]; + cpo_alpha * NLL = + 1: [1, 2, 3.5].
    Pair 1 sits on the hinge (margin 1/b reached: no loss but the NLL)."""
    loss, m = rf.cpo_hinge(*pairs(), beta=0.5)
    close(loss, 1, 2, 3.5)
    close(rf.cpo_hinge(*pairs(), beta=0.5, cpo_alpha=0.0)[0], 0, 1, 2.5)
    close(m["rewards/chosen"], -0.5, -1, -2)  # b logp_c: summed log-probs, as TRL's loss_type=hinge
    close(m["logps/rejected"], -3, -2, -1)


def test_cpo_ipo():
    """Per-token means (TRL's CPOTrainer scores ipo so): a_c - a_r = [2.5, 0.5, -3.75]; 1 / (2 b) = 1;
    (x - 1)^2 = [2.25, 0.25, 22.5625]; + NLL 1: [3.25, 1.25, 23.5625]."""
    loss, m = rf.cpo_ipo(*pairs(), beta=0.5)
    close(loss, 3.25, 1.25, 23.5625)
    close(m["logps/chosen"], -0.5, -0.5, -4)  # per-token means
    close(m["rewards/chosen"], -0.25, -0.25, -2)  # b a_c


def test_alphapo_shape():
    """AlphaPO (alpha = 1) on SimPO, gamma = 0.25: r(x) = (1 - e^-x) / 1; a_c = [-0.5, -0.5, -4] -> [1 - e^0.5,
    1 - e^0.5, 1 - e^4] = [-0.6487213, -0.6487213, -53.5981500]; a_r = [-3, -1, -0.25] -> [-19.0855369,
    -1.7182818, -0.2840254]; z = b (r_c - r_r) - gamma = [8.9684078, 0.2847803, -26.9070623];
    sp(-z) = [0.0001274, 0.5608604, 26.9070623]. Rewards b r_c = [-0.3243606, -0.3243606, -26.7990750]; logps
    stay the means. alpha = 0 is SimPO itself, and the shape's limit."""
    loss, m = rf.simpo(*pairs(), beta=0.5, gamma=0.25, alpha=1.0)
    close(loss, 0.0001274, 0.5608604, 26.9070623)
    close(m["rewards/chosen"], -0.3243606, -0.3243606, -26.7990750)
    close(m["logps/chosen"], -0.5, -0.5, -4)
    near_zero = rf.simpo(*pairs(), beta=0.5, gamma=0.25, alpha=1e-7)[0]
    torch.testing.assert_close(near_zero, rf.simpo(*pairs(), beta=0.5, gamma=0.25)[0], rtol=0, atol=1e-5)


def test_simpo():
    """a_c - a_r = [2.5, 0.5, -3.75]; gamma = 0.25: z = b (a_c - a_r) - gamma = [1.25 - 0.25, 0.25 - 0.25,
    -1.875 - 0.25] = [1, 0, -2.125]; sp(-z) = [0.3132617, log 2, 2.2378223]; pair 2 is the zero margin."""
    loss, m = rf.simpo(*pairs(), beta=0.5, gamma=0.25)
    close(loss, 0.3132617, LOG2, 2.2378223)
    close(m["logps/chosen"], -0.5, -0.5, -4)  # per-token means
    close(m["rewards/rejected"], -1.5, -0.5, -0.125)  # b a_r


def test_simpo_with_cpo_nll():
    """cpo_alpha = 0.5 adds 0.5 * NLL = 0.5 to every pair (CPO-SimPO)."""
    close(rf.simpo(*pairs(), beta=0.5, gamma=0.25, cpo_alpha=0.5)[0], 0.8132617, 0.5 + LOG2, 2.7378223)


def test_orpo():
    """log(1 - e^a): a_c -> [-0.9327521, -0.9327521, -0.0184854], a_r -> [-0.0510692, -0.4586751, -1.5086915]
    log_odds = (a_c - a_r) - (l(a_c) - l(a_r)) = [2.5 + 0.8816829, 0.5 + 0.4740770, -3.75 - 1.4902061]
             = [3.3816829, 0.9740770, -5.2402061];  logsig(log_odds) = [-0.0334253, -0.3202998, -5.2454913]
    loss = NLL - b logsig(log_odds) = 1 + 0.5 [0.0334253, 0.3202998, 5.2454913] = [1.0167127, 1.1601499, 3.6227456]."""
    loss, m = rf.orpo(*pairs(), beta=0.5)
    close(loss, 1.0167127, 1.1601499, 3.6227456)
    close(m["log_odds_chosen"], 3.3816829, 0.9740770, -5.2402061)
    close(m["log_odds_ratio"], -0.0334253, -0.3202998, -5.2454913)
    close(m["rewards/chosen"], -0.25, -0.25, -2)  # b a_c


def test_orpo_zero_margin_and_prompt_tokens():
    """Equal per-token means: log_odds = 0, logsig(0) = -log 2, loss = NLL + b log 2. The prompt tokens join the
    NLL: logp_c = [-1, -3], n_c = [1, 3], prompt_c = [-2, -1], prompt_n_c = [1, 1]: NLL = 7 / 6 = 1.1666667;
    loss = 1.1666667 + 0.5 * 0.6931472 = 1.5132403 for both pairs (a_c = a_r = [-1, -1])."""
    c, n = t(-1, -3), t(1, 3)
    loss, m = rf.orpo(c, c, t(0, 0), t(0, 0), n, n, beta=0.5, prompt_c=t(-2, -1), prompt_n_c=t(1, 1))
    close(loss, 7 / 6 + 0.5 * LOG2, 7 / 6 + 0.5 * LOG2)
    close(m["log_odds_chosen"], 0, 0)
    assert m["nll_loss"].item() == pytest.approx(7 / 6)


@pytest.mark.parametrize("fn", [rf.orpo, rf.cpo, rf.cpo_hinge, rf.cpo_ipo, rf.simpo])
def test_reference_is_never_read(fn):
    """Any reference log-probs give the same numbers: the trainer can skip scoring them."""
    a, b = fn(*pairs(-2.0), beta=0.5), fn(*pairs(7.0), beta=0.5)
    torch.testing.assert_close(a[0], b[0])
    assert rf.declares(fn, "reference_free")


def test_declarations_through_partials_and_yaml():
    """What each YAML builds (composed as ablate composes it: its structured config's `_target_` and settings)
    declares what its function does; DPO's losses need a reference."""
    from hydra import compose, initialize_config_dir

    from ablate.config.compose import register_resolvers
    from ablate.paths import conf_dir

    register_resolvers()
    for name, free, prompt in [
        ("orpo", True, True),
        ("cpo", True, False),
        ("simpo", True, False),
        ("cpo_hinge", True, False),
        ("cpo_ipo", True, False),
        ("sigmoid", False, False),
    ]:
        with initialize_config_dir(config_dir=conf_dir(), version_base="1.3"):
            fn = instantiate(compose("config", [f"method/dpo_loss={name}"]).method.dpo_loss)
        assert rf.declares(fn, "reference_free") is free, name
        assert rf.declares(fn, "scores_prompt") is prompt, name
