"""TF32 is read through torch's new API (issue 33): once anything sets `fp32_precision` (transformers'
`tf32=True` does, on the GPU), torch >= 2.9 refuses the legacy reads (`allow_tf32`,
`get_float32_matmul_precision()`), which crashed `precision.tf32=true` on an H200. On a CPU the same
refusal reproduces: set the new API, then run every reader ablate has."""

from __future__ import annotations

import types

import pytest
import torch

from ablate.data import cache
from ablate.models import precision
from ablate.speed import throughput

pytestmark = pytest.mark.skipif(
    not hasattr(torch.backends.cuda.matmul, "fp32_precision"), reason="torch < 2.9 has no fp32_precision API"
)


# every fp32_precision node, parents first (setting a parent copies its value into its children)
NODES = (
    "",
    "cuda.matmul",
    "cudnn",
    "cudnn.conv",
    "cudnn.rnn",
    "mkldnn",
    "mkldnn.matmul",
    "mkldnn.conv",
    "mkldnn.rnn",
)


def _node(path):
    node = torch.backends
    for part in filter(None, path.split(".")):
        node = getattr(node, part)
    return node


@pytest.fixture
def new_api():
    """TF32 set through the new API, as transformers' enable_tf32(True) does (the global setting, which
    torch copies into every op) and as a user may per op; every node restored after the test (then the
    legacy reads work again, for the tests that run after it in this process)."""
    saved = {path: _node(path).fp32_precision for path in NODES}
    torch.backends.fp32_precision = "tf32"
    torch.backends.cuda.matmul.fp32_precision = "tf32"
    torch.backends.cudnn.conv.fp32_precision = "tf32"
    try:
        yield
    finally:
        for path in NODES:
            _node(path).fp32_precision = saved[path]
        assert torch.backends.cuda.matmul.allow_tf32 is not None  # the legacy read works again


def test_the_legacy_read_is_refused_once_the_new_api_is_set(new_api):
    """The bug, on a CPU: the legacy flag cannot be read any more (so no reader may use it)."""
    with pytest.raises(RuntimeError, match="legacy and new"):
        _ = torch.backends.cuda.matmul.allow_tf32
    with pytest.raises(RuntimeError):
        torch.get_float32_matmul_precision()


def test_every_reader_runs_and_sees_tf32(new_api, monkeypatch):
    assert precision.fp32_precision() == {
        "cuda.matmul": "tf32",
        "cudnn.conv": "tf32",
        "mkldnn.matmul": "tf32",
    }
    assert precision.tf32_matmul()
    facts = cache.device_facts(torch.device("cpu"))
    assert facts["fp32_precision"]["cuda.matmul"] == "tf32"
    assert "+tf32" not in throughput.device_key("cpu", torch.float32)  # a CPU's peak is not TF32's
    # the CUDA branches of both readers, with the device's name and versions stubbed (no GPU here)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    monkeypatch.setattr(torch.backends.cudnn, "version", lambda: 91000)
    assert "float32+tf32" in throughput.device_key(torch.device("cuda", 0), torch.float32)
    cuda = cache.device_facts(torch.device("cuda", 0))
    assert cuda["name"] == "NVIDIA H200" and cuda["fp32_precision"]["cudnn.conv"] == "tf32"


def test_none_is_the_parents_setting_and_ieee_by_default():
    """ "none" at an op means its backend's, then the global setting; all "none" is full float32."""

    def node(value, **children):
        return types.SimpleNamespace(fp32_precision=value, **children)

    fake = types.SimpleNamespace(
        backends=types.SimpleNamespace(
            fp32_precision="none",
            cuda=types.SimpleNamespace(matmul=node("none")),
            cudnn=node("none", conv=node("tf32")),
            mkldnn=node("bf16", matmul=node("none")),
        )
    )
    assert precision.fp32_precision(fake) == {
        "cuda.matmul": "ieee",
        "cudnn.conv": "tf32",
        "mkldnn.matmul": "bf16",
    }
    fake.backends.fp32_precision = "tf32"
    assert precision.fp32_precision(fake)["cuda.matmul"] == "tf32"


def test_a_torch_without_the_new_api_reads_the_legacy_flags():
    fake = types.SimpleNamespace(
        backends=types.SimpleNamespace(
            cuda=types.SimpleNamespace(matmul=types.SimpleNamespace(allow_tf32=True)),
            cudnn=types.SimpleNamespace(allow_tf32=False),
        ),
        get_float32_matmul_precision=lambda: "highest",
    )
    assert precision.fp32_precision(fake) == {
        "cuda.matmul": "tf32",
        "cudnn.conv": "ieee",
        "mkldnn.matmul": "ieee",
    }
