"""DPO-family losses against hand-computed values (arithmetic in each docstring).

Three pairs used throughout, beta = 0.5 (sp(x) = log(1 + e^x) = -logsig(-x), sig = sigmoid):
    logp_c = [-1, -2, -4], logp_r = [-3, -2, -1], ref_c = ref_r = [-2, -2, -2]
    c = logp_c - ref_c = [1, 0, -2],  r = logp_r - ref_r = [-1, 0, 1],  delta = c - r = [2, 0, -3]
    b*c = [0.5, 0, -1],  b*r = [-0.5, 0, 0.5],  z = b*delta = [1, 0, -1.5]   (pair 2: zero margin)
    token counts n_c = [2, 4, 1], n_r = [1, 2, 4]
    sp(-1) = 0.3132617, sp(0) = log 2 = 0.6931472, sp(1.5) = 1.7014133, sp(1) = 1.3132617, sp(0.5) = 0.9740770
"""

import functools
import math
import re
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from ablate.config.compose import register_resolvers
from ablate.losses import dpo
from ablate.paths import conf_dir

LOSS_DIR = Path(__file__).resolve().parents[2] / "conf" / "method" / "dpo_loss"
LOG2 = math.log(2)


def t(*xs: float) -> torch.Tensor:
    return torch.tensor(xs, dtype=torch.float64)


def pairs() -> tuple[torch.Tensor, ...]:
    return t(-1, -2, -4), t(-3, -2, -1), t(-2, -2, -2), t(-2, -2, -2), t(2, 4, 1), t(1, 2, 4)


def close(loss: torch.Tensor, *expected: float) -> None:
    torch.testing.assert_close(loss, t(*expected), rtol=0, atol=1e-6)


def test_sigmoid():
    """-logsig(z) = sp(-z) = [sp(-1), sp(0), sp(1.5)] = [0.3132617, 0.6931472, 1.7014133]."""
    close(dpo.sigmoid(*pairs(), beta=0.5)[0], 0.3132617, LOG2, 1.7014133)


def test_sigmoid_label_smoothing():
    """ls = 0.1: 0.9 sp(-z) + 0.1 sp(z), and sp(z) = z + sp(-z), so = sp(-z) + 0.1 z
    = [0.3132617 + 0.1, 0.6931472, 1.7014133 - 0.15] = [0.4132617, 0.6931472, 1.5514133]."""
    close(dpo.sigmoid(*pairs(), beta=0.5, label_smoothing=0.1)[0], 0.4132617, LOG2, 1.5514133)


def test_hinge():
    """relu(1 - z) = [relu(0), relu(1), relu(2.5)] = [0, 1, 2.5]; pair 1 sits exactly on the margin."""
    close(dpo.hinge(*pairs(), beta=0.5)[0], 0, 1, 2.5)


def test_ipo_uses_per_token_means():
    """c/n_c = [1/2, 0/4, -2/1] = [0.5, 0, -2]; r/n_r = [-1/1, 0/2, 1/4] = [-1, 0, 0.25]
    delta = [1.5, 0, -2.25]; 1/(2 beta) = 1; (delta - 1)^2 = [0.25, 1, 10.5625]."""
    close(dpo.ipo(*pairs(), beta=0.5)[0], 0.25, 1, 10.5625)


def test_ipo_zero_tokens_count_as_one():
    """A completion with no tokens (truncated away) divides by 1, not 0: c = r = 0 -> (0 - 1)^2 = 1."""
    z = t(0.0)
    close(dpo.ipo(z, z, z, z, t(0), t(0), beta=0.5)[0], 1.0)


def test_robust():
    """ls = 0.1: (0.9 sp(-z) - 0.1 sp(z)) / 0.8 = (0.8 sp(-z) - 0.1 z) / 0.8 = sp(-z) - z/8
    = [0.3132617 - 0.125, 0.6931472, 1.7014133 + 0.1875] = [0.1882617, 0.6931472, 1.8889133]."""
    close(dpo.robust(*pairs(), beta=0.5, label_smoothing=0.1)[0], 0.1882617, LOG2, 1.8889133)


def test_exo_pair():
    """eps = 0.1, q = sig(z): q (log q - log 0.9) + (1-q) (log(1-q) - log 0.1).
    pair 2: q = 0.5: log 0.5 - 0.5 log(0.1 * 0.9) = -0.6931472 + 1.2039728 = 0.5108256
    pair 1: q = 0.7310586: 0.7310586 (-0.3132617 + 0.1053605) + 0.2689414 (-1.3132617 + 2.3025851)
            = -0.1519878 + 0.2660700 = 0.1140821
    pair 3: q = sig(-1.5) = 0.1824255: 0.1824255 (-1.7014133 + 0.1053605) + 0.8175745 (-0.2014133 + 2.3025851)
            = -0.2911620 + 1.7178656 = 1.4267037."""
    close(dpo.exo_pair(*pairs(), beta=0.5, label_smoothing=0.1)[0], 0.1140821, 0.5108256, 1.4267037)


