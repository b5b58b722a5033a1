"""FSDP2 (`distributed=fsdp`) on CPU ranks too, and the full weights for generation under sharding.

accelerate (1.15) turns a GPU process group into `DistributedType.FSDP` when Trainer hands it an FSDP
plugin, but leaves CPU (gloo) ranks `MULTI_CPU`, so Trainer silently wraps the model in DDP
(notes: `AcceleratorState.__init__` only checks the GPU-like types). `shard_on_cpu` switches the
already-built state to FSDP with the plugin Trainer itself built from `fsdp_config`; everything after
(fsdp2_prepare_model, the optimizer's DTensor parameters, clipping, no_sync, checkpoints, resume,
save_model) is accelerate's and Trainer's own FSDP2 code. Every ablate trainer calls it from its base
(ablate.methods.base.AblateTrainer, which also writes a whole `model/` under sharding).
tests/slow/test_fsdp.py: losses equal DDP's on 2 gloo ranks.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from torch import nn


def shard_on_cpu(state: Any, fsdp_plugin_args: dict[str, Any] | None) -> bool:
    """Switch an accelerator's `state` (built by Trainer.__init__, before anything is prepared) from
    MULTI_CPU to FSDP with the plugin Trainer built from `fsdp_config`; whether it did (a no-op on GPUs
    and without fsdp). AblateTrainer.create_accelerator_and_postprocess then sets Trainer's own flag."""
    from accelerate.state import PartialState
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

    if fsdp_plugin_args is None or state.distributed_type != DistributedType.MULTI_CPU:
        return False
    state.fsdp_plugin = FullyShardedDataParallelPlugin(**fsdp_plugin_args)
    state.distributed_type = DistributedType.FSDP
    PartialState._shared_state["distributed_type"] = DistributedType.FSDP  # read by accelerate's helpers
    return True


@contextlib.contextmanager
def full_params(model: nn.Module) -> Iterator[nn.Module]:
    """Every FSDP2 unit of `model` gathered once (the same all-gathers, in the same order, on every
    rank) and kept whole for the block, so no collective runs inside it: ranks may run different
    numbers of forwards (a rank whose completions all ended stops decoding; sharded, its partner's
    next all-gather would wait for it until the group timeout). On exit each unit is resharded with its
    own reshard_after_forward restored (accelerate gives the root and the head False, the layers True;
    two private FSDP2 fields hold them). Memory: the whole model on every rank for the block, as DDP.
    A model without FSDP2 units: the block runs as is."""
    from torch.distributed.fsdp import FSDPModule

    units = [m for m in model.modules() if isinstance(m, FSDPModule)]
    saved = []
    for m in units:
        state = m._get_fsdp_state()
        saved.append(
            (
                state,
                state._auto_reshard_after_forward,
                [(g, g.post_forward_mesh_info) for g in state._fsdp_param_groups],
            )
        )
        m.set_reshard_after_forward(False, recurse=False)
    for m in units:
        m.unshard()
    try:
        yield model
    finally:
        for m in units:
            m.reshard()
        for state, auto, groups in saved:
            state._auto_reshard_after_forward = auto
            for g, info in groups:
                g.post_forward_mesh_info = info
