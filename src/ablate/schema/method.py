"""A method's facts, declared once: in its YAML (conf/method/<name>.yaml, beside `name`; a method that starts
from another through its defaults list, as ORPO from DPO, inherits them and overrides what differs) and read
through `MethodSpec.of(cfg.method)` by every command that must know them: train (the data's kind, the bar's
metrics), `ablate plan` (sequences per micro-batch, a reference model in memory, the tokens of a sampled
completion), `ablate data preview/check` (the kind), `ablate eval` (generates or scores), compare (the metrics
and what defines each, recorded by the run). No command tests a method by its name. No torch here."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ablate.schema import BOOL, Rule, Schema, choice, field

REFERENCES = ("none", "precomputed", "kl", "teacher")


def _names_ok(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(m, str) for m in v)


def _names(v: Any, n: Any) -> bool:
    return _names_ok(v)


@dataclass
class MethodSpec(Schema):
    """The facts of the method node (`method.*`) that describe how it trains, not what it is set to."""

    node = "method"
    name: str = field(
        "", Rule(lambda v, n: isinstance(v, str), "a name"), "Recorded in summary.json; W&B's job_type."
    )
    data_kind: str | None = field(
        None,
        Rule(lambda v, n: v is None or isinstance(v, str), "null or a kind of ablate.data.kinds"),
        help="Its rows (ablate.data.kinds: preference, sft, prompt, reward, unpaired); null: any.",
    )
    rows: str = field(
        "singles",
        choice("pairs", "singles", words="pairs (chosen and rejected: two sequences an example) or singles"),
        "Sequences per example through the model: pairs (DPO, reward) or singles (SFT, KTO, a completion).",
    )
    reference: str = field(
        "none",
        choice(*REFERENCES),
        "none | precomputed (the starting policy scored once; live with precompute_ref_log_probs=false or a "
        "ref_model) | kl (scored each step while method.args.beta > 0) | teacher (another model, each step).",
    )
    generates: bool = field(
        False, BOOL, "Samples its own completions (rollouts): prompt-only data; a row is prompt + completion."
    )
    compare_metrics: list[str] = field(
        check=Rule(_names, "a list of metric names"),
        help="What `ablate compare` shows by default.",
        factory=lambda: ["loss"],
    )
    defined_by: dict[str, list[str]] = field(
        check=Rule(
            lambda v, n: isinstance(v, Mapping) and all(map(_names_ok, v.values())), "metric: [config keys]"
        ),
        help="Metric -> the config keys that define it: compare ranks it only between arms that agree.",
        factory=dict,
    )
    progress: dict[str, Any] | None = field(
        None,
        Rule(
            lambda v, n: v is None or isinstance(v, Mapping),
            "null or a mapping (metric, mode, min_change, ...)",
        ),
        help="What shows learning (debug=overfit, a run's summary): metric, mode, min_change, ...",
    )

    @classmethod
    def of(cls, method: Any) -> MethodSpec:  # type: ignore[override]
        """The facts of a method node (a composed config's `method`, or a saved config's, as a mapping)."""
        from ablate.schema import plain

        if not isinstance(method, Mapping) and type(method).__name__ != "DictConfig":
            method = {}
        return super().of({k: plain(method[k]) for k in cls.__dataclass_fields__ if k in method})

    def sequences(self, batch: int) -> int:
        """Sequences in a micro-batch of `batch` examples (`per_device_train_batch_size`)."""
        return 2 * batch if self.rows == "pairs" else batch

    def scores_reference(self, args: Mapping[str, Any], ref_model: bool = False) -> bool:
        """Whether a model other than the trained one is scored at every step (`args`: method.args;
        `ref_model`: one is given, `method.trainer.ref_model`)."""
        if self.reference == "precomputed":
            return ref_model or not args.get("precompute_ref_log_probs", True)
        if self.reference == "kl":
            return float(args.get("beta") or 0) > 0
        return self.reference == "teacher"

    def reference_copy(self, args: Mapping[str, Any], ref_model: bool, adapters: bool) -> bool:
        """Whether that model is a second set of weights in memory: a teacher, a given ref_model, or a frozen
        copy of the policy (with adapters the reference is the policy itself, its adapters off: no copy)."""
        return self.scores_reference(args, ref_model) and (
            self.reference == "teacher" or ref_model or not adapters
        )
