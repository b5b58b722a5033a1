"""Per-step metric accumulation shared by the trainers: a `MetricsBuffer` each, and `LogsMetrics`,
the one `log` override they share.

`compute_loss` runs once per micro-batch; Trainer logs once every `logging_steps` optimizer steps.
Values are appended per micro-batch and averaged when Trainer calls `log` (TRL's scheme, so the
numbers and names match TRL's), with the `eval_` prefix during evaluation.
"""

from __future__ import annotations

from collections import defaultdict

import torch


class MetricsBuffer:
    """Per-mode lists of metric values since the last log."""

    def __init__(self) -> None:
        self._values: dict[str, dict[str, list[float]]] = {"train": defaultdict(list), "eval": defaultdict(list)}
        self.totals: set[str] = set()  # names given by `set`: running totals, not per-batch values

    def add(self, mode: str, metrics: dict[str, torch.Tensor | float]) -> None:
        for name, value in metrics.items():
            v = value.float().mean().item() if isinstance(value, torch.Tensor) else float(value)
            self._values[mode][name].append(v)

    def set(self, mode: str, name: str, value: float) -> None:
        """A running total (e.g. `num_tokens`): logged as its latest value, not averaged."""
        self.totals.add(name)
        self._values[mode][name] = [float(value)]

    def pop(self, mode: str) -> dict[str, float]:
        """Averages since the last pop, `eval_`-prefixed in eval mode; clears the buffer."""
        out = {k: sum(v) / len(v) for k, v in self._values[mode].items() if v}
        self._values[mode].clear()
        return {f"eval_{k}": v for k, v in out.items()} if mode == "eval" else out


class LogsMetrics:
    """Mixin for a Trainer whose `compute_loss` fills `self.metrics` (a MetricsBuffer): every log event
    gets the averages since the previous one (train or eval, by the model's mode)."""

    metrics: MetricsBuffer

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        logs.update(self.metrics.pop("train" if self.model.training else "eval"))  # type: ignore[attr-defined]
        super().log(logs, start_time)  # type: ignore[misc]


@torch.no_grad()
def token_metrics(logits: torch.Tensor, input_ids: torch.Tensor, completion_mask: torch.Tensor) -> dict[str, float]:
    """TRL's DPO token metrics from a `[chosen; rejected]` batch: `entropy` (mean over every completion
    token), `logits/chosen` / `logits/rejected` (the vocabulary-mean logit, averaged over completion
    tokens) and `mean_token_accuracy` (argmax == next token, chosen completions only)."""
    logits, target, mask = logits[:, :-1], input_ids[:, 1:], completion_mask[:, 1:].bool()
    # one sequence at a time: a float32 log-softmax of the whole batch would triple the logits' memory
    entropy = torch.stack([_entropy(row.float()) for row in logits])
    mean_logits = logits.float().mean(-1)
    correct = logits.argmax(-1) == target
    mc, mr = mask.chunk(2)
    lc, lr = mean_logits.chunk(2)

    def avg(x: torch.Tensor, m: torch.Tensor) -> float:
        return (x[m].sum() / m.sum()).item() if m.any() else 0.0

    return {"entropy": avg(entropy, mask), "logits/chosen": avg(lc, mc), "logits/rejected": avg(lr, mr),
            "mean_token_accuracy": avg(correct.chunk(2)[0].float(), mc)}


def _entropy(logits: torch.Tensor) -> torch.Tensor:
    logp = torch.log_softmax(logits, dim=-1)
    return -(logp.exp() * logp).sum(-1)


@torch.no_grad()
def completion_token_metrics(stats: dict[str, torch.Tensor], seq: torch.Tensor, n_pairs: int) -> dict[str, float]:
    """`token_metrics` from per-token `stats` (`ablate.losses.logps.completion_logps`) of the scored
    completion tokens only, each in sequence `seq` (0..n_pairs-1 chosen, then rejected): the same
    averages over the same tokens, without logits at every position."""
    chosen = seq < n_pairs

    def avg(x: torch.Tensor, m: torch.Tensor) -> float:
        return (x[m].float().sum() / m.sum()).item() if m.any() else 0.0

    every = torch.ones_like(chosen)
    return {"entropy": avg(stats["entropy"], every), "logits/chosen": avg(stats["mean_logit"], chosen),
            "logits/rejected": avg(stats["mean_logit"], ~chosen), "mean_token_accuracy": avg(stats["correct"], chosen)}
