"""Keep large tensor buffers in the process heap instead of fresh mmap'd pages.

glibc serves allocations above its mmap threshold (at most 32 MiB by default) with a fresh
``mmap`` and returns them with ``munmap`` on free. A FedRAP round on MovieLens 100K allocates
and frees buffers of hundreds of MiB every round (gathers of the private views and their
gradients), so every round page-faults them in again: over 100 rounds the process spent
108 s of system CPU next to 123 s of user CPU. Raising the mmap and trim thresholds keeps
those pages in the heap for reuse: 20 FedRAP rounds went from 31.7 s wall (24.2 s system
CPU, 7.5 M minor page faults) to 18.2 s (2.8 s, 0.3 M) with identical results
(docs/benchmarks.md). Memory freed by the run stays with the process until it exits.

Buffers above :data:`MMAP_THRESHOLD` (256 MiB) still get their own mapping and go back to the
system when freed. With a 1 GiB threshold the MovieLens-1M-sized FedRAP round (6040 x 3706,
buffers of 0.6-2.9 GB) ran 2x faster but its peak RSS grew from 5.6 to 6.4-7.1 GB, past the
6 GB target, as freed giant buffers stayed in a fragmented heap; MovieLens 100K's buffers
(at most ~200 MB) are as fast with 256 MiB as with 1 GiB.

Threads allocate from glibc arenas of their own (up to 8 per core): a block a mask thread or
a noise thread allocates and frees stays in that thread's arena, and the next round's threads
may be handed other arenas, so freed blocks accumulate. :data:`ARENA_MAX` caps the arenas at
two (the main thread's and one that every other thread shares): the README's `securefed train
--secagg --epsilon 2` (3,000 clients, streamed secure rounds, 3 rounds) peaked at 3.57 GB RSS
uncapped, 2.50 GB with two arenas and 2.15 GB with one (``MALLOC_ARENA_MAX``), 2.60 GB with
this cap set first thing in the CLI, at the same speed (23-27 s a round each); FedRAP on
MovieLens 100K with `--secagg --epsilon 1` 2.24-2.27 -> 2.03-2.13 GB, its plain rounds and
the MovieLens-1M-sized paged round unchanged in time and memory (docs/benchmarks.md).

Reuse is not exact: torch asks glibc for 64-byte aligned blocks, a little larger than a freed
block of the same tensor size, so a freed buffer fenced in by small blocks (the thread pool
leaves some) is sometimes passed over and the heap grows instead. Measured 2026-12-04 on 15
FedRAP rounds on MovieLens 100K: 0.23 M minor faults and 1.30 GB peak RSS with the thresholds,
5.6 M faults and 1.05 GB without (30.9 s against 36.5 s wall).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

__all__ = ["keep_large_buffers"]

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
#: Allocations at least this large still get a fresh mapping (returned to the OS on free).
MMAP_THRESHOLD = 256 << 20
#: glibc malloc arenas: the main thread's and one shared by every other thread.
ARENA_MAX = 2
_done: bool | None = None


def keep_large_buffers() -> bool:
    """Raise glibc's mmap and trim thresholds and cap its arenas, once per process.

    Arenas that threads already use stay; the cap applies to threads' later arena choices,
    so call this before starting worker threads.

    Returns:
        True if the thresholds are set (Linux with glibc), False elsewhere (no-op).
    """
    global _done
    if _done is not None:
        return _done
    _done = False
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False  # not glibc (e.g. musl has no mallopt)
    ok = mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
    ok = mallopt(_M_TRIM_THRESHOLD, (1 << 31) - 1) == 1 and ok
    ok = mallopt(_M_ARENA_MAX, ARENA_MAX) == 1 and ok
    _done = ok
    return ok
