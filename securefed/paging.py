"""Tensors held in a file the kernel pages, not in the process's memory.

A :class:`PagedTensor` is a ``MAP_SHARED`` mapping of an unlinked, preallocated temporary file
(FedRAP's ``views="paged"``: MovieLens 1M's 6,040 x 3,706 x 32 private views are 2.9 GB).
Reading or writing it faults its pages into the process, where they count as resident
memory until :meth:`PagedTensor.release` drops them from the mapping with
``madvise(MADV_DONTNEED)``: the data stays in the file's page cache (written pages are written
back by the kernel, never lost), which the kernel can write out and evict under memory
pressure, so the process's resident set stays at what it touches between two releases.
Callers touch the tensor a bounded block at a time (:data:`RELEASE_BYTES`) and release after
each block.

The file is unlinked as soon as it is created, so it disappears with the process, even after
``kill -9``; it is preallocated (``posix_fallocate``), so a full disk is one clear error at
creation, not a ``SIGBUS`` in the middle of a round.

:func:`write_releasing` writes a buffer to a file in blocks and releases every block that lies
in a paged tensor: ``torch.save`` of a state holding one (``securefed.runs.save_state``)
streams it to disk without making all of it resident.
"""

from __future__ import annotations

import math
import mmap
import os
import tempfile
import threading
import weakref
from typing import BinaryIO

import numpy as np
import torch

from securefed.errors import ConfigError

__all__ = ["RELEASE_BYTES", "PagedTensor", "aminmax", "paged_owners", "pageout", "write_releasing"]

#: Bytes of a paged tensor touched between two releases (so at most this much of it is
#: resident at a time, per block being worked on).
RELEASE_BYTES = 64 << 20

_LIVE: weakref.WeakSet[PagedTensor] = weakref.WeakSet()
_LIVE_LOCK = threading.Lock()


