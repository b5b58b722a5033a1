"""What this machine can run, judged before a run dir exists (imports torch): the precision and distributed
groups against its accelerators, and the ranks of this job."""

from __future__ import annotations

from typing import Any

from ablate.errors import ConfigError


def check_precision(args: Any) -> dict[str, Any]:
    """`args`: the precision node (fp16 / tf32 flags), checked before any TrainingArguments exist.
    Returns extra TrainingArguments: bf16 on a machine without any accelerator trains on the CPU
    (`use_cpu`), where torch autocasts to bfloat16; transformers refuses bf16 there without it."""
    import torch
    from transformers.utils import is_torch_bf16_gpu_available

    if getattr(args, "fp16", False) and not torch.cuda.is_available():
        # accelerate silently ignores fp16 on CPU (no autocast, no scaler): refuse rather than pretend
        raise ConfigError(
            "precision=fp16 needs a CUDA GPU (on CPU it would "
            "silently train in fp32); use precision=bf16 or fp32"
        )
    if getattr(args, "tf32", None) and not torch.cuda.is_available():
        raise ConfigError("precision.tf32=true needs an Ampere or newer CUDA GPU; leave it null on CPU")
    if getattr(args, "bf16", False) and not is_torch_bf16_gpu_available():
        if has_accelerator():  # never move a GPU run to the CPU behind the user's back
            raise ConfigError(
                "precision=bf16 needs a GPU with bfloat16 support (CUDA: Ampere or newer); "
                "use precision=fp32 (or fp16 on CUDA)"
            )
        return {"use_cpu": True}
    return {}


def has_accelerator() -> bool:
    """Any GPU-like device torch can use (CUDA, ROCm, MPS, XPU, ...)."""
    import torch

    accelerator = getattr(torch, "accelerator", None)  # torch >= 2.6
    if accelerator is not None:
        return bool(accelerator.is_available())
    return torch.cuda.is_available() or torch.backends.mps.is_available()


def check_distributed(args: Any, processes: int | None = None) -> dict[str, Any]:
    """`args`: the distributed node; `processes`: the job's ranks when known here (None: a sweep on a
    launcher, decided per job). Returns extra TrainingArguments: FSDP2 on a machine without any
    accelerator shards CPU ranks over gloo (`use_cpu`; ablate.methods.fsdp.shard_on_cpu). One process is
    refused unless torchrun started it (`--nproc_per_node=1`: a sharded checkpoint resumed on one rank)."""
    import os

    import torch

    if not getattr(args, "fsdp", False):
        return {}
    # torchrun's one rank: meant
    if processes is not None and processes < 2 and "LOCAL_RANK" not in os.environ:
        raise ConfigError(
            "distributed=fsdp shards the model over several processes: start it with "
            "torchrun --nproc_per_node=2 (or hydra.launcher.tasks_per_node=2 under SLURM), "
            "or use distributed=ddp for one process"
        )
    if torch.cuda.is_available():
        return {}
    if has_accelerator():  # MPS, XPU, ...: accelerate has no FSDP there and ablate has not run one
        raise ConfigError(
            "distributed=fsdp runs on CUDA GPUs or on CPU ranks (gloo); this machine's accelerator "
            "is neither: use distributed=ddp"
        )
    return {"use_cpu": True}


def job_processes() -> int:
    """The ranks of this job as torchrun (WORLD_SIZE) or SLURM (SLURM_NTASKS) sets them; 1 alone."""
    import os

    return int(os.environ.get("WORLD_SIZE") or os.environ.get("SLURM_NTASKS") or 1)