def test_nca_pair():
    """sp(-bc) + sp(bc)/2 + sp(br)/2:
    pair 1: sp(-0.5) + sp(0.5)/2 + sp(-0.5)/2 = 0.4740770 + 0.4870385 + 0.2370385 = 1.1981540
    pair 2: log 2 (1 + 1/2 + 1/2) = 1.3862944
    pair 3: sp(1) + sp(-1)/2 + sp(0.5)/2 = 1.3132617 + 0.1566308 + 0.4870385 = 1.9569310."""
    close(dpo.nca_pair(*pairs(), beta=0.5)[0], 1.1981540, 2 * LOG2, 1.9569310)


def test_bco_pair():
    """sp(-bc) + sp(br): [sp(-0.5) + sp(-0.5), 2 log 2, sp(1) + sp(0.5)]
    = [0.9481540, 1.3862944, 1.3132617 + 0.9740770 = 2.2873387]."""
    close(dpo.bco_pair(*pairs(), beta=0.5)[0], 0.9481540, 2 * LOG2, 2.2873387)


def test_sppo_hard():
    """0.5/beta = 1: (c - 1)^2 + (r + 1)^2 = [0 + 0, 1 + 1, 9 + 4] = [0, 2, 13]."""
    close(dpo.sppo_hard(*pairs(), beta=0.5)[0], 0, 2, 13)


def test_aot_sorts_margins_across_the_batch():
    """logp_c - logp_r = [2, 0, -3] -> sorted [-3, 0, 2]; ref_c - ref_r = [0, 0, 0] -> sorted [0, 0, 0]
    z = 0.5 * [-3, 0, 2] = [-1.5, 0, 1] -> sp(-z) = [1.7014133, 0.6931472, 0.3132617] (sorted order)."""
    close(dpo.aot(*pairs(), beta=0.5)[0], 1.7014133, LOG2, 0.3132617)


def test_aot_unpaired():
    """sorted c = [-2, 0, 1], sorted r = [-1, 0, 1] -> delta = [-1, 0, 0], z = [-0.5, 0, 0]
    -> sp(-z) = [sp(0.5), log 2, log 2] = [0.9740770, 0.6931472, 0.6931472]."""
    close(dpo.aot_unpaired(*pairs(), beta=0.5)[0], 0.9740770, LOG2, LOG2)


def test_apo_zero():
    """(1 - sig(bc)) + sig(br):
    pair 1: 1 - sig(0.5) + sig(-0.5) = 2 sig(-0.5) = 2 * 0.3775407 = 0.7550813; pair 2: 0.5 + 0.5 = 1
    pair 3: 1 - sig(-1) + sig(0.5) = 0.7310586 + 0.6224593 = 1.3535179."""
    close(dpo.apo_zero(*pairs(), beta=0.5)[0], 0.7550813, 1, 1.3535179)


def test_apo_down():
    """sig(bc) + 1 - sig(z):
    pair 1: sig(0.5) + 1 - sig(1) = 0.6224593 + 0.2689414 = 0.8914007; pair 2: 0.5 + 0.5 = 1
    pair 3: sig(-1) + 1 - sig(-1.5) = 0.2689414 + 0.8175745 = 1.0865159."""
    close(dpo.apo_down(*pairs(), beta=0.5)[0], 0.8914007, 1, 1.0865159)


def test_discopop():
    """tau = 1: m = sig(z); sp(-z) (1 - m) + e^-z m, and e^-z sig(z) = sig(-z), so = sig(-z) (1 + sp(-z)):
    pair 1: 0.2689414 * 1.3132617 = 0.3531905; pair 2: 0.5 * (1 + log 2) = 0.8465736
    pair 3: sig(1.5) (1 + sp(1.5)) = 0.8175745 * 2.7014133 = 2.2086065."""
    close(dpo.discopop(*pairs(), beta=0.5, tau=1.0)[0], 0.3531905, 0.8465736, 2.2086065)


def test_sigmoid_norm():
    """Per-token-mean margin as in IPO: [1.5, 0, -2.25]; z = 0.5 * that = [0.75, 0, -1.125]
    sp(-0.75) = log(1 + 0.4723666) = 0.3868710; log 2; sp(1.125) = log(1 + 3.0802168) = 1.4061501."""
    close(dpo.sigmoid_norm(*pairs(), beta=0.5)[0], 0.3868710, LOG2, 1.4061501)


def test_sft_is_the_token_mean_nll_of_the_chosen():
    """-sum(logp_c) / sum(n_c) = -(-1 - 2 - 4) / (2 + 4 + 1) = 7/7 = 1, given to every pair."""
    close(dpo.sft(*pairs(), beta=0.5)[0], 1, 1, 1)


