"""Reference-free preference losses: ORPO, CPO and SimPO, as pure functions with the DPO losses' signature.

They take what every `ablate.losses.dpo` loss takes (the summed completion log-probs `logp_c`, `logp_r`,
the token counts `n_c`, `n_r`, `beta`), and run in the same trainer (ablate.methods.dpo), but they are
marked `reference_free`: the trainer then scores no reference (no forward, no precomputed column, no
cache entry) and passes zeros as `ref_c`, `ref_r`, which these losses never read. A loss marked
`scores_prompt` also gets `prompt_c`, `prompt_n_c`: the summed log-probs and the count of the chosen
rows' prompt tokens (all but the first, which nothing predicts).

Formulas, names and metrics as TRL 1.16's `trl.experimental` trainers, with `nll` the token mean of the
chosen rows' NLL over the whole batch, `a_c = logp_c / n_c`, `a_r = logp_r / n_r` (per-token means):
- orpo    nll_seq - b * logsig(log_odds),  log_odds = (a_c - a_r) - (log(1 - e^a_c) - log(1 - e^a_r))
          ORPO, Hong et al. 2024 eq. 6-7 (b is the paper's lambda). As TRL's ORPOTrainer, the NLL term
          `nll_seq` counts the prompt tokens too (the paper's eq. 2 counts the response only).
- cpo     -(1-ls) logsig(b (logp_c - logp_r)) - ls logsig(-b (...)) + cpo_alpha * nll
          CPO, Xu et al. 2024 eq. 3-4 (TRL's CPOTrainer, loss_type=sigmoid): DPO without the reference,
          plus NLL on the chosen completions (the behaviour-cloning term).
- cpo_hinge  relu(1 - b (logp_c - logp_r)) + cpo_alpha * nll
          CPO with SLiC's hinge (TRL's CPOTrainer, loss_type=hinge; Zhao et al. 2023), summed log-probs.
- cpo_ipo  (a_c - a_r - 1 / (2 b))^2 + cpo_alpha * nll
          CPO with IPO's squared loss (TRL's CPOTrainer, loss_type=ipo; Azar et al. 2023 eq. 17, b the
          paper's tau), on per-token means as TRL's CPOTrainer scores ipo.
- simpo   -(1-ls) logsig(b (a_c - a_r) - gamma) - ls logsig(-(...)) + cpo_alpha * nll
          SimPO, Meng et al. 2024 eq. 6 (TRL's CPOTrainer, loss_type=simpo): length-normalised rewards
          and a target margin gamma; cpo_alpha = 0 is the paper's (TRL's default 1.0 adds CPO's NLL).
AlphaPO (Gupta et al. 2025, arXiv:2501.03884; TRL's `alpha`, and loss_type=alphapo: simpo with cpo_alpha 0):
every loss but orpo takes `alpha`, which replaces each log-prob x it compares by the reward
(1 - e^(-alpha x)) / alpha (the paper's r = (1 - p^-alpha) / alpha); alpha = 0, the default, is x itself.
Each returns TRL's metrics for its trainer: `rewards/*` are b times the rewards the loss compares (the
log-probs, or their AlphaPO shape: sums for cpo and cpo_hinge, means for orpo, cpo_ipo and simpo), `logps/*`
the log-probs, and `nll_loss`; orpo also `log_odds_ratio` (logsig(log_odds)) and `log_odds_chosen` (log_odds).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch
import torch.nn.functional as F

from ablate.losses.dpo import compared, per_token, smoothed, token_nll
from ablate.schema import losses as L

Tensor = torch.Tensor
F_ = TypeVar("F_", bound=Callable[..., object])


def reference_free(fn: F_) -> F_:
    """Mark a loss that reads no reference log-probs: its trainer scores no reference model."""
    fn.reference_free = True  # type: ignore[attr-defined]
    return fn


def declares(fn: Callable[..., object], what: str) -> bool:
    """Whether a (possibly partial) loss is marked `what` (`reference_free`, `scores_prompt`): what its
    trainer computes for it. A loss of ablate.losses.dpo, or the user's, declares nothing: it needs it all."""
    while hasattr(fn, "func") and not hasattr(fn, what):
        fn = fn.func  # functools.partial
    return bool(getattr(fn, what, False))


def _metrics(
    beta: float, c: Tensor, r: Tensor, nll: Tensor, logps: tuple[Tensor, Tensor] | None = None
) -> dict[str, Tensor]:
    """TRL's: rewards b * (the compared rewards c, r), per pair; logps (c, r unless given); the NLL term."""
    return {**compared(beta, c, r, *(logps or (c, r))), "nll_loss": nll.detach()}


def _with_nll(
    margin_loss: Callable[[Tensor], Tensor],
    logps: tuple[Tensor, Tensor],
    logp_c: Tensor,
    n_c: Tensor,
    beta: float,
    cpo_alpha: float,
    alpha: float,
) -> tuple[Tensor, dict[str, Tensor]]:
    """CPO's frame (TRL's CPOTrainer): `margin_loss` of the margin c - r between the compared rewards (the
    log-probs `logps`, summed or per-token means, AlphaPO-shaped), plus cpo_alpha * NLL(chosen); metrics."""
    nll = token_nll(logp_c, n_c)
    c, r = _shaped(logps[0], alpha), _shaped(logps[1], alpha)
    return margin_loss(c - r) + cpo_alpha * nll, _metrics(beta, c, r, nll, logps)


