"""The discrete Gaussian from a table of blocks: the sampler of secure (OS-random) noise shares.

A distributed-DP round of FedRAP on MovieLens 100K draws 943 x 53,824 shares of
N_Z(0, sigma**2) with sigma about 2e5 (the fixed-point scale times the clipped update's share
of the noise). Canonne, Kamath and Steinke's rejection sampler (:func:`protocols.dp.noise.
discrete_gaussian` on a generator) spends three uniforms, two logarithms and an exponential a
proposal and accepts about three proposals in four; this one spends two 64-bit keystream words
and one exponential and accepts more than 99 in 100 (docs/privacy.md, "Distributed discrete
Gaussian: what the accounting assumes").

The method (an alias table over blocks, then rejection within a block):

- The integers in ``[-K M, K M)`` are cut into ``2 K`` blocks of ``M = 2**k`` consecutive
  integers, ``M`` at most ``sigma / 64`` (1 below sigma 128) and ``K M >= 14 sigma``: the mass
  left out, ``P[|X| >= 14 sigma]``, is below ``2 exp(-98) < 1e-42``.
- Block ``j`` gets the envelope weight ``exp(-c_j**2 / (2 sigma**2))``, ``c_j`` its integer
  nearest to 0, i.e. the largest value the density takes in the block. The weights are
  normalised and quantised to integers that sum to exactly ``2**64`` and put in a Walker/Vose
  alias table of ``2**b`` entries, built in integer arithmetic, so a block is drawn with
  probability exactly ``weight / 2**64`` from one 64-bit word: its top ``b`` bits pick an
  entry, its other ``64 - b`` bits decide between the entry and its alias.
- A second word gives the offset in the block (its top ``k`` bits, exactly uniform since ``M``
  is a power of two) and a 53-bit uniform (the next 53 bits); the proposal ``x`` is accepted
  when that uniform is below ``exp(-(x**2 - c_j**2) / (2 sigma**2))``, the density at ``x``
  over the block's envelope (at least ``exp(-14 M / sigma) >= 0.80``; 0.996 on average at
  ``M = sigma / 100``). With ``M = 1`` every proposal is accepted and one word is drawn.

Accepted ``x`` has ``P[x]`` proportional to ``exp(-x**2 / (2 sigma**2))``. In floating point
the block weights carry relative errors of a few ``2**-53`` before quantisation (at most
``2**-64`` each) and the acceptance test is exact on the 53-bit grid, so the distribution the
tables realise is within about ``1e-15`` in total variation of N_Z(0, sigma**2) (the tests
compute it, entry by entry and offset by offset, from the tables this module builds).
:func:`realized_pmf` gives that distribution exactly, for audits.

Only for OS randomness: replay runs (a ``torch.Generator``) keep the rejection sampler, whose
draws they reproduce bit for bit. Every call takes its own keystream (a fresh AES-256 key from
``os.urandom``), so calls on different threads are independent.
"""

from __future__ import annotations

import functools
import math
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

#: Sigmas the table covers on each side: ``P[|X| >= 14 sigma] < 2 exp(-98)``.
TAIL_SIGMAS = 14.0
#: The block width ``M = 2**k`` stays at most ``sigma / 64``: a proposal is then accepted
#: with probability at least ``exp(-14 / 64) = 0.80`` and 0.994 on average.
WIDTH_PER_SIGMA = 64.0
#: ``k`` bits of the second word place ``x`` in its block and the next 53 bits are the
#: acceptance uniform, so ``k <= 64 - 53``.
MAX_BLOCK_BITS = 11
#: At most ``2**16`` table entries (768 KiB of tables, in a core's cache). Sigma above
#: :data:`TABLE_SIGMA_MAX` needs more and goes to the rejection sampler.
MAX_TABLE_BITS = 16
TABLE_SIGMA_MAX = (1 << (MAX_TABLE_BITS - 1)) * (1 << MAX_BLOCK_BITS) / TAIL_SIGMAS
#: Samples per pass: the pass's dozen temporaries (8 bytes a sample each) stay in cache
#: (50.7 M samples on two threads: 2**15 0.62 s, 2**16 0.54-0.56 s, 2**19 0.63 s here).
PIECE = 1 << 16

_TWO_53 = 2.0**53
_U53 = np.uint64(11)  # a word shifted right by 11 keeps its top 53 bits


