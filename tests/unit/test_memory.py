"""ablate.process.memory: the malloc_mmap_threshold key really changes where glibc puts a freed-and-reallocated
block (each case in its own process: the setting is process-wide)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ablate.errors import ConfigError
from ablate.process import memory
from ablate.schema.nodes import Root

pytestmark = pytest.mark.skipif(memory.glibc() is None, reason="glibc only")

# malloc 1 MiB, free it, malloc it again: prints the bytes glibc holds in mmapped blocks (mallinfo2's
# hblkhd) while the second block is live. glibc's default raises its threshold on the first free, so
# the second block comes from the heap (0); a fixed 128 KiB threshold mmaps it again.
PROBE = """
import ctypes, sys
from ablate.process import memory
info = memory.apply(None if sys.argv[1] == "none" else int(sys.argv[1]))
libc = memory.glibc()
class Mallinfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]
libc.mallinfo2.restype = Mallinfo2
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
libc.free(libc.malloc(1 << 20))
p = libc.malloc(1 << 20)
print(info.get("malloc_mmap_threshold"), libc.mallinfo2().hblkhd >= 1 << 20)
"""


def _probe(setting: str) -> str:
    return subprocess.run(
        [sys.executable, "-c", PROBE, setting], capture_output=True, text=True, check=True
    ).stdout.strip()


def test_fixed_threshold_mmaps_again() -> None:
    assert _probe("none") == "None False"  # glibc's dynamic threshold: the heap keeps it
    assert _probe("131072") == "131072 True"  # fixed: mmapped, so free() returns it to the OS


def test_bad_threshold_is_a_config_error() -> None:
    with pytest.raises(
        ConfigError, match=r"^malloc_mmap_threshold=-1: must be null \(malloc's default\) or bytes"
    ):
        Root(malloc_mmap_threshold=-1)  # the value's one check: its schema
    assert memory.apply(None) == {}
