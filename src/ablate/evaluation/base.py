"""What every evaluation backend is given and gives back."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol


@dataclass
class Evaluand:
    """The model under evaluation and what it came from."""

    cfg: Any  # the run's composed config (DictConfig): its data, method, model (the starting one), judge
    run_dir: Path
    model: Any  # the trained policy (a reward run: its sequence classifier), adapters on where it has them
    tokenizer: Any
    info: dict[str, Any] = field(
        default_factory=dict
    )  # run.json (`data_format`: how its rows were formatted)
    device_args: dict[str, Any] = field(default_factory=dict)  # TrainingArguments for this machine (use_cpu)


@dataclass
class Result:
    """A backend's answer: metrics for eval.json (numbers only, under the backend's names), one row per
    example for eval_examples.jsonl (`id`, numeric scores named as the metrics they average into, text
    fields for W&B's table), and what it ran on (eval.json records it under the backend's name)."""

    metrics: dict[str, float]
    examples: list[dict[str, Any]] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)


class Backend(Protocol):
    """A node of conf/eval/ built by its `_target_`."""

    def check(self, cfg: Any) -> None:
        """Refuse, in one line (ConfigError), what would fail only once the run is trained: an unknown task, a
        missing package, the hub needed offline. Called before training."""

    def __call__(self, run: Evaluand) -> Result: ...
