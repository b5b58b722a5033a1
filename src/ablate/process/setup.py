"""Process set-up early in a run, before any heavy work: torch threads, malloc, quiet libraries,
who runs it (for run.json), and torch.distributed's variables in a SLURM job of several tasks."""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


def prepare(cfg: Any, info: dict[str, Any]) -> None:
    """Early in a run, before any heavy work: threads, malloc, tags, notes, pid -> `info` (run.json);
    quiet libraries; the job's gloo group."""
    from hydra.core.hydra_config import HydraConfig

    from ablate.process import memory, threads

    launcher = HydraConfig.get().get("launcher") if HydraConfig.initialized() else None
    info.update(threads.apply(cfg.get("threads"), launcher))
    info.update(memory.apply(cfg.get("malloc_mmap_threshold")))  # before the model's first tensors
    info["tags"] = [str(t) for t in (cfg.get("tags") or [])]
    info["notes"] = cfg.get("notes")
    info["host"], info["pid"] = socket.gethostname(), os.getpid()
    node = ray_node()  # hydra/launcher=ray: which node of the cluster ran it (this time: a resume may move)
    if node is not None:
        info["ray"] = node
    else:
        info.pop("ray", None)
    # processes in the run (torchrun ranks, SLURM tasks): `ablate resume` refuses to continue a
    # several-process run as one (the batch per step would change, and with it the losses)
    info["world_size"] = int(os.environ.get("WORLD_SIZE", "1"))
    quiet_libraries()
    init_process_group(cfg)


def ray_node() -> dict[str, Any] | None:
    """Where a Ray task runs (hydra/launcher=ray): its node's id and IP, the task's id; None when
    this process is not a Ray worker. `ray` is never imported here: a Ray worker has it loaded."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():  # get_runtime_context() would start a local Ray
        return None
    context = ray.get_runtime_context()
    return {
        "node_id": context.get_node_id(),
        "node_ip": ray.util.get_node_ip_address(),
        "task_id": context.get_task_id(),
        "job_id": context.get_job_id(),
    }


def quiet_libraries() -> None:
    """Messages with nothing for the user to act on stay out of the console."""
    import warnings

    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # per-checkpoint "Writing model shards" bars; the training bar stays
    # datasets' bars (generating splits, tokenising, flattening): one training bar is the run's output;
    # tokenising a large dataset turns its bar back on (ablate.data.tokenize.bars_if_large)
    from datasets.utils import logging as ds_logging

    ds_logging.disable_progress_bar()
    # TrainingArguments pins dataloader memory by default; on a CPU-only machine torch warns on every
    # dataloader that pinning is skipped
    warnings.filterwarnings("ignore", message=".*'pin_memory' argument is set as true but no accelerator")
    # (bitsandbytes' CPU notice at import is quieted in ablate/__init__.py, before anything imports it)


def export_torch_distributed() -> None:
    """In a SLURM job with several tasks (hydra.launcher.tasks_per_node=2), set what torchrun would:
    RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT, from SLURM's variables (submitit's helper), so
    the tasks form one DDP process group and share one run dir, rank 0 writing. Must run before
    anything reads RANK (rundir.is_main_process)."""
    if int(os.environ.get("SLURM_NTASKS", "1")) > 1 and "RANK" not in os.environ:
        from submitit.helpers import TorchDistributedEnvironment

        TorchDistributedEnvironment().export()


def init_process_group(cfg: Any) -> None:
    """Join the job's gloo process group (CPU ranks: no CUDA, or method.args.use_cpu) with
    `distributed.ddp_timeout` seconds for any collective, before TrainingArguments would: on CPU
    transformers and accelerate init it without a timeout, i.e. gloo's 30 minutes, so a frozen peer
    (a hung node, a network partition) would stall the other ranks that long. accelerate reuses a
    group it finds. A peer that dies is noticed at once either way (its TCP connections reset). GPU
    runs: TrainingArguments passes ddp_timeout to NCCL itself."""
    if int(os.environ.get("WORLD_SIZE", "1")) < 2:
        return
    import torch
    import torch.distributed as dist

    use_cpu = bool(cfg.get("method", {}).get("args", {}).get("use_cpu"))
    if dist.is_initialized() or (torch.cuda.is_available() and not use_cpu):
        return
    from datetime import timedelta

    timeout = (cfg.get("distributed") or {}).get("ddp_timeout") or 1800  # TrainingArguments' default
    dist.init_process_group("gloo", timeout=timedelta(seconds=int(timeout)))


_GROUP_LEFT = False  # this process destroyed a process group it trained in (process_group_left)


@contextmanager
def exit_without_teardown() -> Iterator[None]:
    """Around the process's command: a rank that trained in a process group ends with `os._exit`
    once its output is flushed and its atexit handlers ran. destroy_process_group only drops
    torch.distributed's own references: FSDP2's device mesh and the trainer keep the gloo group alive,
    and its worker threads, torn down with the interpreter, can abort a rank whose run completed
    (SIGABRT, "terminate called without an active exception": a 2-rank FSDP run in CI, under load)."""
    code: Any = 0
    try:
        yield
    except SystemExit as e:
        if not _GROUP_LEFT:
            raise
        code = e.code
    if _GROUP_LEFT:
        import atexit
        import logging

        if code is not None and not isinstance(
            code, int
        ):  # sys.exit("message"): printed, exit 1, as Python does
            print(code, file=sys.stderr)
            code = 1
        atexit._run_exitfuncs()
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code or 0)


@contextmanager
def process_group_left() -> Iterator[None]:
    """Around a run: destroy its process group (torchrun, SLURM tasks) before the interpreter exits.
    Left to exit, gloo's worker threads outlive the interpreter's teardown and a rank can abort with
    SIGABRT ("terminate called without an active exception", pytorch/pytorch#190489) after a run that
    completed. A finished run (the body returned) first waits for its peers (a barrier), so no rank
    closes its connections while another still reads from them; a failed one leaves at once (its
    peers see the reset)."""
    finished = False
    try:
        yield
        finished = True
    finally:
        dist = sys.modules.get("torch.distributed")  # not imported: no group (and an early error stays fast)
        if dist is not None and dist.is_available() and dist.is_initialized():
            try:
                if finished:
                    dist.barrier()
            finally:
                dist.destroy_process_group()
                global _GROUP_LEFT
                _GROUP_LEFT = True
