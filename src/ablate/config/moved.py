"""Config spellings that changed. Three kinds, each said in one line:

- a renamed group (ablate.schema.renamed: `perf` -> `speed`, `method/loss` -> `method/dpo_loss`, ...): the
  old spelling still works for one release, rewritten to the new one (`rename`), with a notice naming it;
- a field that moved into a group or another node (`MOVED`: `method.args.loss_type=hinge`): refused,
  naming the new spelling (`check_moved`);
- a `_target_` whose module moved (`MOVED_TARGETS`): refused, "X is now Y" (ablate.config.targets).

No torch import here."""

from __future__ import annotations

import atexit
import sys
from typing import Any

from omegaconf import OmegaConf

from ablate.schema.renamed import current

_said: set[str] = set()  # old names already noted by this process
_held: list[str] = []  # notes not said yet: said once the config is accepted, else folded into the refusal's line


def note(old: str, new: str) -> None:
    """One line, once per old name and process: the old spelling works, and what to write instead. Held
    until the config is accepted (`say_notes`): a refusal is one line, the renames folded into it (`folded`)."""
    if old not in _said:
        _said.add(old)
        _held.append(f"{old} is now {new}")


def say_notes() -> None:
    """Print the notes held so far, one line each."""
    for line in _held:
        print(f"ablate: note: {line} (the old name works until the next release)", file=sys.stderr)
    _held.clear()


def folded(line: str) -> str:
    """A refusal's `line` with the renames held so far (it names today's keys, not the ones typed)."""
    out = f"{line} ({'; '.join(_held)})" if _held else line
    _held.clear()
    return out


atexit.register(say_notes)  # a command that neither refused nor said them (ablate train --cfg job): at its end


def rename(overrides: list[str]) -> list[str]:
    """`overrides` in today's names (the renamed groups and their keys), each old name noted once."""
    out = []
    for override in overrides:
        new, old = current(str(override))
        if old is not None:
            note(old, current(old)[0])
        out.append(new)
    return out


def rename_params(params: Any) -> None:
    """A sweep file's `hydra.sweeper.params` keys in today's names (in place; each old name noted once)."""
    if params is None:
        return
    from omegaconf import open_dict, read_write

    for key in list(params.keys()):
        new, old = current(f"{key}=")
        if old is not None:
            note(old, current(old)[0])
            with read_write(params), open_dict(params):
                params[new[:-1]] = params.pop(key)


def note_aliases(hc: Any) -> None:
    """A YAML of the user's that still includes an old file kept for one release: a model option's
    `lr: pretrained` (a choice of model/lr), a method's `/trainers/common_args@args` (an include Hydra
    records nowhere, so the user's config dirs are read for it). It works; the notice says what to write."""
    choices = OmegaConf.select(hc, "runtime.choices", default=None) or {}
    if any(str(group).split("@")[0] == "model/lr" and choices[group] for group in choices):
        note("model/lr/pretrained", "optimizer/lr (conf/optimizer/lr/<model>.yaml, picked for the model by conf/config.yaml)")
    sources = OmegaConf.select(hc, "runtime.config_sources", default=None) or []
    for source in sources:
        if source.get("provider") in ("command-line", "hydra.searchpath in command-line") and source.get("schema") == "file":
            from pathlib import Path

            if any("trainers/common_args" in p.read_text(errors="replace") for p in Path(source.path).rglob("*.yaml")):
                note("trainers/common_args", "/training_args@args (conf/training_args.yaml)")


# Fields that moved into a group or node: the old spelling is refused with one line naming the new one.
# A value with a `/` is a config group (`method/dpo_loss=NAME`), else a key (`speed.padding_free=false`).
MOVED = {
    "method.args.loss_type": "method/dpo_loss",  # DPO losses (GRPO's aggregations: method/grpo_aggregation)
    "method.args.scale_rewards": "method/grpo_scale_rewards",
    # the speed switches, gathered in conf/speed/ (ablate.speed.plan); DPO's and GRPO's share_prompt differ
    "method.args.share_prompt": "speed.dpo_pair_rows (DPO) or speed.grpo_group_rows (GRPO)",
    "method.args.padding_free": "speed.padding_free",
    "method.args.completion_only_logits": "speed.completion_only_logits",
    "method.args.score_in_length_groups": "speed.length_groups",
    "model.lean_layers": "speed.lean_layers",
    # conf/method/rollouts/*.yaml (hf | vllm); none picked = the speed plan's (speed.shared_prefill)
    "method.trainer.generator._target_": "method/rollouts",
}


# GRPO's token aggregations left the DPO loss group for a group of their own
GRPO_AGGREGATIONS = ("grpo", "dapo", "dr_grpo", "bnpo")


