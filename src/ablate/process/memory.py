"""How this process's C heap hands freed memory back to the OS: the `malloc_mmap_threshold` config key.

torch's CPU tensors come from glibc's malloc. glibc serves a block of at least M_MMAP_THRESHOLD bytes
with its own mmap, returned to the OS on free; smaller ones come from the heap, which keeps freed
memory for reuse. The threshold starts at 128 KiB but glibc raises it to the size of each mmapped
block freed (up to 32 MiB), so after a training step's first activations are freed nearly every
tensor lives on the heap, and the heap's free holes (activations, gradients and optimizer state of
mixed lifetimes) are never given back. Fixing the threshold turns that adjustment off: blocks above
it are always mmapped and freed for real. Numbers are unchanged (only where bytes live); peak RSS
falls, and each such allocation costs fresh page faults (more system time).

Measured (benchmarks/dpo_vs_trl.py --preset smollm2, SmolLM2-135M fp32, batch 8 pairs, 2 steps):
peak RSS 4052-4128 MB -> 3557-3558 MB at 131072 (TRL 1.16: ~5797), ~+2 s of system time per step
(~15%) on a 2-core VM. 1 MiB keeps most of it (3642 MB); 4 MiB and 16 MiB almost none (4074, 4186).
Off by default (null) for that cost; memory-bound runs turn it on with malloc_mmap_threshold=131072.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from typing import Any

# glibc's malloc.h; the value's range is checked by its schema (ablate.schema.nodes.Root)
M_MMAP_THRESHOLD = -3


def glibc() -> Any:
    """This process's C library when it is glibc (it has mallopt), else None (macOS, musl)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    return libc if hasattr(libc, "gnu_get_libc_version") else None  # a symbol of glibc only


def apply(threshold: int | None) -> dict[str, Any]:
    """Fix glibc's mmap threshold at `threshold` bytes (None: leave malloc as it is); returns what
    run.json records. A no-op (recorded as None) where the C library is not glibc."""
    if threshold is None:
        return {}
    from ablate.errors import ConfigError

    libc = glibc()
    if libc is None:
        return {"malloc_mmap_threshold": None}
    if not libc.mallopt(M_MMAP_THRESHOLD, int(threshold)):
        raise ConfigError(f"malloc_mmap_threshold={threshold}: glibc's mallopt refused it")
    return {"malloc_mmap_threshold": int(threshold)}
