"""One simulated SecAgg+ round with each pair's work done once: the engine of ``secure_sum``.

In a deployment the two clients ``u < v`` of a pair each compute the X25519 agreements of the
pair, derive the same share-box keys and mask key, and expand the same AES-CTR mask, which
``u`` adds and ``v`` subtracts. In one process these are the same values computed twice, so
this engine computes each pair's two agreements, its keys and its mask once and applies the
mask with ``+`` to ``u``'s masked input and ``-`` to ``v``'s; that halves the two dominant
costs of a simulated round (X25519 and AES-CTR). Likewise the self mask ``PRG(b_u)`` is
expanded once: the client adds it, and the server, after reconstructing ``b_u`` from the
revealed shares and checking it is the seed the client used, subtracts the same keystream.

Everything else is the protocol's own work: fresh X25519 key pairs and self-mask seeds for
every client, ``t``-of-``k`` Shamir shares of both secrets at every neighbour, one AES-GCM box
per direction of every pair sealed and opened, every masked input formed in full (and
observable through ``observe``), and on the server's side the reconstruction of every seed and
dropped key from all revealed shares with Reed-Solomon verification, the dropped clients'
public-key check, and a fresh key agreement and re-expansion for every mask of a dropped client.
Which clients abort, drop, survive and are reconstructed follows the per-client stage machines
(:class:`SecAggClient`, :class:`SecAggServer`) rule for rule; tests/test_secagg_engines.py
drives those objects with the same keys and checks equal masked inputs, sums, client sets and
traffic. The wire messages are not built (their sizes are counted exactly): the per-client
objects are the wire-format path, used by the Flower apps.

Masks are applied in column chunks over a locality order of the clients (consecutive
positions of the relabelled Harary cycle, found greedily from the public graph), so only about
``k`` partial masked inputs are alive at a time and they stay in cache; every pair keeps one
AES-CTR stream open across chunks, so each keystream is produced exactly once.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from protocols.cores import usable_cores
from protocols.errors import ConfigError, IntegrityError
from protocols.secagg import shamir, wire
from protocols.secagg.agreement import exchange_many
from protocols.secagg.config import SecAggConfig, neighbour_table
from protocols.secagg.errors import RoundAborted, ShareVerificationFailed
from protocols.secagg.primitives import (
    MaskExpander,
    open_sealed,
    pair_mask_key,
    seal,
    self_mask_key,
    session_id,
    share_box_keys,
)

STAGES = ("advertise", "share", "masked_input", "unmask")
CHUNK_BYTES = 1 << 19  # 512 KiB of each live masked input per pass: ~k of them fit in L3
MAX_WORKERS = 4  # mask-expansion threads by default: at most this many, at most the cores
#: Streamed inputs (:class:`RingBlocks`): bytes of one ``[n, w]`` block a thread asks for at a
#: time; the column chunk narrows so that ``n * w`` words fit (3,000 clients: 87 KiB per row).
STREAM_BLOCK_BYTES = 1 << 28


@runtime_checkable
class RingBlocks(Protocol):
    """Ring inputs produced a block of coordinates at a time, for a ``[n, dim]`` too large to hold.

    ``shape`` is ``(n_clients, dim)``. ``block(lo, hi)`` returns the uint64 ``[n_clients,
    hi - lo]`` inputs of coordinates ``lo .. hi - 1``, every value ``< 2**modulus_bits``; it may
    be called from several threads at once (on disjoint coordinates). ``lo`` is always a
    multiple of ``align`` and ``hi`` one too or ``dim``, so a source that draws randomness per
    tile of ``align`` coordinates gives the same inputs whatever the engine's threads and chunk
    sizes. Every block is checked as it arrives; the batched engine asks for each coordinate
    once, and is done with a block before it asks the same thread for the next, so a source
    may hand each thread one reused buffer (securefed's ``EncodedBlocks`` does: fresh blocks of
    hundreds of MB allocated in threads are page-faulted in every time).
    """

    @property
    def shape(self) -> tuple[int, int]:
        """``(n_clients, dim)``."""
        ...

    @property
    def align(self) -> int:
        """Block boundaries fall on multiples of this (1: anywhere)."""
        ...

    def block(self, lo: int, hi: int) -> np.ndarray:
        """The inputs of coordinates ``lo .. hi - 1`` of every client."""
        ...


def _checked_block(source: RingBlocks, lo: int, hi: int, n: int, bits: int) -> np.ndarray:
    xs = source.block(lo, hi)
    if not isinstance(xs, np.ndarray) or xs.dtype != np.uint64 or xs.shape != (n, hi - lo):
        got = f"{xs.dtype} {xs.shape}" if isinstance(xs, np.ndarray) else type(xs).__name__
        raise ConfigError(
            f"RingBlocks.block({lo}, {hi}) must return uint64 of shape [{n}, {hi - lo}], got {got}"
        )
    if bits < 64 and xs.size and int(xs.max()) >> bits:
        raise ConfigError(
            f"RingBlocks.block({lo}, {hi}) returned values not reduced modulo 2**{bits}"
        )
    return xs


def default_workers() -> int:
    """Threads for mask expansion: the cores this process may run on, at most ``MAX_WORKERS``."""
    return min(MAX_WORKERS, usable_cores())


Observer = Callable[[int, int, np.ndarray], None]


@dataclass(frozen=True)
class ClientSecrets:
    """The secrets one client draws in round 0 (for replaying a round with known keys).

    Attributes:
        c_sk: X25519 key of the share boxes.
        s_sk: X25519 key of the pairwise masks (Shamir-shared).
        seed: 32-byte self-mask seed ``b_u`` (Shamir-shared).
    """

    c_sk: X25519PrivateKey
    s_sk: X25519PrivateKey
    seed: bytes

    @classmethod
    def generate(cls) -> ClientSecrets:
        """Fresh secrets from the OS CSPRNG, as :meth:`SecAggClient.advertise` draws them."""
        return cls(
            X25519PrivateKey.generate(),
            X25519PrivateKey.generate(),
            os.urandom(shamir.SECRET_BYTES),
        )


@dataclass(frozen=True, kw_only=True)
class BatchedOutcome:
    """What :func:`batched_round` returns (``secure_sum`` wraps it in a SecureSumResult)."""

    sum: np.ndarray
    survivors: np.ndarray
    dropped: np.ndarray
    excluded: np.ndarray
    bytes_per_stage: dict[str, int]
    seconds_per_stage: dict[str, float]


def _require(count: int, what: str, t: int) -> None:
    if count < t:
        raise RoundAborted(
            f"only {count} clients {what}, fewer than the threshold t={t}; "
            "the round is aborted and reveals nothing"
        )


def locality_order(table: np.ndarray, members: np.ndarray) -> list[int]:
    """An order of the ``members`` in which neighbours come close together.

    A greedy walk: the next client is the unvisited neighbour of the current one with the most
    visited neighbours (on the relabelled Harary graph, the next position on the cycle); a walk
    that runs out of unvisited neighbours restarts at the smallest unvisited member. Any order
    gives the same masked inputs; this one keeps the set of partially masked inputs small.
    """
    ids = np.flatnonzero(members).tolist()
    nbrs = {u: [v for v in table[u].tolist() if members[v]] for u in ids}
    seen = [False] * len(members)
    hits = [0] * len(members)
    order: list[int] = []
    for start in ids:
        cur: int | None = None if seen[start] else start
        while cur is not None:
            seen[cur] = True
            order.append(cur)
            best, best_hits = None, -1
            for v in nbrs[cur]:
                if not seen[v]:
                    hits[v] += 1  # one more visited neighbour
                    if hits[v] > best_hits:
                        best, best_hits = v, hits[v]
            cur = best
    return order


def batched_round(
    x: np.ndarray | RingBlocks,
    *,
    config: SecAggConfig,
    bits: int,
    round_index: int,
    public_seed: bytes,
    silent: Mapping[str, frozenset[int]],
    secrets: Mapping[int, ClientSecrets] | None = None,
    observe: Observer | None = None,
    chunk_bytes: int = CHUNK_BYTES,
    workers: int = 1,
) -> BatchedOutcome:
    """Run one round of SecAgg+ for all clients at once, each pair's work done once.

    Args:
        x: uint64 ``[n_clients, dim]`` ring inputs (validated by ``secure_sum``), or a
            :class:`RingBlocks` that produces them a block of coordinates at a time (each block
            validated here as it arrives).
        config: The round's public parameters.
        bits: Ring size (``config.modulus_bits``).
        round_index: Round number.
        public_seed: The round's public seed.
        silent: For each stage name, the clients that go silent from that stage on.
        secrets: Each client's round-0 secrets (``None``: fresh from the OS, as in a round).
        observe: Called as ``observe(client, start, values)`` with every chunk of every masked
            input the server receives (values reduced modulo ``2**bits``; the array is reused).
        chunk_bytes: Bytes of each live masked input per pass (tests use small chunks).
        workers: Threads expanding masks, each over its own range of coordinates.

    Returns:
        The sum of the survivors' inputs and the transcript statistics.

    Raises:
        RoundAborted: fewer than ``t`` clients at some stage or fewer than ``t`` revealed
            shares of some secret; nothing is revealed.
        ShareVerificationFailed: a revealed share or reconstructed key fails verification.
    """
    if not (isinstance(workers, int) and workers >= 1):
        raise ConfigError(f"workers must be an int >= 1, got {workers!r}")
    if config.malicious:
        raise ConfigError(
            "the batched engine is semi-honest only; run mode='malicious' on the stage "
            "machines (secure_sum(..., engine='objects'))"
        )
    n, dim = x.shape
    t = config.t
    session = session_id(public_seed, round_index)
    env = wire.Envelope(session=session, round_index=round_index)
    table = neighbour_table(session, n, config.k)
    word = wire.ring_dtype(bits)
    timing = dict.fromkeys(STAGES, 0.0)
    traffic = dict.fromkeys(STAGES, 0)
    header = wire.HEADER_BYTES

    def flags(name: str) -> np.ndarray:
        out = np.zeros(n, dtype=bool)
        out[sorted(silent.get(name, ()))] = True
        return out

    # -- round 0: advertise -------------------------------------------------------------------
    t0 = time.perf_counter()
    u1 = ~flags("advertise")
    u1_ids = np.flatnonzero(u1).tolist()
    traffic["advertise"] = len(u1_ids) * (header + 2 * wire.KEY_BYTES)
    _require(len(u1_ids), "advertised keys", t)
    if secrets is None:
        keys = {u: ClientSecrets.generate() for u in u1_ids}
    else:
        keys = {u: secrets[u] for u in u1_ids}
    c_pub: dict[int, X25519PublicKey] = {u: keys[u].c_sk.public_key() for u in u1_ids}
    s_pub: dict[int, X25519PublicKey] = {u: keys[u].s_sk.public_key() for u in u1_ids}
    s_pub_raw = {u: pk.public_bytes_raw() for u, pk in s_pub.items()}
    timing["advertise"] = time.perf_counter() - t0

    # -- round 1: Shamir shares in AES-GCM boxes ------------------------------------------------
    t0 = time.perf_counter()
    in1 = u1[table]  # [n, k]: which neighbours advertised
    deg1 = in1.sum(axis=1)
    u2 = u1 & ~flags("share") & (deg1 >= t)  # fewer than t neighbours: the client aborts
    traffic["share"] = int(
        (header + 4 + (4 + 2 * wire.KEY_BYTES) * deg1[u1]).sum()
        + (header + 4 + (4 + wire.CIPHERTEXT_BYTES) * deg1[u2]).sum()
    )
    u2_ids = np.flatnonzero(u2).tolist()
    _require(len(u2_ids), "shared keys", t)
    shares: dict[int, dict[int, tuple[int, int]]] = {}
    for u in u2_ids:
        peers = table[u][in1[u]].tolist()
        xs = [v + 1 for v in peers]
        b_sh = shamir.split(keys[u].seed, xs, t)
        sk_sh = shamir.split(keys[u].s_sk.private_bytes_raw(), xs, t)
        shares[u] = dict(zip(peers, zip(b_sh, sk_sh, strict=True), strict=True))
    in2 = u2[table]
    held: dict[int, dict[int, tuple[bytes, bytes]]] = {u: {} for u in u2_ids}
    edges = _edges(table, in2, u2)  # pairs of neighbours that both shared
    box_secrets = exchange_many([keys[lo].c_sk for lo, _ in edges], [c_pub[hi] for _, hi in edges])
    for (lo, hi), shared in zip(edges, box_secrets, strict=True):
        k_up, k_down = share_box_keys(shared, session=session, round_index=round_index, a=lo, b=hi)
        for src, dst, key in ((lo, hi, k_up), (hi, lo, k_down)):
            b_share, sk_share = shares[src][dst]
            ad = wire.share_associated_data(env, src, dst)
            box = seal(key, wire.pack_share_plaintext(src, dst, b_share, sk_share), ad)
            held[dst][src] = wire.unpack_share_plaintext(
                open_sealed(key, box, ad), sender=src, receiver=dst
            )
    del shares
    timing["share"] = time.perf_counter() - t0

    # -- round 2: masked inputs ---------------------------------------------------------------
    t0 = time.perf_counter()
    deg2 = in2.sum(axis=1)
    u3 = u2 & ~flags("masked_input") & (deg2 >= t)  # fewer than t held shares: abort
    traffic["masked_input"] = int(
        (header + 4 + (4 + wire.CIPHERTEXT_BYTES) * deg2[u2]).sum()
        + int(u3.sum()) * wire.masked_input_bytes(dim, bits)
    )
    u3_ids = np.flatnonzero(u3).tolist()
    _require(len(u3_ids), "sent masked inputs", t)
    total = np.zeros(dim, dtype=word)
    self_total = np.zeros(dim, dtype=word)
    _mask_inputs(
        x,
        table=table,
        u2=u2,
        u3=u3,
        keys=keys,
        s_pub=s_pub,
        session=session,
        round_index=round_index,
        bits=bits,
        total=total,
        self_total=self_total,
        observe=observe,
        chunk_bytes=chunk_bytes,
        workers=workers,
    )
    timing["masked_input"] = time.perf_counter() - t0

    # -- round 4: unmasking -------------------------------------------------------------------
    t0 = time.perf_counter()
    responders = u3 & ~flags("unmask")
    traffic["unmask"] = int(
        (header + 12 + 4 * deg2[u3]).sum()
        + (header + 4 + (5 + shamir.SHARE_BYTES) * deg2[responders]).sum()
    )
    dropped_ids = np.flatnonzero(u2 & ~u3).tolist()

    def reconstruct(owner: int, part: int) -> bytes:
        revealers = [v for v in table[owner].tolist() if responders[v]]
        if len(revealers) < t:
            raise RoundAborted(
                f"client {owner} has {len(revealers)} revealed shares, fewer than t={t}; "
                "the round is aborted and reveals nothing"
            )
        ys = [shamir.share_from_bytes(held[v][owner][part]) for v in revealers]
        try:
            return shamir.reconstruct([v + 1 for v in revealers], ys, threshold=t)
        except IntegrityError:
            raise ShareVerificationFailed() from None

    for u in u3_ids:
        if reconstruct(u, 0) != keys[u].seed:  # the server would remove a different mask
            raise ShareVerificationFailed()
    dropped_keys = {}
    for u in dropped_ids:
        sk = X25519PrivateKey.from_private_bytes(reconstruct(u, 1))
        if sk.public_key().public_bytes_raw() != s_pub_raw[u]:
            raise ShareVerificationFailed()
        dropped_keys[u] = sk
    np.subtract(total, self_total, out=total)
    ex = MaskExpander(dim, word)
    for u, sk in dropped_keys.items():
        for v in table[u].tolist():
            if not u3[v]:
                continue
            shared = sk.exchange(s_pub[v])
            key = pair_mask_key(shared, session=session, round_index=round_index, a=u, b=v)
            if v < u:  # v added +PRG(s_vu); take it out
                ex.sub(key, total)
            else:  # v subtracted it
                ex.add(key, total)
    out = total.astype(np.uint64)
    if bits < 64:
        out &= np.uint64((1 << bits) - 1)
    timing["unmask"] = time.perf_counter() - t0
    return BatchedOutcome(
        sum=out,
        survivors=np.array(u3_ids, dtype=np.int64),
        dropped=np.array(dropped_ids, dtype=np.int64),
        excluded=np.flatnonzero(~u2).astype(np.int64),
        bytes_per_stage=traffic,
        seconds_per_stage=timing,
    )


def _edges(table: np.ndarray, both: np.ndarray, members: np.ndarray) -> list[tuple[int, int]]:
    """Pairs ``(lo, hi)``, ``lo < hi``, of neighbours that are both ``members``."""
    rows = np.broadcast_to(np.arange(table.shape[0])[:, None], table.shape)
    keep = both & members[:, None] & (rows < table)
    return list(zip(rows[keep].tolist(), table[keep].tolist(), strict=True))


def _mask_inputs(
    x: np.ndarray | RingBlocks,
    *,
    table: np.ndarray,
    u2: np.ndarray,
    u3: np.ndarray,
    keys: Mapping[int, ClientSecrets],
    s_pub: Mapping[int, X25519PublicKey],
    session: bytes,
    round_index: int,
    bits: int,
    total: np.ndarray,
    self_total: np.ndarray,
    observe: Observer | None,
    chunk_bytes: int,
    workers: int,
) -> None:
    """Form every survivor's masked input; add it to ``total``, its self mask to ``self_total``.

    ``y_u = x_u + PRG(b_u) + sum_{v > u} PRG(s_uv) - sum_{v < u} PRG(s_uv)`` over the
    neighbours ``v`` that shared keys (``U2``), as :meth:`SecAggClient.masked_input`, in the
    ring's word size. Each pair's agreement and key are computed once (in one batch,
    :func:`~protocols.secagg.agreement.exchange_many`, in the order its first survivor comes
    up in the locality order), and each keystream word once. With ``workers >
    1`` the coordinates are split into that many contiguous ranges, each expanded by its own
    thread from the range's first AES block on (AES-CTR and numpy release the GIL). Streamed
    inputs are asked for one ``[n, chunk]`` block per pass, the chunk narrowed to
    :data:`STREAM_BLOCK_BYTES`.
    """
    n, dim = x.shape
    streamed = not isinstance(x, np.ndarray)
    word = total.dtype
    order = locality_order(table, u3)
    pos = np.full(len(u3), -1, dtype=np.int64)
    pos[order] = np.arange(len(order))
    # For each survivor in order, the pairs it expands: (peer, + for this client, peer is a
    # survivor whose masked input gets the opposite sign).
    schedule: list[tuple[int, list[tuple[int, bool, bool]]]] = []
    pairs: list[tuple[int, int]] = []
    for u in order:
        todo = []
        for v in table[u].tolist():
            if not u2[v] or (u3[v] and pos[v] < pos[u]):
                continue
            pairs.append((u, v) if u < v else (v, u))
            todo.append((v, u < v, bool(u3[v])))
        schedule.append((u, todo))
    mask_secrets = exchange_many([keys[lo].s_sk for lo, _ in pairs], [s_pub[hi] for _, hi in pairs])
    pair_keys = [
        pair_mask_key(shared, session=session, round_index=round_index, a=lo, b=hi)
        for (lo, hi), shared in zip(pairs, mask_secrets, strict=True)
    ]
    self_keys = [
        self_mask_key(keys[u].seed, session=session, round_index=round_index, client=u)
        for u in order
    ]
    itemsize = word.itemsize
    per_block = 16 // itemsize  # words per AES block: ranges start on a block boundary
    if not isinstance(x, np.ndarray):  # streamed: ranges also start on the source's tiles
        align = x.align
        if not (isinstance(align, int) and align >= 1):
            raise ConfigError(f"RingBlocks.align must be an int >= 1, got {align!r}")
        per_block = math.lcm(per_block, align)
    blocks = -(-dim // per_block)
    cuts = [min(dim, blocks * i // workers * per_block) for i in range(workers + 1)]
    ranges = [(a, b) for a, b in zip(cuts, cuts[1:], strict=False) if b > a]
    lock = threading.Lock()

    def expand_range(lo: int, hi: int) -> None:
        iv = (lo * itemsize // 16).to_bytes(16, "big")  # CTR counter block of word ``lo``
        streams = [Cipher(algorithms.AES(k), modes.CTR(iv)).encryptor() for k in pair_keys]
        own = [Cipher(algorithms.AES(k), modes.CTR(iv)).encryptor() for k in self_keys]
        width = chunk_bytes // itemsize
        if streamed:
            width = min(width, STREAM_BLOCK_BYTES // (8 * n))
        chunk = min(hi - lo, max(per_block, width // per_block * per_block))
        zeros = bytes(chunk * itemsize)
        buf = bytearray(chunk * itemsize + 16)  # update_into needs block_size - 1 spare bytes
        pool: list[np.ndarray] = []
        ring = word.type((1 << bits) - 1 if bits < 64 else 2**64 - 1)
        reduced = np.empty(chunk, dtype=word)
        for c0 in range(lo, hi, chunk):
            w = min(chunk, hi - c0)
            src = memoryview(zeros)[: w * itemsize]
            mask = np.frombuffer(buf, dtype=word, count=w)
            live: dict[int, np.ndarray] = {}
            xs = (
                x[:, c0 : c0 + w]
                if isinstance(x, np.ndarray)
                else _checked_block(x, c0, c0 + w, n, bits)
            )
            tot = total[c0 : c0 + w]
            selves = self_total[c0 : c0 + w]

            def row(u: int, live: dict[int, np.ndarray] = live, xs: np.ndarray = xs) -> np.ndarray:
                r = live.get(u)
                if r is None:
                    r = (pool.pop() if pool else np.empty(chunk, dtype=word))[: xs.shape[1]]
                    np.copyto(r, xs[u], casting="unsafe")  # x_u mod 2**(8 * itemsize)
                    live[u] = r
                return r

            s = 0
            for (u, todo), self_stream in zip(schedule, own, strict=True):
                ru = row(u)
                for v, plus, v_live in todo:
                    streams[s].update_into(src, buf)
                    s += 1
                    if plus:
                        np.add(ru, mask, out=ru)
                        if v_live:
                            rv = row(v)
                            np.subtract(rv, mask, out=rv)
                    else:
                        np.subtract(ru, mask, out=ru)
                        if v_live:
                            rv = row(v)
                            np.add(rv, mask, out=rv)
                self_stream.update_into(src, buf)
                np.add(ru, mask, out=ru)
                np.add(selves, mask, out=selves)
                np.add(tot, ru, out=tot)  # the server's streaming sum
                if observe is not None:
                    np.bitwise_and(ru, ring, out=reduced[:w])
                    with lock:
                        observe(u, c0, reduced[:w])
                del live[u]
                pool.append(ru.base if ru.base is not None else ru)

    if len(ranges) == 1:
        expand_range(*ranges[0])
        return
    with ThreadPoolExecutor(max_workers=len(ranges)) as threads:
        for done in [threads.submit(expand_range, a, b) for a, b in ranges]:
            done.result()