def _shaped(logp: Tensor, alpha: float) -> Tensor:
    """AlphaPO's reward of a log-prob x: (1 - e^(-alpha x)) / alpha, TRL's (1 - p^-alpha) / alpha, p = e^x;
    alpha = 0: x itself (the limit), the log reward of CPO and SimPO."""
    return logp if alpha == 0 else -torch.expm1(-alpha * logp) / alpha


def _log1mexp(x: Tensor) -> Tensor:
    """log(1 - e^x) for x < 0, stable on both sides of -ln 2 (Maechler 2012; TRL's)."""
    return torch.where(x < -0.6931471805599453, torch.log1p(-torch.exp(x)), torch.log(-torch.expm1(x)))


@reference_free
def orpo(
    logp_c: Tensor,
    logp_r: Tensor,
    ref_c: Tensor,
    ref_r: Tensor,
    n_c: Tensor,
    n_r: Tensor,
    beta: float,
    prompt_c: Tensor | None = None,
    prompt_n_c: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """ORPO: NLL of the chosen rows (prompt tokens too when given) - beta * log sigmoid(log odds ratio)."""
    a_c, a_r = per_token(logp_c.float(), logp_r.float(), n_c, n_r)
    log_odds = (a_c - a_r) - (_log1mexp(a_c) - _log1mexp(a_r))
    ratio = F.logsigmoid(log_odds)
    seq_logp = logp_c if prompt_c is None else logp_c + prompt_c
    seq_n = n_c if prompt_n_c is None else n_c + prompt_n_c
    nll = token_nll(seq_logp, seq_n)
    metrics = {
        **_metrics(beta, a_c, a_r, nll),
        "log_odds_ratio": ratio.detach(),
        "log_odds_chosen": log_odds.detach(),
    }
    return nll - beta * ratio, metrics


orpo.scores_prompt = True  # type: ignore[attr-defined]  # TRL's NLL term counts the prompt tokens


@reference_free
def cpo(
    logp_c: Tensor,
    logp_r: Tensor,
    ref_c: Tensor,
    ref_r: Tensor,
    n_c: Tensor,
    n_r: Tensor,
    beta: float,
    label_smoothing: float = L.CPO.label_smoothing,
    cpo_alpha: float = L.CPO.cpo_alpha,
    alpha: float = L.CPO.alpha,
) -> tuple[Tensor, dict[str, Tensor]]:
    """CPO: DPO's sigmoid loss on the summed log-probs without a reference, plus cpo_alpha * NLL(chosen)."""
    return _with_nll(
        lambda d: smoothed(beta * d, label_smoothing), (logp_c, logp_r), logp_c, n_c, beta, cpo_alpha, alpha
    )


@reference_free
def cpo_hinge(
    logp_c: Tensor,
    logp_r: Tensor,
    ref_c: Tensor,
    ref_r: Tensor,
    n_c: Tensor,
    n_r: Tensor,
    beta: float,
    cpo_alpha: float = L.CPOHinge.cpo_alpha,
    alpha: float = L.CPOHinge.alpha,
) -> tuple[Tensor, dict[str, Tensor]]:
    """CPO with the hinge: relu(1 - beta * (logp_c - logp_r)) on summed log-probs, plus cpo_alpha * NLL."""
    return _with_nll(
        lambda d: torch.relu(1 - beta * d), (logp_c, logp_r), logp_c, n_c, beta, cpo_alpha, alpha
    )


@reference_free
def cpo_ipo(
    logp_c: Tensor,
    logp_r: Tensor,
    ref_c: Tensor,
    ref_r: Tensor,
    n_c: Tensor,
    n_r: Tensor,
    beta: float,
    cpo_alpha: float = L.CPOIPO.cpo_alpha,
    alpha: float = L.CPOIPO.alpha,
) -> tuple[Tensor, dict[str, Tensor]]:
    """CPO with IPO's loss: (a_c - a_r - 1/(2 beta))^2 on per-token means, plus cpo_alpha * NLL."""
    means = per_token(logp_c, logp_r, n_c, n_r)
    return _with_nll(lambda d: (d - 1 / (2 * beta)) ** 2, means, logp_c, n_c, beta, cpo_alpha, alpha)


@reference_free
def simpo(
    logp_c: Tensor,
    logp_r: Tensor,
    ref_c: Tensor,
    ref_r: Tensor,
    n_c: Tensor,
    n_r: Tensor,
    beta: float,
    gamma: float = L.SimPO.gamma,
    label_smoothing: float = L.SimPO.label_smoothing,
    cpo_alpha: float = L.SimPO.cpo_alpha,
    alpha: float = L.SimPO.alpha,
) -> tuple[Tensor, dict[str, Tensor]]:
    """SimPO: -log sigmoid(beta * (a_c - a_r) - gamma) on per-token means, plus cpo_alpha * NLL(chosen)."""
    means = per_token(logp_c, logp_r, n_c, n_r)
    return _with_nll(
        lambda d: smoothed(beta * d - gamma, label_smoothing), means, logp_c, n_c, beta, cpo_alpha, alpha
    )