def test_weighted_is_the_weighted_sum_and_logs_each_term():
    """MPO's weights: 0.8 sigmoid + 0.2 bco_pair + 1.0 sft:
    pair 1: 0.8 * 0.3132617 + 0.2 * 0.9481540 + 1 = 0.2506094 + 0.1896308 + 1 = 1.4402402
    pair 2: 0.8 * 0.6931472 + 0.2 * 1.3862944 + 1 = 0.5545177 + 0.2772589 + 1 = 1.8317766
    pair 3: 0.8 * 1.7014133 + 0.2 * 2.2873387 + 1 = 1.3611306 + 0.4574677 + 1 = 2.8185984
    loss/sigmoid = mean(0.3132617, 0.6931472, 1.7014133) = 0.9026074."""
    loss, m = dpo.weighted(
        *pairs(), beta=0.5, losses=[dpo.sigmoid, dpo.bco_pair, dpo.sft], weights=[0.8, 0.2, 1.0]
    )
    close(loss, 1.4402402, 1.8317766, 2.8185984)
    assert m["loss/sigmoid"].item() == pytest.approx(0.9026074, abs=1e-6)
    assert m["loss/sft"].item() == pytest.approx(1.0)
    with pytest.raises(ValueError, match="2 weights for 3 losses"):
        dpo.weighted(*pairs(), beta=0.5, losses=[dpo.sigmoid, dpo.bco_pair, dpo.sft], weights=[0.8, 0.2])


def test_reward_metrics():
    """rewards: chosen = 0.5 c = [0.5, 0, -1], rejected = 0.5 r = [-0.5, 0, 0.5], margins = [1, 0, -1.5];
    accuracies (chosen > rejected, strict) = [1, 0, 0]."""
    logp_c, logp_r, ref_c, ref_r, _, _ = pairs()
    m = dpo.reward_metrics(logp_c, logp_r, ref_c, ref_r, beta=0.5)
    close(m["rewards/chosen"], 0.5, 0, -1)
    close(m["rewards/rejected"], -0.5, 0, 0.5)
    close(m["rewards/margins"], 1, 0, -1.5)
    assert m["rewards/accuracies"].tolist() == [1.0, 0.0, 0.0]
    assert m["logps/chosen"].tolist() == [-1, -2, -4] and m["logps/rejected"].tolist() == [-3, -2, -1]


def test_hinge_gradient_vanishes_past_margin():
    """beta=1, delta=2 -> 1 - 2 < 0 -> relu = 0 -> d/dlogp_c = 0; delta=0.5 -> d/dlogp_c = -beta = -1."""
    logp_c = t(0.0, -1.5).requires_grad_()
    z = t(0, 0)
    loss, _ = dpo.hinge(logp_c, t(-2, -2), z, z, t(1, 1), t(1, 1), beta=1.0)
    loss.sum().backward()
    assert logp_c.grad.tolist() == [0.0, -1.0]


def test_sigmoid_gradient_at_zero_margin():
    """d/d(logp_c) of -logsigmoid(beta*delta) = -beta*sigmoid(-beta*delta) = -0.1 * 0.5 = -0.05 at delta=0."""
    logp_c = t(-2.0).requires_grad_()
    loss, _ = dpo.sigmoid(logp_c, t(-2), t(-2), t(-2), t(1), t(1), beta=0.1)
    loss.sum().backward()
    assert logp_c.grad.item() == pytest.approx(-0.05)


def _dpo_loss(path: Path) -> bool:
    """A DPO loss's YAML: its `_target_`, or its structured config's (ablate.schema.losses), in losses.dpo."""
    from ablate.schema import losses

    named = [getattr(losses, n, None) for n in re.findall(r"/schema@_here_:\s*(\w+)", path.read_text())]
    return "losses.dpo." in path.read_text() or any(c.targets[0].startswith(losses.DPO) for c in named if c)


DPO_FILES = sorted(p for p in LOSS_DIR.glob("*.yaml") if _dpo_loss(p))


@pytest.mark.parametrize("path", DPO_FILES, ids=lambda p: p.stem)
def test_every_dpo_loss_yaml_is_a_partial_of_its_function(path: Path):
    """`method/dpo_loss=<name>`, composed as ablate composes it (a loss with settings: from its structured
    config, ablate.schema.losses), instantiates to a partial of ablate.losses.dpo.<function>, which runs on the pairs
    above with the config's hyper-parameters and gives one finite loss per pair."""
    register_resolvers()
    with initialize_config_dir(config_dir=conf_dir(), version_base="1.3"):
        cfg = compose("config", overrides=["method=dpo", f"method/dpo_loss={path.stem}"])
    fn = instantiate(cfg.method.dpo_loss)
    assert isinstance(fn, functools.partial)
    expected = "weighted" if path.stem == "mpo" else path.stem
    assert dpo.name(fn) == expected
    loss, _ = fn(*pairs(), beta=0.5)
    assert loss.shape == (3,) and torch.isfinite(loss).all()


def test_the_loss_files_cover_trls_set():
    trl = {
        "sigmoid",
        "hinge",
        "ipo",
        "exo_pair",
        "nca_pair",
        "robust",
        "bco_pair",
        "sppo_hard",
        "aot",
        "aot_unpaired",
        "apo_zero",
        "apo_down",
        "discopop",
        "sft",
        "sigmoid_norm",
    }
    assert trl | {"mpo"} == {p.stem for p in DPO_FILES}
