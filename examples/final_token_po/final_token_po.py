"""Final-token preference optimisation as a user trainer subclass (no edit to ablate).

The idea behind Antidoom's Final Token Preference Optimization (Antislop, Paech et al. 2025): the
preference is about *one* next token, the first where the chosen and rejected continuations part,
so the loss looks only at that position instead of summing log-probs over whole completions. With
    j      = first position where the chosen and rejected sequences differ (they share the prompt)
    lc, lr = policy log-prob of the chosen / rejected token at j, given the shared prefix
    rc, rr = the same under the frozen reference
the loss is DPO's sigmoid on that single token: -log sigmoid(beta * ((lc - rc) - (lr - rr))), i.e.
`ablate.losses.dpo.sigmoid` fed per-token instead of per-sequence log-probs. Departures from the
paper: FTPO adds a logit-space margin and a regulariser on the remaining logits; this example keeps
the smallest version. Pairs that never differ (one a prefix of the other) are masked out.

It needs per-token reference log-probs, so it runs with a live reference
(`precompute_ref_log_probs: false`, set by the method YAML).

    PYTHONPATH=examples/final_token_po ablate train --config-dir examples/final_token_po method=final_token_po
"""

from __future__ import annotations

from typing import Any

import torch

from ablate.losses import dpo as dpo_losses
from ablate.losses.logps import token_logps
from ablate.methods.dpo import DPOTrainer


def divergence_index(chosen: torch.Tensor, rejected: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per pair, the first position where the two id rows differ, and whether they differ at all.

    Example: [5, 6, 7, 0] vs [5, 6, 8, 9] -> (2, True); [5, 6, 0] vs [5, 6, 0] -> (0, False).
    """
    differ = chosen != rejected
    return differ.float().argmax(dim=1), differ.any(dim=1)


def final_token_logps(per_token: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """`per_token[:, t]` scores token t+1, so the token at position j is `per_token[:, j - 1]`."""
    return per_token.gather(1, (index - 1).clamp_min(0).unsqueeze(1)).squeeze(1)


class FinalTokenPOTrainer(DPOTrainer):
    def compute_loss(
        self,
        model: torch.nn.Module,
        inputs: dict[str, Any],
        return_outputs: bool = False,
        num_items_in_batch: Any = None,
    ) -> torch.Tensor | tuple[torch.Tensor, dict[str, torch.Tensor]]:
        ids = inputs["input_ids"]
        chosen, rejected = ids.chunk(2)
        j, valid = divergence_index(chosen, rejected)
        logits = model(input_ids=ids, attention_mask=inputs["attention_mask"], use_cache=False).logits
        with torch.no_grad():
            ref_logits = self.ref_model(
                input_ids=ids, attention_mask=inputs["attention_mask"], use_cache=False
            ).logits
        lc, lr = final_token_logps(token_logps(logits, ids), j.repeat(2)).chunk(2)
        rc, rr = final_token_logps(token_logps(ref_logits, ids), j.repeat(2)).chunk(2)
        one = torch.ones_like(lc)  # one token per sequence: the position where the pair diverges
        losses, _ = dpo_losses.sigmoid(lc, lr, rc, rr, one, one, beta=self.args.beta)
        metrics = dpo_losses.reward_metrics(lc, lr, rc, rr, self.args.beta)
        loss = (losses * valid).sum() / valid.sum().clamp_min(1)
        self.metrics.add(
            "train" if model.training else "eval", {f"final_token/{k}": v[valid] for k, v in metrics.items()}
        )
        return (loss, {"logits": logits}) if return_outputs else loss
