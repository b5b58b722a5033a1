"""`compute_metrics` hooks for evaluation, selected by `conf/compute_metrics/*.yaml`.

Trainer calls the hook once per evaluation with an `EvalPrediction` (`predictions`, `label_ids`,
numpy arrays gathered over the eval split) and logs the returned dict with the `eval_` prefix, so
`{"completion_accuracy": x}` lands in metrics.jsonl as `eval_completion_accuracy`. Labels follow the
SFT convention for every ablate trainer: token ids on completion positions, -100 elsewhere
(prompt, padding). A user hook is any importable function with this signature.
"""

from __future__ import annotations

from typing import Any


def completion_accuracy(eval_pred: Any) -> dict[str, float]:
    """Fraction of completion tokens the model predicts as its argmax next token.

    `predictions` may be logits (N, T, V) or already argmax ids (N, T) (e.g. from a
    `preprocess_logits_for_metrics` that keeps eval memory at O(N*T) instead of O(N*T*V)).
    Example: labels [[-100, 5, 6]], argmax ids [[5, 6, 0]] -> position 0 predicts 5 (correct),
    position 1 predicts 6 (correct): accuracy 2/2 = 1.0.
    """
    preds, labels = eval_pred.predictions, eval_pred.label_ids
    if isinstance(preds, tuple):  # Trainer passes extra model outputs as a tuple
        preds = preds[0]
    ids = preds.argmax(-1) if preds.ndim == 3 else preds
    target, guess = labels[:, 1:], ids[:, :-1]  # position t predicts token t+1
    mask = target != -100
    return {"completion_accuracy": float((guess == target)[mask].sum() / max(int(mask.sum()), 1))}
