"""Many X25519 agreements at once, part of them in a helper process: the simulation's key work.

A simulated SecAgg+ round computes every pair's two agreements (share-box key and mask key):
28,290 of them at n = 943, k = 30, about 0.8 s. ``cryptography``'s X25519 holds the GIL for
each call, so a second thread cannot share the work (measured: a thread looping on agreements
starves every other thread that needs the GIL), and during those 0.8 s one of the machine's
cores sits idle. :func:`exchange_many` gives the tail of a batch to one long-lived helper
process (``python -c`` with nothing but ``cryptography`` imported, started on first use and
kept for the life of the process) while the calling thread computes the head, then joins the
two. The shared secrets are the ones ``private.exchange(public)`` returns, bit for bit.

What crosses the pipe: the raw private keys of the clients whose pairs the helper computes,
their peers' public keys and the shared secrets. Everything in a simulated round already lives
in one process (the batched engine holds every client's secrets); the helper is a child of that
process, reached over an anonymous pipe, and writes nothing anywhere. Deployments (the per-client
stage machines, the Flower apps) never use it: each client computes its own agreements.

Anything that goes wrong in the helper (it cannot start, dies, or rejects a key) makes the
calling thread compute that part itself, so the result and any exception (``ValueError`` for a
low-order public key) are those of the in-process computation.
"""

from __future__ import annotations

import atexit
import os
import struct
import subprocess
import sys
import threading
from collections.abc import Sequence

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

from protocols.cores import usable_cores

MIN_PAIRS = 2048  # below this the pipe and key decoding cost more than the helper saves
HELPER_SHARE = 0.5  # the fraction of a batch the helper computes (the caller does the rest)
KEY_BYTES = 32

# The helper's whole program. Request: ``<III`` (unique private keys, unique public keys,
# pairs), the keys' raw bytes, then the pairs' private and public key indices (uint32 LE).
# Reply: one status byte (0: the secrets follow, 32 bytes a pair; 1: some pair failed).
_HELPER = r"""
import struct, sys
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
src, dst = sys.stdin.buffer, sys.stdout.buffer
while True:
    head = src.read(12)
    if len(head) != 12:
        break
    a, b, m = struct.unpack("<III", head)
    body = src.read(32 * (a + b) + 8 * m)
    if len(body) != 32 * (a + b) + 8 * m:
        break
    try:
        sk = [X25519PrivateKey.from_private_bytes(body[32 * i:32 * i + 32]) for i in range(a)]
        o = 32 * a
        pk = [X25519PublicKey.from_public_bytes(body[o + 32 * i:o + 32 * i + 32]) for i in range(b)]
        o += 32 * b
        ii = struct.unpack_from(f"<{m}I", body, o)
        jj = struct.unpack_from(f"<{m}I", body, o + 4 * m)
        reply = b"\0" + b"".join([sk[i].exchange(pk[j]) for i, j in zip(ii, jj)])
    except Exception:
        reply = b"\1"
    dst.write(reply)
    dst.flush()
"""


class _Helper:
    """One helper process of this process (a forked child starts its own)."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _HELPER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            # Not in the terminal's process group: Ctrl-C interrupts the run, not its helper
            # (which exits when its stdin closes, also when the parent is killed).
            start_new_session=True,
        )

    def request(
        self, private: Sequence[X25519PrivateKey], public: Sequence[X25519PublicKey]
    ) -> int:
        """Send one batch; returns its number of pairs, for :meth:`reply`."""
        priv_index: dict[int, int] = {}
        pub_index: dict[int, int] = {}
        priv_raw: list[bytes] = []
        pub_raw: list[bytes] = []
        ii: list[int] = []
        jj: list[int] = []
        for sk, pk in zip(private, public, strict=True):
            i = priv_index.get(id(sk))
            if i is None:
                i = priv_index[id(sk)] = len(priv_raw)
                priv_raw.append(sk.private_bytes_raw())
            j = pub_index.get(id(pk))
            if j is None:
                j = pub_index[id(pk)] = len(pub_raw)
                pub_raw.append(pk.public_bytes_raw())
            ii.append(i)
            jj.append(j)
        m = len(ii)
        assert self.proc.stdin is not None
        self.proc.stdin.write(
            struct.pack("<III", len(priv_raw), len(pub_raw), m)
            + b"".join(priv_raw)
            + b"".join(pub_raw)
            + struct.pack(f"<{m}I", *ii)
            + struct.pack(f"<{m}I", *jj)
        )
        self.proc.stdin.flush()
        return m

    def reply(self, m: int) -> list[bytes] | None:
        """The batch's secrets, or ``None`` where the helper rejected a key."""
        assert self.proc.stdout is not None
        status = self.proc.stdout.read(1)
        if status == b"\1":
            return None
        data = self.proc.stdout.read(KEY_BYTES * m)
        if status != b"\0" or len(data) != KEY_BYTES * m:
            raise OSError("the agreement helper closed its pipe")
        return [data[KEY_BYTES * p : KEY_BYTES * (p + 1)] for p in range(m)]

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.close()
                self.proc.wait(timeout=2)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()


_lock = threading.Lock()
_helper: _Helper | None = None
_broken = False


def _get_helper() -> _Helper | None:
    """This process's helper, started on first use; ``None`` where it cannot run. Hold _lock."""
    global _helper, _broken
    if _helper is not None and _helper.pid != os.getpid():  # a forked child: not its helper
        _helper, _broken = None, False
    if _broken:
        return None
    if _helper is None or _helper.proc.poll() is not None:
        try:
            _helper = _Helper()
        except OSError:
            _broken = True
            return None
    return _helper


def _drop_helper() -> None:
    global _helper, _broken
    if _helper is not None:
        _helper.close()
    _helper, _broken = None, True


@atexit.register
def _close_helper() -> None:
    if _helper is not None and _helper.pid == os.getpid():
        _helper.close()


def exchange_many(
    private: Sequence[X25519PrivateKey], public: Sequence[X25519PublicKey]
) -> list[bytes]:
    """``[private[p].exchange(public[p]) for p]``, the batch's tail computed by the helper.

    Args:
        private: Each pair's private key (the same object may appear in many pairs; the
            helper decodes each distinct object once).
        public: Each pair's peer public key.

    Returns:
        The 32-byte shared secrets, in pair order.

    Raises:
        ValueError: A public key is a low-order point (as ``X25519PrivateKey.exchange``).
    """
    m = len(private)
    if len(public) != m:
        raise ValueError(f"private and public must have the same length, got {m} and {len(public)}")
    split = m - int(m * HELPER_SHARE)
    if m < MIN_PAIRS or split == m or usable_cores() < 2 or not _lock.acquire(blocking=False):
        return [sk.exchange(pk) for sk, pk in zip(private, public, strict=True)]
    try:
        helper = _get_helper()
        pending = None
        if helper is not None:
            try:
                pending = helper.request(private[split:], public[split:])
            except OSError:
                _drop_helper()
                helper = None
        tail = None
        try:
            head = [private[p].exchange(public[p]) for p in range(split)]
        finally:  # the reply is read even when the head raised: the pipe stays in step
            if helper is not None and pending is not None:
                try:
                    tail = helper.reply(pending)
                except OSError:
                    _drop_helper()
        if tail is None:  # no helper, or it rejected a key: the same computation, here
            tail = [private[p].exchange(public[p]) for p in range(split, m)]
        return head + tail
    finally:
        _lock.release()
