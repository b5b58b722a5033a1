"""What a run prints while it trains: one progress bar carrying the key metrics, text that never
lands on the bar's line, and Trainer's full log dicts in `<run_dir>/ablate.log` only.

transformers' ProgressCallback writes every log event as a 20-key dict line under the bar
(`{'loss': '0.6534', 'grad_norm': ...}`); `Progress` writes that line to ablate.log and shows the
metrics that matter on the bar itself (`loss`, the method's `compare_metrics`, tokens/s, MFU and the
peak it is measured against). Everything a run logs is still in metrics.jsonl.
"""

from __future__ import annotations

from typing import Any

from transformers.trainer_callback import ProgressCallback

from ablate.process.console import print_above_bar, to_log_file, track


def _fmt(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


class Progress(ProgressCallback):
    """transformers' progress bar, with its per-log dict lines sent to ablate.log and the key
    metrics shown as the bar's postfix instead; an eval event is one short line above the bar."""

    def __init__(self, metrics: list[str] | None = None) -> None:
        super().__init__()
        # loss first, then the method's own (its YAML's compare_metrics), each once
        self.metrics = list(dict.fromkeys(["loss", *(metrics or [])]))
        self.parts: dict[
            str, str
        ] = {}  # postfix pieces by owner ("metrics"; "speed" from ablate.speed.throughput)

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        super().on_train_begin(args, state, control, **kwargs)
        track(self.training_bar)  # a last line (an error) ends it first: ablate.process.console.say

    def on_prediction_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        super().on_prediction_step(args, state, control, **kwargs)
        track(self.prediction_bar)

    def show(self, owner: str, text: str) -> None:
        """Set one piece of the postfix (the metrics, or the speed callback's tokens/s and MFU)."""
        self.parts[owner] = text
        if self.training_bar is not None:
            ordered = [self.parts[k] for k in ("metrics", "speed") if k in self.parts]
            ordered += [v for k, v in self.parts.items() if k not in ("metrics", "speed")]
            self.training_bar.set_postfix_str(" | ".join(ordered), refresh=True)

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any
    ) -> None:
        if not state.is_world_process_zero or not logs:
            return
        to_log_file(str({k: _fmt(v) for k, v in logs.items() if k != "total_flos"}))
        if "loss" in logs:
            shown = [f"{k} {_fmt(logs[k])}" for k in self.metrics if isinstance(logs.get(k), (int, float))]
            self.show("metrics", ", ".join(shown))
        elif any(k.startswith("eval_") for k in logs):
            shown = [
                f"{k} {_fmt(logs['eval_' + k])}"
                for k in self.metrics
                if isinstance(logs.get("eval_" + k), (int, float))
            ]
            print_above_bar(
                f"eval at step {state.global_step}: "
                + ", ".join(shown or [f"{k} {_fmt(v)}" for k, v in logs.items() if k.startswith("eval_")][:4])
            )


def install(trainer: Any, metrics: list[str] | None) -> None:
    """Swap Trainer's ProgressCallback (added when method.args.disable_tqdm is false) for `Progress`."""
    if any(type(cb) is ProgressCallback for cb in trainer.callback_handler.callbacks):
        trainer.remove_callback(ProgressCallback)
        trainer.add_callback(Progress(metrics))
