"""The TRL docs' "change the training objective" example, done the ablate way.

`MyDPOTrainer` subclasses ablate's DPOTrainer and overrides only `compute_loss` with the hinge loss
(SLiC, arXiv:2305.10425 / 2309.06657); `MyDPOConfig` adds a field, `my_coef`. Data preparation,
the reference log-probs, logging and checkpoints are inherited. Nothing in ablate is edited: the
method YAML next to this file points `_target_` at these classes.

    PYTHONPATH=examples/hinge_subclass ablate train --config-dir examples/hinge_subclass method=my_hinge

With `my_coef: 0` the losses equal `method=dpo_hinge`'s step for step (tests/integration/test_examples.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ablate.losses.logps import selective_log_softmax
from ablate.methods.dpo import DPOConfig, DPOTrainer


@dataclass
class MyDPOConfig(DPOConfig):
    my_coef: float = field(
        default=0.1, metadata={"help": "Weight of an extra NLL term on the chosen completion."}
    )


class MyDPOTrainer(DPOTrainer):
    def compute_loss(
        self,
        model: torch.nn.Module,
        inputs: dict[str, Any],
        return_outputs: bool = False,
        num_items_in_batch: Any = None,
    ) -> torch.Tensor:
        input_ids, attention_mask = inputs["input_ids"], inputs["attention_mask"]
        shift_labels, shift_completion_mask = input_ids[:, 1:], inputs["completion_mask"][:, 1:]
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
        # Sum the log-probs over the completion tokens
        logps = (selective_log_softmax(logits[:, :-1], shift_labels) * shift_completion_mask).sum(dim=1)
        chosen_logps, rejected_logps = logps.chunk(2, dim=0)  # batch is [chosen, rejected]
        if self.ref_model is None:  # ablate's default: reference log-probs precomputed into the batch
            ref_chosen_logps, ref_rejected_logps = inputs["ref_chosen_logps"], inputs["ref_rejected_logps"]
        else:  # a live reference (+ref_model=live, live_8bit, ...), as in the TRL docs
            with torch.no_grad():
                ref_logits = self.ref_model(input_ids=input_ids, attention_mask=attention_mask).logits
            ref_logps = (selective_log_softmax(ref_logits[:, :-1], shift_labels) * shift_completion_mask).sum(
                dim=1
            )
            ref_chosen_logps, ref_rejected_logps = ref_logps.chunk(2, dim=0)

        delta = (chosen_logps - ref_chosen_logps) - (rejected_logps - ref_rejected_logps)
        loss = torch.relu(1 - self.args.beta * delta).mean()
        return loss - self.args.my_coef * chosen_logps.mean()  # the config field in use
