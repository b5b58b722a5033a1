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
    launcher, decided per job). Returns its TrainingArguments: the node's keys but `sequence_parallel`
    (the trainer's), and with FSDP2 on a machine without any accelerator `use_cpu` (CPU ranks sharded over
    gloo; ablate.methods.fsdp.shard_on_cpu). One process is refused unless torchrun started it
    (`--nproc_per_node=1`: a sharded checkpoint resumed on one rank)."""
    import os

    import torch
    from omegaconf import OmegaConf

    check_sequence_parallel(args.get("sequence_parallel", 1), processes)
    out = {k: v for k, v in OmegaConf.to_container(args).items() if k != "sequence_parallel"}
    if not getattr(args, "fsdp", False):
        return out
    # torchrun's one rank: meant
    if processes is not None and processes < 2 and "LOCAL_RANK" not in os.environ:
        raise ConfigError(
            "distributed=fsdp shards the model over several processes: start it with "
            "torchrun --nproc_per_node=2 (or hydra.launcher.tasks_per_node=2 under SLURM), "
            "or use distributed=ddp for one process"
        )
    if torch.cuda.is_available():
        return out
    if has_accelerator():  # MPS, XPU, ...: accelerate has no FSDP there and ablate has not run one
        raise ConfigError(
            "distributed=fsdp runs on CUDA GPUs or on CPU ranks (gloo); this machine's accelerator "
            "is neither: use distributed=ddp"
        )
    return {**out, "use_cpu": True}


def check_sequence_parallel(size: Any, processes: int | None) -> None:
    """`distributed.sequence_parallel`: a whole number of ranks per sequence group, dividing the job's ranks
    (when known here; the trainer checks the model's heads and attention)."""
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ConfigError(f"distributed.sequence_parallel={size}: must be a whole number of ranks, 1 or more")
    if size > 1 and processes is not None and processes % size:
        raise ConfigError(
            f"distributed.sequence_parallel={size}: splits each sequence over {size} ranks, but this job has "
            f"{processes} (torchrun --nproc_per_node={size}, or a multiple of it)"
        )


def job_processes() -> int:
    """The ranks of this job as torchrun (WORLD_SIZE) or SLURM (SLURM_NTASKS) sets them; 1 alone."""
    import os

    return int(os.environ.get("WORLD_SIZE") or os.environ.get("SLURM_NTASKS") or 1)
