"""Composing a run's config: Hydra's resolvers for run-dir names, the launch time every process of
one launch shares, and the one-line errors for config keys that moved.

No torch import here: `ablate train --cfg job` composes and prints in about a second.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import sys
from datetime import datetime


def _dirname(overrides: str, limit: int = 100) -> str:
    """Run-dir suffix from the overrides: filesystem-safe, bounded in length (hash keeps it unique)."""
    if not overrides:
        return ""
    from ablate.run.secrets import mask_text

    overrides = mask_text(overrides)  # `+model.token=hf_...` must not name a directory
    safe = re.sub(r"[^A-Za-z0-9=,._+-]", "_", overrides)
    if len(safe) > limit:
        safe = safe[:limit] + "-" + hashlib.sha1(overrides.encode()).hexdigest()[:8]
    return "_" + safe


LAUNCH_TIME_ENV = "ABLATE_LAUNCH_TIME"


def _launch_time() -> datetime:
    """When this run was launched. Every process of one launch must name the same dirs, yet each
    composes its own config: a multirun's job processes (joblib workers, SLURM jobs) inherit the
    launching process's time in ABLATE_LAUNCH_TIME (set by `publish_launch_time`); torchrun ranks
    share their launcher (the torchrun agent, their parent process), whose start time is the same
    for all of them; several nodes' agents are not one process: the user exports the same value on each."""
    if os.environ.get(LAUNCH_TIME_ENV):  # ISO (what publish_launch_time writes) or Unix seconds (`date +%s`)
        value = os.environ[LAUNCH_TIME_ENV].strip()
        return datetime.fromtimestamp(float(value)) if value.replace(".", "", 1).isdigit() else datetime.fromisoformat(value)
    if "TORCHELASTIC_RUN_ID" in os.environ:
        import psutil

        return datetime.fromtimestamp(psutil.Process(os.getppid()).create_time())
    return datetime.now()


@functools.lru_cache(maxsize=1)
def _launched() -> datetime:
    return _launch_time()


def publish_launch_time() -> None:
    """Hand this process's launch time to the processes it starts from now on (a multirun's
    jobs), so `${ablate_now:...}` in hydra.sweep.dir resolves to the same folder in all of them."""
    os.environ[LAUNCH_TIME_ENV] = _launched().isoformat()


