"""TF32: whether float32 matmuls and convolutions may run in TensorFloat-32, read the way torch sets it.

torch >= 2.9 sets float32 precision per backend and operation (`torch.backends.cuda.matmul.fp32_precision`,
`torch.backends.cudnn.conv.fp32_precision`, ...: "tf32", "ieee", or "none" = the parent's setting, up to
`torch.backends.fp32_precision`), and once anything has set one of those it refuses to read the legacy
flags (`torch.backends.cuda.matmul.allow_tf32`, `torch.get_float32_matmul_precision()`: "mix of the
legacy and new APIs"). transformers' `tf32=True` (`precision.tf32=true`) sets the new one. So ablate
reads only the new API where torch has it, and the legacy flags only on a torch that lacks it; every
reader in ablate goes through here (the peak-FLOPs cache key, the sweep cache's device facts).
"""

from __future__ import annotations

from typing import Any

# the operations whose float32 precision decides numbers ablate records: (backend, op) under torch.backends
OPS = (("cuda", "matmul"), ("cudnn", "conv"), ("mkldnn", "matmul"))


def fp32_precision(torch: Any = None) -> dict[str, str]:
    """Each op's float32 precision, "none" resolved through its parents: {"cuda.matmul": "tf32" | "ieee"
    | ..., "cudnn.conv": ..., "mkldnn.matmul": ...} (mkldnn may also say "bf16"). On a torch without the
    new API: the legacy flags, as the same names."""
    if torch is None:
        import torch
    backends = torch.backends
    if not hasattr(getattr(backends.cuda, "matmul", None), "fp32_precision"):  # torch < 2.9: the legacy flags
        return {
            "cuda.matmul": "tf32" if backends.cuda.matmul.allow_tf32 else "ieee",
            "cudnn.conv": "tf32" if backends.cudnn.allow_tf32 else "ieee",
            "mkldnn.matmul": {"highest": "ieee", "high": "tf32", "medium": "bf16"}.get(
                torch.get_float32_matmul_precision(), "ieee"
            ),
        }
    return {f"{backend}.{op}": _resolved(backends, backend, op) for backend, op in OPS}


def _resolved(backends: Any, backend: str, op: str) -> str:
    """The op's setting, else its backend's, else the global one; "ieee" when all say "none" (torch's
    default: full float32; cuDNN's convolutions default to "tf32" at the op itself)."""
    node = getattr(backends, backend, None)
    chain = [getattr(node, op, None), node, backends]
    for where in chain:
        value = getattr(where, "fp32_precision", "none") if where is not None else "none"
        if value != "none":
            return str(value)
    return "ieee"


def tf32_matmul(torch: Any = None) -> bool:
    """Whether CUDA float32 matmuls may run in TF32."""
    return fp32_precision(torch)["cuda.matmul"] == "tf32"
