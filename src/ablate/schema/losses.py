"""The loss nodes that take settings of their own (`conf/method/dpo_loss/`): each a structured config in
Hydra's ConfigStore (`schema/<Class>`, selected by its YAML), its `_target_` and each setting's default
declared here, once; the loss function's keyword defaults are these
(`label_smoothing: float = Sigmoid.label_smoothing`).
A loss without settings of its own (hinge, ipo, ...) is its YAML's `_target_` alone."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ablate.schema import Rule, Schema, field, fraction, is_num, number

# a probability that a preference label is flipped (robust, cDPO): 0.5 makes the labels noise
SMOOTHING = fraction(high=0.5, closed=False)
# CPO's NLL (behaviour-cloning) term's weight
CPO_ALPHA = number(at_least=0, why=" (the NLL term's weight; 0 = off)")
# AlphaPO's reward shape (Gupta et al. 2025; TRL's alpha): any finite number, 0 = the log reward
ALPHA = Rule(lambda v, n: is_num(v), "a finite number (0: the log-probs themselves)")
DPO = "ablate.losses.dpo."
FREE = "ablate.losses.reference_free."


@dataclass
class Sigmoid(Schema):
    """DPO's sigmoid loss; cDPO's label smoothing optional (Mitchell 2023)."""

    node = "method.dpo_loss"
    targets = (DPO + "sigmoid",)
    partial: ClassVar[bool] = True  # the trainer calls it with the log-probs, token counts and beta
    label_smoothing: float = field(0.0, SMOOTHING, "Probability a label is flipped; 0 = DPO (TRL's sigmoid).")


@dataclass
class Robust(Sigmoid):
    targets = (DPO + "robust",)
    label_smoothing: float = field(
        0.1, SMOOTHING, "Probability a label is flipped (the paper's typical 0.1)."
    )


@dataclass
class AOT(Sigmoid):
    targets = (DPO + "aot",)


@dataclass
class AOTUnpaired(Sigmoid):
    targets = (DPO + "aot_unpaired",)


@dataclass
class ExoPair(Sigmoid):
    targets = (DPO + "exo_pair",)
    label_smoothing: float = field(
        0.001, number(above=0, why=" (EXO's label epsilon)"), "The label's epsilon, > 0 (the paper's 1e-3)."
    )


@dataclass
class DiscoPOP(Schema):
    node = "method.dpo_loss"
    targets = (DPO + "discopop",)
    partial: ClassVar[bool] = True
    tau: float = field(0.05, number(above=0), "Modulation temperature (the paper's 0.05).")


@dataclass
class CPO(Sigmoid):
    """CPO (Xu et al. 2024): the sigmoid loss without a reference, plus cpo_alpha * NLL of the chosen rows."""

    targets = (FREE + "cpo",)
    label_smoothing: float = field(0.0, SMOOTHING, "Probability a label is flipped (TRL's CPOConfig: 0).")
    cpo_alpha: float = field(1.0, CPO_ALPHA, "Weight of the NLL term (TRL's 1.0).")
    alpha: float = field(
        0.0, ALPHA, "AlphaPO's reward shape (Gupta et al. 2025): 0 = the log-probs themselves."
    )


@dataclass
class CPOHinge(Schema):
    """CPO with SLiC's hinge (TRL's CPOConfig loss_type=hinge): no label smoothing."""

    node = "method.dpo_loss"
    targets = (FREE + "cpo_hinge",)
    partial: ClassVar[bool] = True
    cpo_alpha: float = field(1.0, CPO_ALPHA, "Weight of the NLL term (TRL's 1.0).")
    alpha: float = field(0.0, ALPHA, "AlphaPO's reward shape: 0 = the log-probs themselves (TRL's).")


@dataclass
class CPOIPO(CPOHinge):
    """CPO with IPO's squared loss (TRL's CPOConfig loss_type=ipo)."""

    targets = (FREE + "cpo_ipo",)


@dataclass
class SimPO(CPO):
    """SimPO (Meng et al. 2024): length-normalised margins and a target margin gamma."""

    targets = (FREE + "simpo",)
    gamma: float = field(
        0.5, number(at_least=0, why=" (SimPO's target margin)"), "Target reward margin (TRL's)."
    )
    cpo_alpha: float = field(
        0.0, CPO_ALPHA, "Weight of CPO's NLL term: 0 is the paper's SimPO (TRL's 1.0 is CPO-SimPO)."
    )