def register_resolvers() -> None:
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver("ablate_dirname"):
        OmegaConf.register_new_resolver("ablate_dirname", _dirname)
    if not OmegaConf.has_resolver("ablate_now"):  # like Hydra's ${now:fmt}, the same for every rank
        OmegaConf.register_new_resolver("ablate_now", lambda fmt: _launched().strftime(fmt))
    if not OmegaConf.has_resolver("ablate_div"):  # GRPO's prompts per batch: completions / num_generations
        OmegaConf.register_new_resolver("ablate_div", lambda a, b: max(int(a) // int(b), 1))


# Fields that moved: the old spelling gets one line naming the new one. A value with a `/` is a config
# group (`method/loss=NAME`), else a key (`perf.padding_free=false`).
MOVED = {
    "method.args.loss_type": "method/loss",  # conf/method/loss/*.yaml (DPO losses; GRPO: method/aggregation)
    "method.args.scale_rewards": "method/scale_rewards",  # conf/method/scale_rewards/*.yaml (GRPO)
    # the speed switches, gathered in conf/perf/ (ablate.speed.plan); DPO's and GRPO's share_prompt differ
    "method.args.share_prompt": "perf.dpo_pair_rows (DPO) or perf.grpo_group_rows (GRPO)",
    "method.args.padding_free": "perf.padding_free",
    "method.args.completion_only_logits": "perf.completion_only_logits",
    "method.args.score_in_length_groups": "perf.length_groups",
    "model.lean_layers": "perf.lean_layers",
    # conf/method/generator/*.yaml (GRPO: hf | vllm); none picked = the speed plan's (perf.shared_prefill)
    "method.trainer.generator._target_": "method/generator",
}


# GRPO's token aggregations left method/loss (now DPO's losses only) for a group of their own
GRPO_AGGREGATIONS = ("grpo", "dapo", "dr_grpo", "bnpo")


def check_moved(argv: list[str]) -> None:
    """Exit with one line when an override uses a moved field (`method.args.loss_type=hinge`)."""
    for arg in argv:
        key, _, value = arg.lstrip("+~").partition("=")
        if key == "method/loss" and value in GRPO_AGGREGATIONS:
            print(f"ablate: error: method/loss={value}: GRPO's aggregations are now the group method/aggregation: "
                  f"use method/aggregation={value} (options: conf/method/aggregation/)", file=sys.stderr)
            sys.exit(2)
        if key == "method/loss" and "method=grpo" in argv:
            print(f"ablate: error: method/loss={value} is a DPO loss; GRPO's token aggregation is the group "
                  f"method/aggregation (options: conf/method/aggregation/)", file=sys.stderr)
            sys.exit(2)
        if key not in MOVED:
            continue
        new = MOVED[key]
        if key == "method.args.loss_type" and value in GRPO_AGGREGATIONS:
            new = "method/aggregation"
        if "/" in new.split(" ")[0]:
            name = value if value and "." not in value else "NAME"  # a class path is not an option name
            print(f"ablate: error: {key} is now the config group {new}: use {new}={name} "
                  f"(options: conf/{new}/)", file=sys.stderr)
        else:
            print(f"ablate: error: {key} is now {new} (conf/perf/; perf=off turns every speed path off)",
                  file=sys.stderr)
        sys.exit(2)


# `_target_`s that moved when the code was reorganised into packages by concept (commit 5692f59):
# old dotted prefix -> new one. A user's config (--config-dir, an override) naming an old one gets
# one line "X is now Y" (ablate.run.targets), not Hydra's "Error locating target".
MOVED_TARGETS = {
    "ablate.trainers.dpo": "ablate.methods.dpo",
    "ablate.trainers.sft": "ablate.methods.sft",
    "ablate.trainers.grpo": "ablate.methods.grpo",
    "ablate.trainers.metrics": "ablate.methods.metrics",
    "ablate.trainers.optim": "ablate.methods.optim",
    "ablate.trainers.generation": "ablate.rollouts.generation",
    "ablate.trainers.geometry": "ablate.rollouts.geometry",
    "ablate.trainers.scoring": "ablate.speed.scoring",
    "ablate.optimizer": "ablate.methods.schedules",
    "ablate.compute_metrics": "ablate.methods.compute_metrics",
    "ablate.debug": "ablate.callbacks.debug",
    "ablate.callbacks.MetricsJSONL": "ablate.run.callbacks.MetricsJSONL",
    "ablate.callbacks.MaskSavedArgs": "ablate.run.callbacks.MaskSavedArgs",
    "ablate.callbacks.LogAtSaveAndEnd": "ablate.run.callbacks.LogAtSaveAndEnd",
    "ablate.models.lean": "ablate.speed.lean",
    "ablate.models.packing": "ablate.speed.packing",
    "ablate.models.split": "ablate.speed.split",
    "ablate.data.groups": "ablate.speed.groups",
    "ablate.data.pairs": "ablate.speed.pairs",
    "ablate.data.format": "ablate.data.tokenize",
    "ablate.speed.Speed": "ablate.speed.throughput.Speed",
    "ablate.redact": "ablate.run.secrets",
    "ablate.validate": "ablate.run.validate",
    "ablate.rundir": "ablate.run.rundir",
    "ablate.interrupts": "ablate.run.interrupts",
    "ablate.preemption": "ablate.run.preemption",
    "ablate.sweep": "ablate.launchers.sweep",
    "ablate.sweep_resume": "ablate.launchers.sweep_resume",
    "ablate.slurm": "ablate.launchers.slurm",
}


def moved_target(target: str) -> str | None:
    """The new spelling of a `_target_` that moved (`ablate.trainers.dpo.DPOTrainer` ->
    `ablate.methods.dpo.DPOTrainer`), or None. Matches whole dotted parts, longest old prefix first."""
    for old in sorted(MOVED_TARGETS, key=len, reverse=True):
        if target == old or target.startswith(old + "."):
            return MOVED_TARGETS[old] + target[len(old):]
    return None


def quote_override_value(value: str) -> str:
    """`value` as one quoted value of Hydra's override grammar: run-dir names hold `=` and `,`, a cwd
    may hold spaces or quotes. Inside single quotes only a quote, and backslashes before a quote or
    the closing quote, are escaped (hydra/grammar/OverrideLexer.g4, QUOTED_VALUE)."""
    return "'" + re.sub(r"(\\*)('|$)", lambda m: m.group(1) * 2 + ("\\'" if m.group(2) else ""), value) + "'"
