"""Per-step metric accumulation shared by the trainers (composition, not inheritance).

`compute_loss` runs once per micro-batch; Trainer logs once every `logging_steps` optimizer steps.
Values are appended per micro-batch and averaged when Trainer calls `log` (TRL's scheme, so the
numbers and names match TRL's), with the `eval_` prefix during evaluation.
"""

from __future__ import annotations

from collections import defaultdict

import torch


class MetricsBuffer:
    def __init__(self) -> None:
        self._values: dict[str, dict[str, list[float]]] = {"train": defaultdict(list), "eval": defaultdict(list)}

    def add(self, mode: str, metrics: dict[str, torch.Tensor | float]) -> None:
        for name, value in metrics.items():
            v = value.float().mean().item() if isinstance(value, torch.Tensor) else float(value)
            self._values[mode][name].append(v)

    def pop(self, mode: str) -> dict[str, float]:
        """Averages since the last pop, `eval_`-prefixed in eval mode; clears the buffer."""
        out = {k: sum(v) / len(v) for k, v in self._values[mode].items() if v}
        self._values[mode].clear()
        return {f"eval_{k}": v for k, v in out.items()} if mode == "eval" else out