def check_moved(argv: list[str]) -> None:
    """Exit with one line when an override uses a moved field (`method.args.loss_type=hinge`) or picks a
    DPO loss for GRPO (run on `rename`d overrides)."""
    for arg in argv:
        key, _, value = arg.lstrip("+~").partition("=")
        if key == "method/dpo_loss" and value in GRPO_AGGREGATIONS:
            _refuse(f"method/dpo_loss={value}: GRPO's aggregations are now the group method/grpo_aggregation: "
                    f"use method/grpo_aggregation={value} (options: conf/method/grpo_aggregation/)")
        if key == "method/dpo_loss" and "method=grpo" in argv:
            _refuse(f"method/dpo_loss={value} is a DPO loss; GRPO's token aggregation is the group "
                    f"method/grpo_aggregation (options: conf/method/grpo_aggregation/)")
        if key not in MOVED:
            continue
        new = MOVED[key]
        if key == "method.args.loss_type" and value in GRPO_AGGREGATIONS:
            new = "method/grpo_aggregation"
        if "/" in new.split(" ")[0]:
            name = value if value and "." not in value else "NAME"  # a class path is not an option name
            _refuse(f"{key} is now the config group {new}: use {new}={name} (options: conf/{new}/)")
        _refuse(f"{key} is now {new} (conf/speed/; speed=off turns every speed path off)")


def _refuse(line: str) -> None:
    print(f"ablate: error: {folded(line)}", file=sys.stderr)
    sys.exit(2)


# `_target_`s that moved when the code was reorganised into packages by concept (commit 5692f59):
# old dotted prefix -> new one. A user's config (--config-dir, an override) naming an old one gets
# one line "X is now Y" (ablate.config.targets), not Hydra's "Error locating target".
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
    "ablate.callbacks.MetricsJSONL": "ablate.record.callbacks.MetricsJSONL",
    "ablate.callbacks.MaskSavedArgs": "ablate.record.callbacks.MaskSavedArgs",
    "ablate.callbacks.LogAtSaveAndEnd": "ablate.record.callbacks.LogAtSaveAndEnd",
    "ablate.models.lean": "ablate.speed.lean",
    "ablate.models.packing": "ablate.speed.packing",
    "ablate.models.split": "ablate.speed.split",
    "ablate.data.groups": "ablate.speed.groups",
    "ablate.data.pairs": "ablate.speed.pairs",
    "ablate.data.format": "ablate.data.tokenize",
    "ablate.speed.Speed": "ablate.speed.throughput.Speed",
    "ablate.redact": "ablate.record.secrets",
    "ablate.validate": "ablate.config.validate",
    "ablate.rundir": "ablate.record.rundir",
    "ablate.interrupts": "ablate.process.interrupts",
    "ablate.preemption": "ablate.process.preemption",
    "ablate.sweep": "ablate.launchers.sweep",
    "ablate.sweep_resume": "ablate.launchers.sweep_resume",
    "ablate.slurm": "ablate.launchers.slurm",
    "ablate.methods.grpo_config": "ablate.methods.grpo",  # GRPOConfig: its fields and checks are ablate.schema.grpo
    # run/ split by concept: the config, the run record, the process
    "ablate.run.compose": "ablate.config.compose",
    "ablate.run.validate": "ablate.config.validate",
    "ablate.run.code_checks": "ablate.config.code_checks",
    "ablate.run.targets": "ablate.config.targets",
    "ablate.run.rundir": "ablate.record.rundir",
    "ablate.run.lifecycle": "ablate.record.lifecycle",
    "ablate.run.callbacks": "ablate.record.callbacks",
    "ablate.run.secrets": "ablate.record.secrets",
    "ablate.run.studies": "ablate.record.studies",
    "ablate.run.trial": "ablate.record.callbacks",
    "ablate.run.interrupts": "ablate.process.interrupts",
    "ablate.run.preemption": "ablate.process.preemption",
    "ablate.run.threads": "ablate.process.threads",
    "ablate.run.memory": "ablate.process.memory",
    "ablate.run.process": "ablate.process.setup",
    "ablate.run.console": "ablate.process.console",
    "ablate.run.progress": "ablate.process.progress",
}


def moved_target(target: str) -> str | None:
    """The new spelling of a `_target_` that moved (`ablate.trainers.dpo.DPOTrainer` ->
    `ablate.methods.dpo.DPOTrainer`), or None. Matches whole dotted parts, longest old prefix first."""
    for old in sorted(MOVED_TARGETS, key=len, reverse=True):
        if target == old or target.startswith(old + "."):
            return MOVED_TARGETS[old] + target[len(old):]
    return None


