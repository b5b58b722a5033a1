"""The policy's weights on their way to a generation engine: `(name, tensor)` pairs in checkpoint naming (the
names `from_pretrained` reads, which vLLM's `load_weights` takes), one tensor at a time, so an engine can load
them as they come (colocated: vLLM's in-place reload; a server: a broadcast per tensor,
ablate.rollouts.transfer).

- One process, or a DDP replica: the parameters as they are (tied weights once).
- LoRA: each adapted layer with its adapters merged (`merged_weights`), the frozen base put back bit for bit.
- FSDP2: every unit (a decoder layer; the root's own: embeddings, final norm, head) is all-gathered in turn,
  its tensors handed on, and resharded before the next, so a rank never holds more than one layer whole (plus
  its shards) while the weights stream out: the unit's `unshard()` is a collective, so every rank iterates, in
  the same order (TRL gathers the whole model with `summon_full_params`; verl reshards per parameter).

`Digest` is what "the engine holds the trainer's weights" is checked by (`method.rollouts.verify_push=true`):
a SHA-256 of the stream as the engine received and loaded it (in the engine's process), against the trainer's
of its own weights after the push. vLLM's own `compute_weight_checksums` digests the engine's parameters, but
on a CPU the linear layers' weights live in oneDNN's packed handles, out of its reach.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

import torch
from torch import nn

from ablate.models.adapters import is_adapted


def policy_weights(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """The policy's weights in checkpoint naming, streamed (module docstring): FSDP2 one unit at a time,
    in the order `weight_names` announces them."""
    units = _fsdp_units(model)
    if not units:
        yield from merged_weights(model)
        return
    for unit, names in _by_unit(model, units):
        unit.unshard()  # a collective: this unit's parameters whole on every rank, registered on its modules
        try:  # copies: the reshard frees the gathered storage, and an engine may still hold what it was given
            yield from ((name, t.clone()) for name, t in merged_weights(model, names))
        finally:
            unit.reshard()


def weight_names(model: nn.Module) -> list[tuple[str, torch.dtype, tuple[int, ...]]]:
    """(checkpoint name, dtype, whole shape) of what `policy_weights` yields, in its order, without gathering
    anything (an FSDP2 parameter's shape is its whole shape)."""
    params = dict(model.named_parameters())
    units = _fsdp_units(model)
    order = [n for _, names in _by_unit(model, units) for n in names] if units else list(params)
    out = []
    for raw in order:
        name = checkpoint_name(model, raw)
        if name is not None:
            out.append((name, params[raw].dtype, tuple(params[raw].shape)))
    return out


def checkpoint_name(model: nn.Module, raw: str) -> str | None:
    """A parameter's name in the base checkpoint; None for what the stream leaves out (LoRA's adapters, merged
    into their layers, and PEFT's copies of modules_to_save)."""
    if not is_adapted(model):
        return raw
    name = raw.removeprefix("base_model.model.").replace(".base_layer", "")
    if model.prefix in name or "original_module" in name:
        return None
    return name.replace("modules_to_save.default.", "")


def merged_weights(model: nn.Module, only: set[str] | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) in checkpoint naming; tied weights come once; `only`: these parameter names of `model`.
    PEFT: each adapted layer's weights with its adapters merged, names as the base checkpoint's (TRL's
    `_iter_named_params`). PEFT's own merge is used (every adapter type), one layer at a time; a copy of the
    merged weights is handed over and the base weights are put back bit for bit: `unmerge` alone (TRL's way)
    leaves the rounding of W + dW - dW in the frozen base, push after push."""
    params = [(n, p) for n, p in model.named_parameters() if only is None or n in only]
    if not is_adapted(model):
        yield from ((name, p.data) for name, p in params)
        return
    from peft.tuners.tuners_utils import BaseTunerLayer

    owner = {
        id(p): m
        for m in model.modules()
        if isinstance(m, BaseTunerLayer)
        for p in m.get_base_layer().parameters(recurse=False)
    }
    for raw, p in params:
        name = checkpoint_name(model, raw)
        if name is None:
            continue
        layer = owner.get(id(p))
        if layer is None:
            yield name, p.data
            continue
        base = list(layer.get_base_layer().parameters(recurse=False))
        saved = [q.data.clone() for q in base]
        layer.merge()
        try:
            merged = p.data.clone()
        finally:
            layer.unmerge()
            for q, v in zip(base, saved):
                q.data.copy_(v)
        yield name, merged


class Digest:
    """SHA-256 over a weight stream as it passes (each tensor's name, dtype, shape and bytes, in order): what
    an engine received, to compare with the trainer's `digest` of its own weights."""

    def __init__(self) -> None:
        self.hash = hashlib.sha256()

    def add(self, name: str, tensor: torch.Tensor) -> None:
        t = tensor.detach().to("cpu", copy=True).contiguous()  # numpy would pin the tensor's storage
        self.hash.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        self.hash.update(t.view(-1).view(torch.uint8).numpy())

    def passing(self, pairs: Iterator[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in pairs:
            self.add(name, tensor)
            yield name, tensor

    def hexdigest(self) -> str:
        return self.hash.hexdigest()


def digest(model: nn.Module) -> str:
    """The trainer's digest of the weights it pushes (`Digest` over `policy_weights`; FSDP2: every rank calls
    it, the gathers are collectives)."""
    d = Digest()
    for name, tensor in policy_weights(model):
        d.add(name, tensor)
    return d.hexdigest()


def _fsdp_units(model: nn.Module) -> list[nn.Module]:
    """The FSDP2 units of `model` (fully_shard'ed modules), outermost first; [] when it is not sharded."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # a torch without FSDP2
        return []
    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def _by_unit(model: nn.Module, units: list[nn.Module]) -> list[tuple[nn.Module, set[str]]]:
    """Each unit with the parameter names it gathers (those of its modules outside any inner unit), in module
    order; a unit holding none is left out."""
    index = {id(u): i for i, u in enumerate(units)}
    owned: list[list[str]] = [[] for _ in units]
    for name, _ in model.named_parameters():
        module, unit = model, index.get(id(model))
        for part in name.split(".")[:-1]:
            module = getattr(module, part)
            unit = index.get(id(module), unit)
        owned[unit].append(name)
    return [(u, names) for u, names in zip(units, owned) if names]
