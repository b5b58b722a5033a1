"""Per-step metric accumulation shared by the trainers: a `MetricsBuffer` each, read by the one `log`
override they share (ablate.methods.base.AblateTrainer).

`compute_loss` runs once per micro-batch; Trainer logs once every `logging_steps` optimizer steps.
Values are appended per micro-batch and averaged when Trainer calls `log` (TRL's scheme, so the
numbers and names match TRL's), with the `eval_` prefix during evaluation.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch


class MetricsBuffer:
    """Per-mode lists of metric values since the last log.

    A tensor value is kept as a detached 0-d tensor on its device and read when the log pops it, all of a
    log's values in one transfer: reading each (`.item()`) would make the host wait for the device at
    every micro-step, once per metric, while the GPU has nothing queued."""

    def __init__(self) -> None:
        self._values: dict[str, dict[str, list[Any]]] = {
            "train": defaultdict(list),
            "eval": defaultdict(list),
        }
        self.totals: set[str] = set()  # names given by `set`: running totals, not per-batch values

    def add(self, mode: str, metrics: dict[str, torch.Tensor | float]) -> None:
        for name, value in metrics.items():
            v = value.detach().float().mean() if isinstance(value, torch.Tensor) else float(value)
            self._values[mode][name].append(v)

    def set(self, mode: str, name: str, value: float | torch.Tensor) -> None:
        """A running total (e.g. `num_tokens`): logged as its latest value, not averaged."""
        self.totals.add(name)
        self._values[mode][name] = [value.detach() if isinstance(value, torch.Tensor) else float(value)]

    def pop(self, mode: str) -> dict[str, float]:
        """Averages since the last pop, `eval_`-prefixed in eval mode; clears the buffer."""
        values = self._values[mode]
        tensors = [v for vs in values.values() for v in vs if isinstance(v, torch.Tensor)]
        if tensors:  # one device-to-host copy per device
            read: dict[int, float] = {}
            for device in {t.device for t in tensors}:
                on = [t for t in tensors if t.device == device]
                read.update(zip(map(id, on), torch.stack([t.double() for t in on]).tolist()))
            values = {
                k: [read[id(v)] if isinstance(v, torch.Tensor) else v for v in vs] for k, vs in values.items()
            }
        out = {k: sum(v) / len(v) for k, v in values.items() if v}
        self._values[mode].clear()
        return {f"eval_{k}": v for k, v in out.items()} if mode == "eval" else out


def over_ranks(metrics: dict[str, float]) -> dict[str, float]:
    """Each metric averaged over the ranks that have it (every rank calls this at the same log event: one
    all_gather of the dicts; a key some rank lacks, e.g. a round with no tool call, averages the others)."""
    gathered: list[dict[str, float] | None] = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(gathered, metrics)
    keys = dict.fromkeys(k for d in gathered if d for k in d)
    return {k: sum(vs) / len(vs) for k in keys if (vs := [d[k] for d in gathered if d and k in d])}


@torch.no_grad()
def completion_token_metrics(
    stats: dict[str, torch.Tensor], seq: torch.Tensor, n_pairs: int
) -> dict[str, torch.Tensor]:
    """TRL's DPO token metrics from per-token `stats` (ablate.losses.logps: `entropy`, `mean_logit`,
    `correct`) of the scored completion tokens of a `[chosen; rejected]` batch, each in sequence `seq`
    (0..n_pairs-1 chosen, then rejected): `entropy` (mean over every completion token),
    `logits/chosen` / `logits/rejected` (the vocabulary-mean logit, averaged over completion tokens)
    and `mean_token_accuracy` (argmax == next token, chosen completions only). 0-d tensors on the
    device, read with the log (MetricsBuffer)."""
    chosen = (seq < n_pairs).float()

    def avg(x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:  # 0 where no token is in m
        return (x.float() * m).sum() / m.sum().clamp_min(1)

    every = torch.ones_like(chosen)
    return {
        "entropy": avg(stats["entropy"], every),
        "logits/chosen": avg(stats["mean_logit"], chosen),
        "logits/rejected": avg(stats["mean_logit"], 1 - chosen),
        "mean_token_accuracy": avg(stats["correct"], chosen),
    }
