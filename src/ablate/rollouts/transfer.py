"""Weights from the trainer to a vLLM server through gloo, for servers and trainers on CPUs, as vLLM's NCCL
weight-transfer engine carries them on GPUs (the backend TRL's `trl vllm-serve` starts).

vLLM (0.32+) has a weight-transfer API for RL: a server started with `--weight-transfer-config` exposes
`/init_weight_transfer_engine`, `/start_weight_update`, `/update_weights` and `/finish_weight_update`, and a
backend is a pair of engines, one in each inference worker (`WeightTransferEngine`) and one in the trainer
(`TrainerWeightTransferEngine`), registered in vLLM's two factories. vLLM ships NCCL, CUDA IPC and RDMA
backends, all CUDA only; this module adds `gloo`: the trainer's sender (rank 0) and the server's workers
(ranks 1..) form a process group of their own (a TCPStore the trainer hosts), and each tensor of the policy
(ablate.rollouts.weights: LoRA merged, FSDP2 gathered one unit at a time on every trainer rank) is broadcast
in turn and loaded as it arrives (vLLM's layerwise reload, as its NCCL engine does), so no host holds a second
full copy. A CPU worker's tied LM head is re-tied and re-packed after the reload (ablate.rollouts.vllm).

`register` is a vLLM general plugin (pyproject's `vllm.general_plugins` entry point), which vLLM loads in
every process it starts: wherever ablate is installed, `vllm serve --weight-transfer-config '{"backend":
"gloo"}'` knows the backend (`ablate serve-rollouts` starts exactly that).
"""

from __future__ import annotations

import datetime
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

import torch
from vllm.distributed.weight_transfer.base import (
    ParamMeta,
    TrainerInitInfo,
    TrainerWeightTransferEngine,
    WeightSource,
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)

from ablate.rollouts.plugin import BACKEND
from ablate.rollouts.vllm import retie_head
from ablate.rollouts.weights import Digest, policy_weights, weight_names

TIMEOUT = datetime.timedelta(minutes=10)  # a peer that died mid-transfer: gloo gives up after this


@dataclass
class GlooInitInfo(WeightTransferInitInfo):
    """What a server worker needs to join the trainer's transfer group."""

    master_address: str  # where the trainer's TCPStore listens
    master_port: int
    rank_offset: int  # the workers' first rank (the trainer's sender is rank 0)
    world_size: int  # the sender + every worker of the server


@dataclass
class GlooUpdateInfo(WeightTransferUpdateInfo):
    """One push: the tensors, in the order they are broadcast."""

    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]]
    digest: bool = False  # the workers hash what they load (PushDigest; method.rollouts.verify_push)


@dataclass
class GlooTrainerInitInfo(TrainerInitInfo):
    """The trainer's side of the group (`rank`: this trainer process's rank; rank 0 sends)."""

    backend: ClassVar[str] = BACKEND
    master_address: str
    master_port: int
    world_size: int


class GlooWeightTransferEngine(WeightTransferEngine[GlooInitInfo, GlooUpdateInfo]):
    """The server worker's side: joins the group, receives each tensor and loads it in place."""

    init_info_cls = GlooInitInfo
    update_info_cls = GlooUpdateInfo
    group: Any = None
    received: str | None = None  # the last push's digest, when the trainer asked for one

    def init_transfer_engine(self, init_info: GlooInitInfo) -> None:
        pc = self.parallel_config  # a unique rank per worker across data-parallel replicas (as vLLM's NCCL)
        rank = init_info.rank_offset + pc.data_parallel_index * pc.world_size + pc.rank
        store = torch.distributed.TCPStore(
            init_info.master_address, init_info.master_port, init_info.world_size, False, timeout=TIMEOUT
        )
        self.group = gloo_group(store, rank, init_info.world_size)

    def start_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        initialize_layerwise_reload(self.model)

    def receive_weights(self, update_info: GlooUpdateInfo) -> None:
        received = Digest() if update_info.digest else None
        for name, dtype, shape in zip(update_info.names, update_info.dtype_names, update_info.shapes):
            tensor = torch.empty(shape, dtype=getattr(torch, dtype), device=self.device)
            self.group.broadcast(tensor, 0).wait()
            if received is not None:
                received.add(name, tensor)
            self.model.load_weights([(name, tensor)])
        self.received = received.hexdigest() if received is not None else None

    def finish_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload
        from vllm.platforms import current_platform

        finalize_layerwise_reload(self.model, self.model_config)
        if current_platform.is_cpu():
            retie_head(self.model)

    def shutdown(self) -> None:
        self.group = None


