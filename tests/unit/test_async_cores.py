"""`method.args.async_threads=balanced` (ablate.rollouts.cores): the trainer computes on every torch
thread while the async generation worker is idle and on its share while the worker samples, switching
at each decoder layer's forward and backward; the worker keeps its share."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch
from datasets import Dataset
from torch import nn

from ablate.methods.grpo import GRPOConfig, GRPOTrainer
from ablate.models import tiny
from ablate.rollouts.cores import CoreShare, decoder_layers


@pytest.fixture(autouse=True)
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


class Stack(nn.Module):
    """Three blocks in a ModuleList (a transformer's `layers`) and a head outside it."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(3))
        self.head = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return self.head(x)


def test_the_trainer_takes_every_thread_while_the_worker_is_idle():
    """Total 2, share 1: idle worker (flag 0) -> 2 threads, busy -> 1, idle again -> 2; a switch only
    when the answer changes."""
    torch.set_num_threads(1)
    cores = CoreShare(total=2, share=1)
    cores.balance()
    assert torch.get_num_threads() == 2
    cores.balance()
    cores.worker_busy(True)
    cores.balance()
    assert torch.get_num_threads() == 1
    cores.worker_busy(False)
    cores.balance()
    assert torch.get_num_threads() == 2 and cores.switches == 3


def test_the_switch_is_made_at_each_layers_forward_and_backward():
    """The worker is idle during the forward (every layer runs on 2 threads) and takes a round before
    the backward: the backward switches back to the share at the first layer input's gradient, before
    the model input's."""
    torch.set_num_threads(1)
    model = Stack()
    cores = CoreShare(total=2, share=1)
    cores.attach(model)
    assert decoder_layers(model) == list(model.layers)
    seen: list[tuple[str, int]] = []
    for i, layer in enumerate(model.layers):
        layer.register_forward_hook(
            lambda m, a, o, i=i: seen.append((f"forward {i}", torch.get_num_threads()))
        )
    x = torch.randn(2, 4, requires_grad=True)
    loss = model(x).sum()
    cores.worker_busy(True)
    x.register_hook(
        lambda g: seen.append(("input grad", torch.get_num_threads()))
    )  # after the layer's own hook
    loss.backward()
    assert seen == [("forward 0", 2), ("forward 1", 2), ("forward 2", 2), ("input grad", 1)]
    with torch.no_grad():  # no graph: no backward hook to register
        model(x)
    cores.detach()
    cores.worker_busy(False)
    model(x)
    assert torch.get_num_threads() == 1 and not cores.handles  # detached: no more switches


def id_reward(completion_ids: list[list[int]], **_: Any) -> list[float]:
    return [float(sum(c) % 7) for c in completion_ids]


def test_a_balanced_async_run_trains_and_gives_the_threads_back(tmp_path, caplog):
    """Two torch threads, max_staleness=1: the trainer starts on 1 (the worker has the other) and takes
    both at the latest when the worker has no round left (the last step); after train() it has both."""
    torch.set_num_threads(2)
    torch.manual_seed(0)
    tok, model = tiny(hidden_size=16, num_layers=2, num_heads=2, intermediate_size=32)
    args = GRPOConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=4,
        max_steps=4,
        learning_rate=3e-2,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
        use_cpu=True,
        max_staleness=1,
        async_threads="balanced",
    )
    trainer = GRPOTrainer(
        model=model,
        args=args,
        train_dataset=Dataset.from_dict({"prompt": [f"p{i:02d}" for i in range(16)]}),
        processing_class=tok,
        reward_funcs={"ids": id_reward},
    )
    with caplog.at_level(logging.INFO, logger="ablate"):
        trainer.train()
    assert "training on 1 thread(s), 2 while the worker is idle" in caplog.text
    switches = [r.getMessage() for r in caplog.records if "changed its thread count" in r.getMessage()]
    assert len(switches) == 1 and int(switches[0].split("count ")[1].split()[0]) >= 1
    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    assert len(losses) == 4 and all(torch.isfinite(torch.tensor(losses)))
    assert torch.get_num_threads() == 2 and trainer.ahead.cores is None
