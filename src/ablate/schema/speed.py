"""The speed switches (`conf/speed/`), declared once: each field's default, its one-line help (what the
path does: the speed plan's table says it) and its check. True requests a path; the run's speed plan
(ablate.speed.plan) decides whether it runs. No torch import at module level (the launching process
checks the `speed` node against this schema)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from ablate.errors import ConfigError
from ablate.schema import BOOL, Schema, field


def switch(default: bool, help: str, path: bool = True) -> Any:  # dataclass metadata's name
    """A speed switch: `path` (a speed path the plan decides on) or a setting of the plan itself."""
    spec = field(default, check=BOOL, help=help)
    return dataclasses.field(default=default, metadata={**spec.metadata, "path": path})


@dataclass(frozen=True)
class SpeedSwitches(Schema):
    """The speed switches. `SpeedSwitches.off()` is TRL's layout everywhere: the plain path."""

    node = "speed"
    targets = ("ablate.speed.plan.SpeedSwitches",)  # conf/speed/on.yaml's `_target_` (re-exported there)

    dpo_pair_rows: bool = switch(
        True, "one row [prompt | chosen | rejected] per pair: each prompt computed once"
    )
    grpo_group_rows: bool = switch(
        True, "one row [prompt | c_1 | ... | c_k] per prompt: each prompt computed once"
    )
    padding_free: bool = switch(True, "only real tokens through the model (rows packed; attention per row)")
    completion_only_logits: bool = switch(True, "LM head only where a completion token is scored, in chunks")
    length_groups: bool = switch(True, "rows scored in groups of similar length, each cut to its longest")
    shared_prefill: bool = switch(True, "generation: one prefill per prompt; ended rows leave the batch")
    lean_layers: bool = switch(True, "RMSNorm and SiLU-MLP save less for backward")
    liger: bool = switch(False, "Liger Kernel's Triton RMSNorm and SwiGLU MLP (opt-in)")
    compile: bool = switch(False, "each decoder layer compiled by torch.compile (opt-in)")
    unverified_devices: bool = switch(
        False, "run the paths on devices where no recorded run shows them exact and not slower", path=False
    )
    show: bool = switch(
        False, "print the plan's whole table when training starts (else one line)", path=False
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.liger:  # checked once, here, before any model is built (ablate.config.code_checks builds it)
            why = liger_unavailable()
            if why:
                raise ConfigError(f"speed.liger=true: {why}")

    @classmethod
    def off(cls) -> SpeedSwitches:
        return cls(**{f.name: False for f in dataclasses.fields(cls)})

    @classmethod
    def paths(cls) -> dict[str, str]:
        """Every speed path -> what it does (the plan's table says this when it is on)."""
        return {f.name: f.metadata["help"] for f in dataclasses.fields(cls) if f.metadata["path"]}


def liger_unavailable() -> str | None:
    """Why Liger's kernels cannot run here (they are Triton kernels for CUDA GPUs), or None. Imports
    torch: called only when a run asks for them (speed.liger=true), never by the config's checks."""
    import importlib.util

    import torch

    if not torch.cuda.is_available():
        return (
            "Liger's kernels are Triton kernels for CUDA GPUs; there is none here (leave speed.liger=false)"
        )
    if importlib.util.find_spec("liger_kernel") is None:
        return "the liger-kernel package is not installed (pip install 'ablate[gpu]')"
    return None
