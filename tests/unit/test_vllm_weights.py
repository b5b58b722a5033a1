"""What the vLLM engine is pushed (ablate.rollouts.vllm.merged_weights), without vLLM: the policy's weights
under the base checkpoint's names; with LoRA (and DoRA), each adapted layer merged as PEFT merges it, and
the frozen base left bit for bit as it was (TRL's merge_adapter/unmerge_adapter round trip is not)."""

from __future__ import annotations

import copy

import pytest
import torch
from peft import LoraConfig, get_peft_model

from ablate.models import tiny
from ablate.rollouts.vllm import merged_weights


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
