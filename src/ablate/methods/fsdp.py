"""FSDP2 (`distributed=fsdp`) on CPU ranks too, and the full weights for generation under sharding.

accelerate (1.15) turns a GPU process group into `DistributedType.FSDP` when Trainer hands it an FSDP
plugin, but leaves CPU (gloo) ranks `MULTI_CPU`, so Trainer silently wraps the model in DDP
(notes: `AcceleratorState.__init__` only checks the GPU-like types). `ShardOnCPU` switches the
already-built state to FSDP with the plugin Trainer itself built from `fsdp_config`; everything after
(fsdp2_prepare_model, the optimizer's DTensor parameters, clipping, no_sync, checkpoints, resume,
save_model) is accelerate's and Trainer's own FSDP2 code. It is the base of `ConfiguredOptimizer`,
so every ablate trainer has it. tests/slow/test_fsdp.py: losses equal DDP's on 2 gloo ranks.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

from torch import nn
from transformers import Trainer


class ShardOnCPU(Trainer):
    """Trainer with `fsdp` set shards on CPU ranks as on GPUs (a no-op on GPUs and without fsdp)."""

    def create_accelerator_and_postprocess(self) -> None:
        super().create_accelerator_and_postprocess()  # runs in Trainer.__init__, before anything is prepared
        from accelerate.state import PartialState
        from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

        state = self.accelerator.state
        if self.args.fsdp_plugin_args is not None and state.distributed_type == DistributedType.MULTI_CPU:
            state.fsdp_plugin = FullyShardedDataParallelPlugin(**self.args.fsdp_plugin_args)
            state.distributed_type = DistributedType.FSDP
            PartialState._shared_state["distributed_type"] = DistributedType.FSDP  # read by accelerate's helpers
            self.is_fsdp_enabled = True  # Trainer's own flag, read from here on (optimizer before prepare, save)

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """`model/` (Trainer's save_model outside a checkpoint) is a plain from_pretrained dir under
        SHARDED_STATE_DICT too: the whole model gathered once (a collective: every rank calls it), rank 0
        writes it. Trainer writes nothing there when sharded; checkpoints (`_internal_call`) stay sharded,
        each rank writing its own DCP shards (accelerate's save_fsdp_model / save_fsdp_optimizer)."""
        sharded = self.is_fsdp_enabled and "SHARDED" in str(self.accelerator.state.fsdp_plugin.state_dict_type)
        if _internal_call or not sharded:
            return super().save_model(output_dir, _internal_call)
        self._save(output_dir or self.args.output_dir, state_dict=self.accelerator.get_state_dict(self.model))


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
        saved.append((state, state._auto_reshard_after_forward,
                      [(g, g.post_forward_mesh_info) for g in state._fsdp_param_groups]))
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