class GlooTrainerWeightTransferEngine(TrainerWeightTransferEngine[GlooTrainerInitInfo]):
    """The trainer's side: rank 0 hosts the group and broadcasts; every rank iterates the source (under FSDP2
    its gathers are collectives of the trainer's ranks)."""

    init_info_cls = GlooTrainerInitInfo
    group: Any = None
    digest = False  # ask the workers to hash what they load (set by ablate.rollouts.server)

    @classmethod
    def trainer_init(cls, init_info: GlooTrainerInitInfo, *, client: Any, source: Any = None) -> Any:
        engine = cls(client=client, source=source, is_sender=init_info.is_sender)
        if not engine.is_sender:
            return engine
        store = torch.distributed.TCPStore(
            init_info.master_address,
            init_info.master_port,
            init_info.world_size,
            True,
            timeout=TIMEOUT,
            wait_for_workers=False,
        )
        workers = GlooInitInfo(init_info.master_address, store.port, 1, init_info.world_size)
        with ThreadPoolExecutor(max_workers=1) as pool:  # the workers join inside this request
            joined = pool.submit(client.init_weight_transfer_engine, asdict(workers))
            engine.group = gloo_group(store, 0, init_info.world_size)
            joined.result()
        return engine

    def send_weights(self) -> None:
        meta = self.source.metadata()
        if not self.is_sender:
            for _ in self.source:  # the gathers (FSDP2) are collectives of every trainer rank
                pass
            return
        info = GlooUpdateInfo(
            [m.name for m in meta],
            [str(m.dtype).removeprefix("torch.") for m in meta],
            [list(m.shape) for m in meta],
            self.digest,
        )
        self.client.start_weight_update()
        pool = ThreadPoolExecutor(max_workers=1)
        try:
            received = pool.submit(self.client.update_weights, asdict(info))  # the workers receive inside it
            for m, (name, tensor) in zip(meta, self.source, strict=True):
                if name != m.name:
                    raise RuntimeError(f"weight stream out of order: {name} where {m.name} was announced")
                self.group.broadcast(tensor.detach().to(m.dtype).contiguous(), 0).wait()
            received.result()
        finally:
            pool.shutdown(wait=False)  # a broken transfer leaves the request hanging: never wait on it
        self.client.finish_weight_update()

    def shutdown(self) -> None:
        self.group = None


class PushDigest:
    """A vLLM worker extension (`--worker-extension-cls`, set by ablate serve-rollouts): the last push's
    digest, read by the trainer through vLLM's dev RPC (`/collective_rpc`, method ablate_push_digest)."""

    def ablate_push_digest(self) -> str | None:
        return getattr(getattr(self, "weight_transfer_engine", None), "received", None)


class PolicySource(WeightSource):
    """The policy as vLLM's trainer engines read it: ablate.rollouts.weights' stream, its names first."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model

    def metadata(self) -> list[ParamMeta]:
        return [ParamMeta(name, dtype, tuple(shape)) for name, dtype, shape in weight_names(self.model)]

    def __iter__(self) -> Any:
        return policy_weights(self.model)


def gloo_group(store: Any, rank: int, size: int) -> Any:
    """A gloo process group of its own over `store`, outside torch.distributed's default group (the trainer's
    ranks keep theirs)."""
    prefixed = torch.distributed.PrefixStore("ablate-weights", store)
    return torch.distributed.ProcessGroupGloo(prefixed, rank, size, TIMEOUT)