@dataclass(frozen=True, eq=False)
class BlockTable:
    """The alias table of one sigma (:func:`block_table`).

    Attributes:
        sigma: The discrete Gaussian's scale.
        block_bits: ``k``: blocks are ``M = 2**k`` consecutive integers.
        table_bits: ``b``: the table has ``2**b`` entries (blocks, padded with empty ones).
        start: The first integer of entry 0's block, ``-K M``.
        blocks: ``2 K``, the entries that are blocks.
        keep: Per entry, the draw keeps the entry when the word's low ``64 - b`` bits are
            below this (uint64; ``2**(64 - b)``: always kept).
        alias: Per entry, the entry taken otherwise (int64).
        nearest: Per entry, the block's integer nearest to 0, ``c_j`` (int64).
        weights: Per entry, the block's probability times ``2**64`` (Python ints; they sum to
            ``2**64``), what ``keep`` and ``alias`` realise exactly.
    """

    sigma: float
    block_bits: int
    table_bits: int
    start: int
    blocks: int
    keep: np.ndarray
    alias: np.ndarray
    nearest: np.ndarray
    weights: tuple[int, ...]


@functools.lru_cache(maxsize=8)
def block_table(sigma: float) -> BlockTable | None:
    """The block table of N_Z(0, ``sigma**2``), or ``None`` above :data:`TABLE_SIGMA_MAX`.

    Built once per sigma (a round's shares all have the same sigma) in a few milliseconds:
    envelope weights in float64, quantised to integers summing to ``2**64`` (the heaviest
    block takes what the floors miss), then Vose's alias method
    in integer arithmetic, so entry ``j`` is drawn with probability exactly
    ``weights[j] / 2**64``.
    """
    if not sigma <= TABLE_SIGMA_MAX:
        return None
    k = 0
    if sigma >= 2 * WIDTH_PER_SIGMA:
        k = min(MAX_BLOCK_BITS, int(math.floor(math.log2(sigma / WIDTH_PER_SIGMA))))
    width = 1 << k
    half = max(1, math.ceil(TAIL_SIGMAS * sigma / width))
    blocks = 2 * half
    bits = (blocks - 1).bit_length()
    size = 1 << bits
    q = np.arange(blocks, dtype=np.int64) - half
    nearest = np.where(q >= 0, q * width, q * width + (width - 1))
    envelope = np.exp(-np.square(nearest.astype(np.float64)) / (2.0 * sigma * sigma))
    share = envelope / envelope.sum()
    weights = [int(math.floor(p * 2.0**64)) for p in share.tolist()] + [0] * (size - blocks)
    # The floats' sum is 1 within a few 2**-53, so the floors miss 2**64 by a few thousand
    # units (a few 2**-53 of the heaviest block's weight) either way: the heaviest block
    # takes the difference.
    heaviest = max(range(blocks), key=weights.__getitem__)
    weights[heaviest] += (1 << 64) - sum(weights)
    cap = 1 << (64 - bits)  # each entry's share of the 2**64 words
    keep = [cap] * size
    alias = list(range(size))
    left = list(weights)
    small = [j for j in range(size) if left[j] < cap]
    large = [j for j in range(size) if left[j] >= cap]
    while small and large:
        s, g = small.pop(), large.pop()
        keep[s], alias[s] = left[s], g
        left[g] -= cap - left[s]
        (small if left[g] < cap else large).append(g)
    # Whatever is left over is full (``left == cap``, exactly, in integers).
    padded = np.zeros(size, dtype=np.int64)
    padded[:blocks] = nearest
    return BlockTable(
        sigma=float(sigma),
        block_bits=k,
        table_bits=bits,
        start=-half * width,
        blocks=blocks,
        keep=np.array(keep, dtype=np.uint64),
        alias=np.array(alias, dtype=np.int64),
        nearest=padded,
        weights=tuple(weights),
    )


def scaled_acceptance(
    x: np.ndarray, nearest: np.ndarray, sigma: float, out: np.ndarray, scratch: np.ndarray
) -> np.ndarray:
    """``2**53 exp(-(x**2 - c**2) / (2 sigma**2))`` into ``out`` (float64): proposal ``x`` is
    accepted when its 53-bit integer uniform is below it. ``x**2 - c**2`` is formed as
    ``(x - c)(x + c)`` in int64, exact (``|x - c| < M``, ``|x + c| < 2**28``). ``nearest`` is
    overwritten; ``scratch`` is an int64 array of ``x``'s size."""
    np.subtract(x, nearest, out=scratch)
    nearest += x
    scratch *= nearest
    np.multiply(scratch, -1.0 / (2.0 * sigma * sigma), out=out)
    np.exp(out, out=out)
    out *= _TWO_53  # exact: a power of two
    return out


_scratch = threading.local()


def _buffers(n: int) -> tuple[memoryview, bytearray, list[np.ndarray]]:
    """This thread's zeros, keystream buffer and five arrays of ``n`` 8-byte words."""
    held = getattr(_scratch, "buffers", None)
    if held is None or len(held[2][0]) < n:
        held = (
            memoryview(bytes(16 * n)),
            bytearray(16 * n + 16),  # update_into needs block_size - 1 spare bytes
            [np.empty(n, dtype=np.int64) for _ in range(4)] + [np.empty(n, dtype=np.float64)],
        )
        _scratch.buffers = held
    return held


