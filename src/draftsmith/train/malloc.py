"""A fixed mmap threshold for glibc malloc in CPU training runs.

Why (bench/memory_scaling.py --malloc default fixed, docs/benchmarks.md "Memory scaling"): glibc's
mmap threshold is dynamic. Each freed mmapped block raises it to that block's size (up to 32 MiB on
64-bit), so later blocks of that size come from the heap, whose freed space the process keeps. A
training step's activations are many 8-32 MiB tensors (T x H bf16 at T 1-4k, H 4096), so the resident
set grew with the largest working set seen, well above the tensors alive: one 2,048 x 128,256 EAGLE-3
step took 1.42-1.59 GiB over its starting resident set as it was (two runs), 1.04 GiB with the threshold fixed at
1 MiB, where live tensors and the resident set agree. Setting the threshold (or the trim threshold)
with ``mallopt`` turns the dynamic rule off; blocks >= 1 MiB then go back to the kernel when freed.

Only CPU runs: CUDA tensors do not come from malloc. A user who set ``MALLOC_MMAP_THRESHOLD_`` or
``MALLOC_TRIM_THRESHOLD_`` (glibc's own environment knobs) keeps their choice.
"""

from __future__ import annotations

import ctypes
import os

__all__ = ["fix_malloc", "MMAP_THRESHOLD"]

# glibc's mallopt parameter numbers (malloc.h)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD = 1 << 20  # bytes; a block this size or larger is mmapped and returned when freed


def fix_malloc(mmap_bytes: int = MMAP_THRESHOLD) -> bool:
    """Fix glibc's mmap threshold at ``mmap_bytes`` (trim threshold twice that). True when set; False
    where the user already chose (their environment) or libc is not glibc (no ``mallopt``)."""
    if os.environ.get("MALLOC_MMAP_THRESHOLD_") or os.environ.get("MALLOC_TRIM_THRESHOLD_"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(M_MMAP_THRESHOLD, int(mmap_bytes))) and \
            bool(libc.mallopt(M_TRIM_THRESHOLD, 2 * int(mmap_bytes)))
    except (OSError, AttributeError):
        return False