class PagedTensor:
    """A contiguous tensor stored in an unlinked temporary file, mapped shared.

    Attributes:
        tensor: The mapped tensor (reads and writes go to the file's pages).
        nbytes: Its size in bytes.
    """

    def __init__(
        self,
        shape: tuple[int, ...],
        dtype: torch.dtype = torch.float32,
        *,
        directory: str | os.PathLike[str] | None = None,
    ) -> None:
        """A zero-filled tensor of ``shape`` in a new file under ``directory`` (default: the
        system's temporary directory, ``$TMPDIR``).

        Raises:
            ConfigError: the directory does not exist or cannot hold the file (disk full,
                no permission), with the bytes it needs.
        """
        itemsize = torch.empty((), dtype=dtype).element_size()
        self.nbytes = math.prod(shape) * itemsize
        where = str(directory) if directory else tempfile.gettempdir()
        try:
            fd, path = tempfile.mkstemp(dir=where, prefix="securefed-paged-", suffix=".bin")
        except OSError as exc:
            raise ConfigError(
                f"cannot create the paged state's file in {where}: {exc.strerror}; give a "
                "writable directory (--param views_dir=DIR, or $TMPDIR)"
            ) from None
        try:
            os.unlink(path)  # gone with the process, whatever ends it
            if self.nbytes:
                try:
                    if hasattr(os, "posix_fallocate"):
                        os.posix_fallocate(fd, 0, self.nbytes)
                    else:  # macOS: a sparse file; a full disk then shows up when pages are written
                        os.ftruncate(fd, self.nbytes)
                except OSError as exc:
                    raise ConfigError(
                        f"cannot reserve {self.nbytes / 1e9:.2f} GB for the paged state in "
                        f"{where}: {exc.strerror}; free disk space there or give another "
                        "directory (--param views_dir=DIR, or $TMPDIR)"
                    ) from None
            size = max(self.nbytes, 1)
            if not self.nbytes:
                os.ftruncate(fd, size)
            self._map = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        flat = torch.frombuffer(self._map, dtype=torch.uint8)[: self.nbytes]
        self.tensor = flat.view(dtype).view(shape)
        self._start = self.tensor.data_ptr()
        with _LIVE_LOCK:
            _LIVE.add(self)

    def release(self) -> None:
        """Drop every page of the tensor from the process's resident set (the data stays in
        the file; the next access faults it back in from the page cache or the disk)."""
        self._map.madvise(mmap.MADV_DONTNEED)

    def _release_range(self, start: int, end: int) -> None:
        """Release the whole pages of ``[start, end)`` (absolute addresses) in the tensor."""
        page = mmap.PAGESIZE
        lo = max(start, self._start) - self._start
        hi = min(end, self._start + self.nbytes) - self._start
        lo = (lo // page) * page  # mmap offsets are page aligned; partial pages are ours too
        if hi > lo:
            self._map.madvise(mmap.MADV_DONTNEED, lo, hi - lo)

    def copy_(self, source: torch.Tensor, *, release_source: bool = False) -> None:
        """Copy ``source`` (the tensor's shape) in, :data:`RELEASE_BYTES` at a time; with
        ``release_source`` each block of the source is paged out once copied (a tensor
        ``torch.load(mmap=True)`` mapped from a checkpoint file; memory that cannot be paged
        out, such as anonymous memory without swap, stays as it is)."""
        if tuple(source.shape) != tuple(self.tensor.shape):
            raise ValueError(
                f"cannot copy a tensor of shape {tuple(source.shape)} into a paged tensor of "
                f"shape {tuple(self.tensor.shape)}"
            )
        for lo, hi in self.blocks():
            self.tensor[lo:hi].copy_(source[lo:hi])
            self.release()
            if release_source:
                pageout(source[lo:hi])

    def blocks(self) -> list[tuple[int, int]]:
        """``(lo, hi)`` ranges of the first dimension of about :data:`RELEASE_BYTES` each."""
        n = self.tensor.shape[0] if self.tensor.dim() else 1
        per = max(1, self.nbytes // max(1, n))
        step = max(1, RELEASE_BYTES // per)
        return [(lo, min(n, lo + step)) for lo in range(0, n, step)]


def pageout(tensor: torch.Tensor) -> None:
    """Ask the kernel to reclaim the whole pages of a contiguous CPU tensor
    (``madvise(MADV_PAGEOUT)``, Linux 5.4+): file-backed pages leave the resident set and
    are read back from the file if touched again; the data never changes, whatever backs it
    (unlike ``MADV_DONTNEED``, which would zero anonymous memory). A no-op where the kernel
    does not support it."""
    if not tensor.is_contiguous() or tensor.device.type != "cpu" or not tensor.numel():
        return
    page = mmap.PAGESIZE
    start = tensor.data_ptr()
    end = start + tensor.numel() * tensor.element_size()
    lo = -(-start // page) * page
    if end - lo >= page:
        _madvise(lo, ((end - lo) // page) * page, _MADV_PAGEOUT)


_MADV_PAGEOUT = getattr(mmap, "MADV_PAGEOUT", 21)


def _madvise(address: int, length: int, advice: int) -> None:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    libc.madvise(ctypes.c_void_p(address), ctypes.c_size_t(length), advice)  # advisory only


def paged_owners(value: object) -> list[PagedTensor]:
    """The live :class:`PagedTensor` s whose data the tensors in ``value`` (a tensor, or
    dicts / lists / tuples of them) lie in."""
    if isinstance(value, torch.Tensor):
        if value.device.type != "cpu" or not value.numel():
            return []
        ptr = value.data_ptr()
        with _LIVE_LOCK:
            return [p for p in _LIVE if p._start <= ptr < p._start + p.nbytes]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, list | tuple):
        return [p for v in value for p in paged_owners(v)]
    return []


def aminmax(tensor: torch.Tensor) -> tuple[float, float]:
    """``torch.aminmax`` of a float tensor as Python floats; a tensor lying in paged memory is
    reduced :data:`RELEASE_BYTES` at a time along its first dimension, released after each
    block."""
    owners = paged_owners(tensor)
    if not owners or tensor.dim() == 0:
        low, high = torch.aminmax(tensor)
        return float(low), float(high)
    per = max(1, tensor[:1].numel() * tensor.element_size())
    step = max(1, RELEASE_BYTES // per)
    lows, highs = [], []
    for lo in range(0, tensor.shape[0], step):
        low, high = torch.aminmax(tensor[lo : lo + step])
        lows.append(float(low))
        highs.append(float(high))
        for paged in owners:
            paged.release()
    if any(math.isnan(v) for v in lows + highs):
        return math.nan, math.nan
    return min(lows), max(highs)


def write_releasing(fh: BinaryIO, data: memoryview | bytes) -> int:
    """Write ``data`` to ``fh`` :data:`RELEASE_BYTES` at a time, releasing each block that lies
    in a live :class:`PagedTensor` once written (so streaming a paged tensor to disk does not
    make it resident). Returns the bytes written."""
    view = memoryview(data).cast("B")
    with _LIVE_LOCK:
        live = list(_LIVE)
    start = _address(view)
    owners = [p for p in live if p._start < start + len(view) and start < p._start + p.nbytes]
    for lo in range(0, len(view), RELEASE_BYTES):
        block = view[lo : lo + RELEASE_BYTES]
        fh.write(block)
        for p in owners:
            p._release_range(start + lo, start + lo + len(block))
    return len(view)


def _address(view: memoryview) -> int:
    """The address of a contiguous memoryview's first byte (read-only ones too; 0 if empty)."""
    if not len(view):
        return 0
    return int(np.frombuffer(view, dtype=np.uint8).ctypes.data)
