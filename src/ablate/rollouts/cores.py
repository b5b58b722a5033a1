"""Asynchronous GRPO's trainer taking the generation worker's cores while the worker is idle
(`method.args.async_threads=balanced`).

Why: on a small machine the two sides rarely take equal time. A bf16 worker samples its round in
less time than the trainer's forward+backward takes on its half of the threads, and a fixed split
leaves the worker's core idle for the difference; a fixed oversubscription (the trainer on every
thread alongside the worker) stalls both, as OpenMP's threads wait on each other whenever one is
descheduled. So the trainer computes on its share while the worker samples and on every thread
while the worker waits for its next round, checking the worker's busy flag (shared memory) at each
decoder layer's forward and backward and calling `torch.set_num_threads` when the answer changes.
The worker keeps its fixed share: a forked child cannot grow its OpenMP team once the parent has run
one (libgomp's threads do not survive the fork; the child hangs in its first wider region).

The price: CPU kernels (matmul, reductions) split their work by the thread count, so their results
depend on it in the last bits, and when a switch happens depends on timing. The trainer's gradients
of a balanced run are therefore not bit-reproducible (nor is its resume exact), as no GPU run with
non-deterministic kernels is; the worker samples as before from the weights it is handed (but
those come from the trainer, so later rounds differ too). The default (`split`) keeps both
thread counts fixed and the run reproducible.
"""

from __future__ import annotations

import multiprocessing
from typing import Any

import torch
from torch import nn


class CoreShare:
    """The worker's busy flag (shared memory, made before the fork) and the trainer's switch."""

    def __init__(self, total: int, share: int) -> None:
        self.flag = multiprocessing.get_context("fork").RawValue("b", 0)  # 1 while the worker samples a round
        self.total, self.share = total, share  # the trainer's threads while the worker waits / samples
        self.threads = share  # the trainer's torch threads now (it starts on its share)
        self.switches = 0  # thread-count changes the trainer made (logged when the worker closes)
        self.handles: list[Any] = []

    def worker_busy(self, busy: bool) -> None:
        """The worker's side: set before it starts a round and after it finishes one."""
        self.flag.value = int(busy)

    def balance(self, *_: Any) -> None:
        """The trainer's side: its share while the worker samples, every thread while it waits."""
        want = self.share if self.flag.value else self.total
        if want != self.threads:
            torch.set_num_threads(want)
            self.threads, self.switches = want, self.switches + 1

    def attach(self, model: nn.Module) -> None:
        """Check at each decoder layer: before its forward and, when it builds a graph, after its backward.
        Call after the worker is forked (its copy of the model must not carry the hooks)."""

        def before(module: nn.Module, args: tuple, kwargs: dict) -> None:
            self.balance()
            hidden = args[0] if args else kwargs.get("hidden_states")
            if isinstance(hidden, torch.Tensor) and hidden.requires_grad and torch.is_grad_enabled():
                hidden.register_hook(self._after_backward)  # fires once the layer's input gradient is done

        for layer in decoder_layers(model):
            self.handles.append(layer.register_forward_pre_hook(before, with_kwargs=True))

    def _after_backward(self, grad: torch.Tensor) -> None:
        self.balance()

    def detach(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The model's repeated blocks: the longest ModuleList (a transformer's `layers` / `h`)."""
    lists = [m for m in model.modules() if isinstance(m, nn.ModuleList)]
    return list(max(lists, key=len)) if lists else [model]