def _propose(table: BlockTable, out: np.ndarray, cipher: Any) -> np.ndarray | None:
    """Fill ``out`` (int64) with proposals from ``cipher``'s keystream; returns which were
    accepted (a view of this thread's buffer), or ``None`` when all are (``M = 1``)."""
    n = out.size
    zeros, stream, (entry, chosen, work, flags, accept) = _buffers(n)
    words_per = 1 if table.block_bits == 0 else 2
    cipher.update_into(zeros[: 8 * words_per * n], stream)
    words = np.frombuffer(stream, dtype="<u8", count=words_per * n)
    first = words[:n]
    bits = table.table_bits
    idx = entry[:n]
    np.right_shift(first, np.uint64(64 - bits), out=idx.view(np.uint64))
    np.bitwise_and(first, np.uint64((1 << (64 - bits)) - 1), out=first)
    limit = np.take(table.keep, idx, out=work[:n].view(np.uint64))
    kept = np.less(first, limit, out=flags[:n].view(np.bool_)[:n])
    block = np.take(table.alias, idx, out=chosen[:n])
    np.copyto(block, idx, where=kept)
    k = table.block_bits
    if k == 0:
        np.add(block, table.start, out=out)
        return None
    second = words[n:]
    np.left_shift(block, k, out=out)
    out += table.start
    offset = entry[:n]
    np.right_shift(second, np.uint64(64 - k), out=offset.view(np.uint64))
    out += offset
    nearest = np.take(table.nearest, block, out=work[:n])
    scaled = scaled_acceptance(out, nearest, table.sigma, accept[:n], offset)
    np.left_shift(second, np.uint64(k), out=second)
    np.right_shift(second, _U53, out=second)  # the 53 bits after the offset's k
    return np.less(second, scaled, out=flags[:n].view(np.bool_)[:n])


def fill(out: np.ndarray, table: BlockTable, cipher: Any) -> None:
    """Fill the 1-D int64 array ``out`` with N_Z(0, sigma**2) samples drawn from
    ``cipher``'s keystream (:func:`protocols.dp.noise.os_cipher`), :data:`PIECE` at a time;
    rejected proposals are redrawn together at the end, until none is left."""
    n = out.size
    rejected: list[np.ndarray] = []
    for lo in range(0, n, PIECE):
        accepted = _propose(table, out[lo : lo + PIECE], cipher)
        if accepted is not None and not accepted.all():
            rejected.append(np.flatnonzero(~accepted) + lo)
    if not rejected:
        return
    pending = np.concatenate(rejected)
    again = np.empty(min(pending.size, PIECE), dtype=np.int64)
    while pending.size:
        part = pending[:PIECE]
        drawn = again[: part.size]
        accepted = _propose(table, drawn, cipher)
        assert accepted is not None  # only M > 1 rejects
        out[part] = drawn
        pending = np.concatenate([part[~accepted], pending[PIECE:]])


def _proposals(table: BlockTable) -> tuple[np.ndarray, np.ndarray]:
    """Every integer of ``[-K M, K M)`` and the probability (``np.longdouble``) that one
    proposal is that integer and is accepted: block ``j`` with ``weights[j] / 2**64``, an
    offset with ``1 / M``, and acceptance when its 53-bit uniform ``u`` (an integer in
    ``[0, 2**53)``) is below :func:`scaled_acceptance`, i.e. ``min(ceil(a), 2**53) / 2**53``."""
    width = 1 << table.block_bits
    blocks = table.blocks
    support = table.start + np.arange(blocks * width, dtype=np.int64)
    nearest = np.repeat(table.nearest[:blocks], width)
    scaled = scaled_acceptance(
        support, nearest, table.sigma, np.empty(support.size), np.empty_like(support)
    )
    accept = np.minimum(np.ceil(scaled), _TWO_53).astype(np.longdouble) / np.longdouble(_TWO_53)
    block_p = np.array(table.weights[:blocks], dtype=np.longdouble) / np.longdouble(2.0**64)
    return support, np.repeat(block_p, width) * accept / width


def realized_pmf(table: BlockTable) -> tuple[np.ndarray, np.ndarray]:
    """The distribution :func:`fill` samples with ``table``, exactly up to the long double
    arithmetic used to normalise it: every integer of ``[-K M, K M)`` and its probability
    (``np.longdouble``), the accepted proposals' law. For tests and audits: ``2 K M``
    entries."""
    support, joint = _proposals(table)
    return support, joint / joint.sum()


def acceptance_rate(table: BlockTable) -> float:
    """The probability that one proposal of :func:`fill` is accepted, exactly as the tables
    and the acceptance test realise it (the sum of :func:`_proposals`)."""
    return float(_proposals(table)[1].sum())
