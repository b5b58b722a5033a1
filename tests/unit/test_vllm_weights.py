"""What a generation engine is pushed (ablate.rollouts.weights), without vLLM: the policy's weights under the base
checkpoint's names; with LoRA (and DoRA), each adapted layer merged as PEFT merges it, and the frozen base left bit
for bit as it was (TRL's merge_adapter/unmerge_adapter round trip is not); under FSDP2, one unit gathered at a time,
the stream equal to the unsharded model's and announced in its order (`weight_names`, what a server's workers are
told before the tensors arrive); the digest both sides compare."""

from __future__ import annotations

import copy

import pytest
import torch
from peft import LoraConfig, get_peft_model

from ablate.models import tiny
from ablate.rollouts.weights import Digest, digest, merged_weights, policy_weights, weight_names


def _adapted(use_dora: bool = False) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The tiny model with LoRA on every linear layer, B != 0 (a trained-looking adapter)."""
    _, base = tiny()
    reference = copy.deepcopy(base)
    model = get_peft_model(
        base, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", use_dora=use_dora, lora_dropout=0.0)
    )
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(0.05 * torch.randn(p.shape, generator=g))
    return model, reference


def test_full_model_weights_are_its_own():
    _, model = tiny()
    pushed = dict(merged_weights(model))
    assert list(pushed) == [n for n, _ in model.named_parameters()]  # tied weights once, as named_parameters
    assert all(pushed[n].data_ptr() == p.data_ptr() for n, p in model.named_parameters())  # no copies


@pytest.mark.parametrize("use_dora", [False, True], ids=["lora", "dora"])
def test_lora_weights_are_the_merged_model_and_the_base_is_left_exact(use_dora):
    model, reference = _adapted(use_dora)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    pushed = dict(merged_weights(model))
    assert list(pushed) == [n for n, _ in reference.named_parameters()]  # the base checkpoint's names
    merged = copy.deepcopy(model).merge_and_unload()  # PEFT's own merged model
    for name, p in merged.named_parameters():
        torch.testing.assert_close(pushed[name], p.data, rtol=0, atol=1e-6)
    assert any(
        not torch.equal(pushed[n], p.data) for n, p in reference.named_parameters()
    )  # the adapters count
    after = dict(model.named_parameters())
    assert all(
        torch.equal(after[n].data, v) for n, v in before.items()
    )  # base and adapters untouched, bitwise
    assert not any(getattr(m, "merged", False) for m in model.modules())


def test_merge_unmerge_in_place_is_not_exact():
    """Why merged_weights restores the base itself: W + dW - dW != W in floating point."""
    model, _ = _adapted()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    model.merge_adapter()
    model.unmerge_adapter()
    assert any(not torch.equal(p.data, before[n]) for n, p in model.named_parameters())


@pytest.mark.parametrize("adapted", [False, True], ids=["full", "lora"])
def test_the_announced_names_are_the_stream_in_order(adapted):
    model = _adapted()[0] if adapted else tiny()[1]
    stream = [(n, t.dtype, tuple(t.shape)) for n, t in policy_weights(model)]
    assert weight_names(model) == stream and len(stream) > 10


def test_the_digest_sees_every_byte_and_the_order():
    _, model = tiny()
    pairs = list(policy_weights(model))
    received = Digest()
    assert [n for n, _ in received.passing(iter(pairs))] == [n for n, _ in pairs]  # passes everything on
    assert received.hexdigest() == digest(model)
    with torch.no_grad():
        next(model.parameters()).view(-1)[0] += 1e-6  # one element of one tensor
    assert digest(model) != received.hexdigest()
    swapped = Digest()
    for name, tensor in [pairs[1], pairs[0], *pairs[2:]]:
        swapped.add(name, tensor)
    assert swapped.hexdigest() != received.hexdigest()


@pytest.fixture
def one_rank_group(tmp_path):
    """A gloo process group of one rank: FSDP2's units, gathers and reshards without a second process (the
    2-rank stream is tests/slow/test_vllm_ddp.py's)."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("adapted", [False, True], ids=["full", "lora"])
def test_fsdp2_streams_one_unit_at_a_time_what_the_whole_model_holds(one_rank_group, adapted):
    from torch.distributed.fsdp import FSDPModule, fully_shard

    model = _adapted()[0] if adapted else tiny()[1]
    whole = {n: t.clone() for n, t in policy_weights(model)}
    inner = model.get_base_model() if adapted else model
    for layer in inner.model.layers:
        fully_shard(layer)
    fully_shard(model)
    units = [m for m in model.modules() if isinstance(m, FSDPModule)]
    assert len(units) == len(inner.model.layers) + 1
    gathered_at_once = []
    for name, tensor in policy_weights(model):
        gathered_at_once.append(
            sum(not isinstance(p, torch.distributed.tensor.DTensor) for p in model.parameters())
        )
        torch.testing.assert_close(tensor, whole[name], rtol=0, atol=0 if not adapted else 1e-6)
    assert [n for n, *_ in weight_names(model)] == list(dict(policy_weights(model)))
    assert digest(model) == digest(model)  # hashing a stream leaves FSDP free to reshard what it gathered
    assert set(whole) == {n for n, *_ in weight_names(model)}
    # whole at once: one unit's parameters (a layer's, or the root's own: embeddings, norm), never the model's
    per_layer = max(sum(1 for _ in layer.parameters()) for layer in inner.model.layers)
    root = sum(1 for n, _ in model.named_parameters() if ".layers." not in n)
    assert max(gathered_at_once) == max(per_layer, root) < sum(1 for _ in model.parameters())
    assert all(isinstance(p, torch.distributed.tensor.DTensor) for p in model.parameters())  # resharded after
