"""Wire format: every protocol message is bytes with a versioned, length-checked header.

Layout (big-endian)::

    magic "SAGG" | version u8 | kind u8 | reserved u16 = 0 | session 16 B | round u64
    | sender u32 | receiver u32 | body length u32 | body

``session`` is the first 16 bytes of the round's session id (public seed and round index),
``SERVER`` (0xFFFFFFFF) is the server's id. Decoding checks every field against what the
receiver expects (kind, session, round, sender, receiver, exact lengths, sorted distinct ids,
value ranges) and raises :class:`IntegrityError` with one fixed message for any mismatch, so a
tampered, truncated, replayed (other round or session) or mis-addressed message is rejected
without telling the sender which check failed. Messages carry public keys, AES-GCM
ciphertexts of shares, masked vectors and revealed shares only; never a private key or seed.

Bodies (``n`` = entry count u32 first):

* ADVERTISE      ``c_pk 32 | s_pk 32``
* KEYS           ``n | (id u32, c_pk 32, s_pk 32) * n``           ids ascending
* SHARES         ``n | (receiver u32, ciphertext 90) * n``        ids ascending
* FORWARD        ``n | (sender u32, ciphertext 90) * n``          ids ascending
* MASKED_INPUT   ``bits u8 | dim u32 | ceil(dim * w / 8) bytes``    ``w`` = :func:`wire_bits`
* UNMASK_REQUEST ``n_survivors_total u32 | n | ids | m | ids``    survivors / dropped neighbours
* UNMASK_SHARES  ``n | (owner u32, kind u8, share 33) * n``       (owner, kind) ascending

Malicious mode (``SecAggConfig(mode="malicious")``; Bonawitz et al. 2017 §4 rounds 0, 1, 3, 4
with signatures) replaces ADVERTISE, KEYS and UNMASK_REQUEST by signed kinds and adds the
consistency round:

* SIGNED_ADVERTISE      ``c_pk 32 | s_pk 32 | signature 64``       over :func:`advertise_statement`
* SIGNED_KEYS           ``n | (id u32, c_pk 32, s_pk 32, signature 64) * n``   ids ascending
* SURVIVORS             ``n | ids``                                 the survivor set ``U3``
* SURVIVORS_SIGNATURE   ``signature 64``                           over :func:`survivors_statement`
* SIGNED_UNMASK_REQUEST ``n | (id u32, signature 64) * n``         neighbours' survivor signatures

A kind is fixed per mode: a semi-honest message handed to a malicious-mode party (a signature
left out) fails decoding like any other tampered message.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

import numpy as np

from protocols.errors import IntegrityError
from protocols.secagg.identity import SIGNATURE_BYTES
from protocols.secagg.primitives import GCM_TAG_BYTES
from protocols.secagg.shamir import SHARE_BYTES

MAGIC = b"SAGG"
VERSION = 3  # 2: masked inputs packed to the ring's bits; 3: eager boxes with a fallback seed
SERVER = 0xFFFFFFFF
KEY_BYTES = 32
SESSION_BYTES = 16
SHARE_PLAINTEXT_BYTES = 8 + 2 * SHARE_BYTES
CIPHERTEXT_BYTES = SHARE_PLAINTEXT_BYTES + GCM_TAG_BYTES
#: An eager-masking box also holds a share of the fallback self-mask seed ``b'``.
EAGER_SHARE_PLAINTEXT_BYTES = 8 + 3 * SHARE_BYTES
EAGER_CIPHERTEXT_BYTES = EAGER_SHARE_PLAINTEXT_BYTES + GCM_TAG_BYTES

_HEADER = struct.Struct(">4sBBH16sQIII")
HEADER_BYTES = _HEADER.size
_U32 = struct.Struct(">I")
_KEY_ENTRY = struct.Struct(f">I{KEY_BYTES}s{KEY_BYTES}s")
_BOX_ENTRY = struct.Struct(f">I{CIPHERTEXT_BYTES}s")
_EAGER_BOX_ENTRY = struct.Struct(f">I{EAGER_CIPHERTEXT_BYTES}s")
_SHARE_ENTRY = struct.Struct(f">IB{SHARE_BYTES}s")
_SIGNED_KEY_ENTRY = struct.Struct(f">I{KEY_BYTES}s{KEY_BYTES}s{SIGNATURE_BYTES}s")
_SIGNATURE_ENTRY = struct.Struct(f">I{SIGNATURE_BYTES}s")
_STATEMENT_PREFIX = b"securefed/secagg/v1/signed/"


class Kind(IntEnum):
    """Message kinds, in protocol order."""

    ADVERTISE = 1
    KEYS = 2
    SHARES = 3
    FORWARD = 4
    MASKED_INPUT = 5
    UNMASK_REQUEST = 6
    UNMASK_SHARES = 7
    SIGNED_ADVERTISE = 8
    SIGNED_KEYS = 9
    SURVIVORS = 10
    SURVIVORS_SIGNATURE = 11
    SIGNED_UNMASK_REQUEST = 12


class ShareKind(IntEnum):
    """Which secret a revealed share belongs to (Bonawitz et al. §4, round 4)."""

    SELF_MASK_SEED = 0  # b_u of a survivor
    MASK_KEY = 1  # s_u^SK of a dropped client
    FALLBACK_SEED = 2  # b'_u of a survivor of an eager round that fell back (docs/secagg.md)


_MAX_SHARE_KIND = max(ShareKind)


@dataclass(frozen=True, kw_only=True)
class Envelope:
    """Who may send what to whom in a round; used to build and check headers."""

    session: bytes
    round_index: int

    def header(self, kind: Kind, sender: int, receiver: int, body_len: int) -> bytes:
        return _HEADER.pack(
            MAGIC,
            VERSION,
            kind,
            0,
            self.session[:SESSION_BYTES],
            self.round_index,
            sender,
            receiver,
            body_len,
        )

    def pack(self, kind: Kind, sender: int, receiver: int, body: bytes) -> bytes:
        return self.header(kind, sender, receiver, len(body)) + body

    def open(self, message: bytes, kind: Kind, *, sender: int, receiver: int) -> memoryview:
        """Check the header of ``message`` and return its body."""
        if not isinstance(message, bytes | bytearray | memoryview):
            raise IntegrityError()
        if len(message) < HEADER_BYTES:
            raise IntegrityError()
        magic, version, k, reserved, session, rnd, snd, rcv, body_len = _HEADER.unpack_from(message)
        if (
            magic != MAGIC
            or version != VERSION
            or k != kind
            or reserved != 0
            or session != self.session[:SESSION_BYTES]
            or rnd != self.round_index
            or snd != sender
            or rcv != receiver
            or body_len != len(message) - HEADER_BYTES
        ):
            raise IntegrityError()
        return memoryview(message)[HEADER_BYTES:]


class _Reader:
    """Length-checked cursor over a body; every overrun raises IntegrityError."""

    def __init__(self, body: memoryview) -> None:
        self.body = body
        self.pos = 0

    def take(self, n: int) -> memoryview:
        end = self.pos + n
        if n < 0 or end > len(self.body):
            raise IntegrityError()
        out = self.body[self.pos : end]
        self.pos = end
        return out

    def u32(self) -> int:
        return _U32.unpack(self.take(4))[0]

    def u8(self) -> int:
        return self.take(1)[0]

    def count(self, entry_bytes: int, limit: int) -> int:
        n = self.u32()
        if n > limit or n * entry_bytes > len(self.body) - self.pos:
            raise IntegrityError()
        return n

    def ids(self, limit: int, n_clients: int) -> list[int]:
        n = self.count(4, limit)
        raw = self.take(4 * n)
        ids = list(struct.unpack(f">{n}I", raw))
        _check_ascending(ids, n_clients)
        return ids

    def done(self) -> None:
        if self.pos != len(self.body):
            raise IntegrityError()


def _check_ascending(ids: list[int], n_clients: int) -> None:
    prev = -1
    for i in ids:
        if i <= prev or i >= n_clients:
            raise IntegrityError()
        prev = i


# -- ADVERTISE --------------------------------------------------------------------------------


def encode_advertise(env: Envelope, sender: int, c_pk: bytes, s_pk: bytes) -> bytes:
    return env.pack(Kind.ADVERTISE, sender, SERVER, c_pk + s_pk)


def decode_advertise(env: Envelope, message: bytes, *, sender: int) -> tuple[bytes, bytes]:
    r = _Reader(env.open(message, Kind.ADVERTISE, sender=sender, receiver=SERVER))
    c_pk, s_pk = bytes(r.take(KEY_BYTES)), bytes(r.take(KEY_BYTES))
    r.done()
    return c_pk, s_pk


# -- KEYS (server -> client) ------------------------------------------------------------------


def encode_keys(env: Envelope, receiver: int, keys: list[tuple[int, bytes, bytes]]) -> bytes:
    body = [_U32.pack(len(keys))]
    for cid, c_pk, s_pk in keys:
        body.append(_U32.pack(cid) + c_pk + s_pk)
    return env.pack(Kind.KEYS, SERVER, receiver, b"".join(body))


def decode_keys(
    env: Envelope, message: bytes, *, receiver: int, n_clients: int
) -> list[tuple[int, bytes, bytes]]:
    r = _Reader(env.open(message, Kind.KEYS, sender=SERVER, receiver=receiver))
    return _decode_table(r, _KEY_ENTRY, n_clients)


# -- SHARES (client -> server) and FORWARD (server -> client) ---------------------------------


def _encode_boxes(entries: list[tuple[int, bytes]]) -> bytes:
    """Boxes of one size: the paper's (:data:`CIPHERTEXT_BYTES`) or eager masking's
    (:data:`EAGER_CIPHERTEXT_BYTES`)."""
    body = [_U32.pack(len(entries))]
    sizes = {len(ct) for _, ct in entries}
    if not sizes <= {CIPHERTEXT_BYTES, EAGER_CIPHERTEXT_BYTES} or len(sizes) > 1:
        raise ValueError("ciphertext has the wrong length")
    for cid, ct in entries:
        body.append(_U32.pack(cid) + ct)
    return b"".join(body)


def _decode_table(r: _Reader, entry: struct.Struct, n_clients: int) -> list[Any]:
    """The rest of ``r``: a count, then that many ``entry`` records whose first field is a
    client id, ids strictly ascending and below ``n_clients``."""
    n = r.count(entry.size, n_clients)
    out = list(entry.iter_unpack(r.take(n * entry.size)))
    r.done()
    _check_ascending([e[0] for e in out], n_clients)
    return out


def _decode_boxes(r: _Reader, n_clients: int, eager: bool) -> list[tuple[int, bytes]]:
    return _decode_table(r, _EAGER_BOX_ENTRY if eager else _BOX_ENTRY, n_clients)


def encode_shares(env: Envelope, sender: int, boxes: list[tuple[int, bytes]]) -> bytes:
    return env.pack(Kind.SHARES, sender, SERVER, _encode_boxes(boxes))


def decode_shares(
    env: Envelope, message: bytes, *, sender: int, n_clients: int, eager: bool = False
) -> list[tuple[int, bytes]]:
    """The boxes of a SHARES message; ``eager``: of eager masking's size."""
    body = env.open(message, Kind.SHARES, sender=sender, receiver=SERVER)
    return _decode_boxes(_Reader(body), n_clients, eager)


def encode_forward(env: Envelope, receiver: int, boxes: list[tuple[int, bytes]]) -> bytes:
    return env.pack(Kind.FORWARD, SERVER, receiver, _encode_boxes(boxes))


def decode_forward(
    env: Envelope, message: bytes, *, receiver: int, n_clients: int, eager: bool = False
) -> list[tuple[int, bytes]]:
    """The boxes of a FORWARD message; ``eager``: of eager masking's size."""
    body = env.open(message, Kind.FORWARD, sender=SERVER, receiver=receiver)
    return _decode_boxes(_Reader(body), n_clients, eager)


def share_associated_data(env: Envelope, sender: int, receiver: int) -> bytes:
    """AES-GCM associated data of one encrypted share: binds session, round and both ids."""
    return (
        MAGIC
        + bytes([VERSION])
        + env.session
        + struct.pack(">QII", env.round_index, sender, receiver)
    )


def pack_share_plaintext(
    sender: int, receiver: int, b_share: int, sk_share: int, fallback_share: int | None = None
) -> bytes:
    """One box's plaintext: shares of ``b`` and ``s_sk``, and with eager masking of the
    fallback seed ``b'`` too."""
    out = (
        struct.pack(">II", sender, receiver)
        + b_share.to_bytes(SHARE_BYTES, "big")
        + sk_share.to_bytes(SHARE_BYTES, "big")
    )
    return out if fallback_share is None else out + fallback_share.to_bytes(SHARE_BYTES, "big")


def _unpack_shares(data: bytes, sender: int, receiver: int, count: int) -> tuple[bytes, ...]:
    """The ``count`` shares of a box's plaintext, after checking its length and both ids."""
    if len(data) != 8 + count * SHARE_BYTES or struct.unpack_from(">II", data) != (
        sender,
        receiver,
    ):
        raise IntegrityError()
    return tuple(data[8 + i * SHARE_BYTES : 8 + (i + 1) * SHARE_BYTES] for i in range(count))


def unpack_share_plaintext(data: bytes, *, sender: int, receiver: int) -> tuple[bytes, bytes]:
    """``(b share, s_sk share)`` of a paper-sized box."""
    b, sk = _unpack_shares(data, sender, receiver, 2)
    return b, sk


def unpack_eager_share_plaintext(
    data: bytes, *, sender: int, receiver: int
) -> tuple[bytes, bytes, bytes]:
    """``(b share, s_sk share, b' share)`` of an eager-masking box."""
    b, sk, b2 = _unpack_shares(data, sender, receiver, 3)
    return b, sk, b2


# -- MASKED_INPUT -----------------------------------------------------------------------------


def ring_dtype(bits: int) -> np.dtype:
    """Smallest little-endian unsigned dtype holding ``bits``-bit ring elements."""
    for width, name in ((1, "<u1"), (2, "<u2"), (4, "<u4"), (8, "<u8")):
        if bits <= 8 * width:
            return np.dtype(name)
    raise ValueError(f"bits must be <= 64, got {bits!r}")


#: Values packed or unpacked per pass (a multiple of 8, so every pass starts on a byte): a
#: pass's temporaries (about 20 bytes a value) stay about a MB.
_PACK_CHUNK = 1 << 16
_MASKED_HEAD = struct.Struct(">BI")  # bits, dim


def wire_bits(bits: int) -> int:
    """Bits a ``bits``-bit ring element takes in a masked input: ``bits`` itself, or the
    whole word of :func:`ring_dtype` when packing would save less than an eighth of it
    (29-32 bits travel as 32, 57-64 as 64): packing costs about 10 ns a value on each side,
    worth a third of the bytes at 37 bits and 3 % at 31."""
    word = 8 * ring_dtype(bits).itemsize
    return word if 8 * bits > 7 * word else bits


def _whole_words(bits: int) -> bool:
    """Whether a ``bits``-bit ring's masked input travels in whole :func:`ring_dtype` words."""
    return wire_bits(bits) == 8 * ring_dtype(bits).itemsize


def packed_bytes(dim: int, bits: int) -> int:
    """Bytes of ``dim`` ring elements of a ``bits``-bit ring in a masked input
    (:func:`wire_bits` each, back to back)."""
    return -(-dim * wire_bits(bits) // 8)


def masked_input_bytes(dim: int, bits: int) -> int:
    """Size of a MASKED_INPUT message (header included) of ``dim`` ``bits``-bit elements."""
    return HEADER_BYTES + _MASKED_HEAD.size + packed_bytes(dim, bits)


def _low(bits: int) -> np.uint64:
    return np.uint64((1 << bits) - 1 if bits < 64 else 2**64 - 1)


def pack_ring(words: np.ndarray, bits: int, out: np.ndarray) -> None:
    """Pack ``words`` (uint64; reduced modulo ``2**bits``) into the uint8 array ``out`` of
    :func:`packed_bytes` bytes: value ``i`` is bits ``i * w .. (i + 1) * w - 1`` of ``out``'s
    little-endian bit string (``w`` = :func:`wire_bits`), the last byte's unused high bits
    zero.

    Eight values fill exactly ``bits`` bytes, so the values are taken in groups of eight and
    value ``j`` of every group is shifted into place at once (its byte ``j * bits // 8``, bit
    ``j * bits % 8``): 0.6 ms for 53,824 37-bit values here.
    """
    words = np.asarray(words, dtype="<u8")
    low = _low(bits)
    if _whole_words(bits):  # a cast (the low bytes) is the packing
        np.copyto(out.view(ring_dtype(bits)), words & low, casting="unsafe")
        return
    n = words.shape[0]
    for lo in range(0, n, _PACK_CHUNK):
        piece = words[lo : lo + _PACK_CHUNK]
        groups = -(-piece.shape[0] // 8)
        w = np.zeros((groups, 8), dtype="<u8")
        np.bitwise_and(piece, low, out=w.reshape(-1)[: piece.shape[0]])
        acc = np.zeros((groups, bits + 9), dtype=np.uint8)  # 9 spare bytes: lane spill-over
        for j in range(8):
            byte, shift = divmod(j * bits, 8)
            lane = w[:, j] << np.uint64(shift)
            acc[:, byte : byte + 8] |= lane.view(np.uint8).reshape(groups, 8)
            if shift + bits > 64:  # the value's top bits past the 64-bit lane
                acc[:, byte + 8] |= (w[:, j] >> np.uint64(64 - shift)).astype(np.uint8)
        start = lo * bits // 8
        size = packed_bytes(piece.shape[0], bits)
        out[start : start + size] = acc[:, :bits].reshape(-1)[:size]


def unpack_ring(data: bytes | memoryview, bits: int, dim: int) -> np.ndarray:
    """The ``dim`` values :func:`pack_ring` wrote into ``data`` (exactly :func:`packed_bytes`
    bytes), as the ring dtype: a zero-copy, read-only view when ``bits`` is a whole word.

    Raises:
        IntegrityError: ``data`` has another length, or padding bits set.
    """
    dtype = ring_dtype(bits)
    if len(data) != packed_bytes(dim, bits):
        raise IntegrityError()
    if _whole_words(bits):  # a view
        y = np.frombuffer(data, dtype=dtype)
        if bits < 8 * dtype.itemsize and dim and int(y.max()) >> bits:
            raise IntegrityError()  # a value outside the ring: not what pack_ring writes
        return y
    raw = np.frombuffer(data, dtype=np.uint8)
    if (dim * bits) % 8 and int(raw[-1]) >> ((dim * bits) % 8):
        raise IntegrityError()  # padding bits set: not what pack_ring writes
    low = _low(bits)
    out = np.empty(dim, dtype=dtype)
    for lo in range(0, dim, _PACK_CHUNK):
        n = min(_PACK_CHUNK, dim - lo)
        groups = -(-n // 8)
        start = lo * bits // 8
        body = np.zeros(groups * bits, dtype=np.uint8)
        body[: packed_bytes(n, bits)] = raw[start : start + packed_bytes(n, bits)]
        acc = np.zeros((groups, bits + 9), dtype=np.uint8)  # 9 spare bytes for the lanes
        acc[:, :bits] = body.reshape(groups, bits)
        w = np.empty((groups, 8), dtype="<u8")
        for j in range(8):
            byte, shift = divmod(j * bits, 8)
            lane = np.ascontiguousarray(acc[:, byte : byte + 8]).view("<u8").reshape(groups)
            value = lane >> np.uint64(shift)
            if shift + bits > 64:
                value |= acc[:, byte + 8].astype(np.uint64) << np.uint64(64 - shift)
            w[:, j] = value & low
        out[lo : lo + n] = w.reshape(-1)[:n]  # < 2**bits: fits the ring dtype
    return out


def encode_masked_input(env: Envelope, sender: int, y: np.ndarray, bits: int) -> bytes:
    """``y`` (uint64) reduced modulo ``2**bits`` and packed (:func:`pack_ring`): a 37-bit ring
    sends 37 bits a value, not 64, so the largest message of the protocol is 42 % smaller than
    in whole words."""
    dim = y.shape[0]
    body_len = _MASKED_HEAD.size + packed_bytes(dim, bits)  # ValueError unless 1 <= bits <= 64
    buf = bytearray(HEADER_BYTES + body_len)
    buf[:HEADER_BYTES] = env.header(Kind.MASKED_INPUT, sender, SERVER, body_len)
    _MASKED_HEAD.pack_into(buf, HEADER_BYTES, bits, dim)
    pack_ring(y, bits, np.frombuffer(buf, dtype=np.uint8, offset=HEADER_BYTES + _MASKED_HEAD.size))
    return bytes(buf)


def decode_masked_input(
    env: Envelope, message: bytes, *, sender: int, bits: int, dim: int
) -> np.ndarray:
    """The masked vector as an array of the ring dtype (:func:`unpack_ring`)."""
    r = _Reader(env.open(message, Kind.MASKED_INPUT, sender=sender, receiver=SERVER))
    ring_dtype(bits)  # a caller's bits no ring has: ValueError, before the message is read
    if r.u8() != bits or r.u32() != dim:
        raise IntegrityError()
    data = r.take(packed_bytes(dim, bits))
    r.done()
    return unpack_ring(data, bits, dim)


# -- UNMASK_REQUEST and UNMASK_SHARES ---------------------------------------------------------


def encode_unmask_request(
    env: Envelope, receiver: int, n_survivors: int, survivors: list[int], dropped: list[int]
) -> bytes:
    body = _U32.pack(n_survivors)
    for ids in (survivors, dropped):
        body += _U32.pack(len(ids)) + struct.pack(f">{len(ids)}I", *ids)
    return env.pack(Kind.UNMASK_REQUEST, SERVER, receiver, body)


def decode_unmask_request(
    env: Envelope, message: bytes, *, receiver: int, n_clients: int
) -> tuple[int, list[int], list[int]]:
    r = _Reader(env.open(message, Kind.UNMASK_REQUEST, sender=SERVER, receiver=receiver))
    total = r.u32()
    if total > n_clients:
        raise IntegrityError()
    survivors = r.ids(n_clients, n_clients)
    dropped = r.ids(n_clients, n_clients)
    r.done()
    return total, survivors, dropped


def encode_unmask_shares(
    env: Envelope, sender: int, shares: list[tuple[int, ShareKind, bytes]]
) -> bytes:
    body = [_U32.pack(len(shares))]
    for owner, kind, share in shares:
        body.append(struct.pack(">IB", owner, kind) + share)
    return env.pack(Kind.UNMASK_SHARES, sender, SERVER, b"".join(body))


def decode_unmask_shares(
    env: Envelope, message: bytes, *, sender: int, n_clients: int
) -> list[tuple[int, ShareKind, bytes]]:
    r = _Reader(env.open(message, Kind.UNMASK_SHARES, sender=sender, receiver=SERVER))
    n = r.count(_SHARE_ENTRY.size, n_clients)
    out = []
    for owner, kind, share in _SHARE_ENTRY.iter_unpack(r.take(n * _SHARE_ENTRY.size)):
        if owner >= n_clients or kind > _MAX_SHARE_KIND:
            raise IntegrityError()
        out.append((owner, ShareKind(kind), share))
    r.done()
    prev = -1
    for owner, _kind, _share in out:  # one share per owner, ascending
        if owner <= prev:
            raise IntegrityError()
        prev = owner
    return out


# -- malicious mode: signed statements --------------------------------------------------------


def advertise_statement(env: Envelope, client: int, c_pk: bytes, s_pk: bytes) -> bytes:
    """What a client signs in round 0: both X25519 public keys bound to session, round and id.

    Bonawitz et al. 2017 §4 (Fig. 4 round 0, active adversary) sign ``c_pk || s_pk``; binding
    the full 32-byte session id, the round and the signer's id as well stops the server from
    replaying an advertisement from another round or presenting it as another client's.
    """
    if len(c_pk) != KEY_BYTES or len(s_pk) != KEY_BYTES:
        raise IntegrityError()
    return (
        _STATEMENT_PREFIX
        + b"advertise"
        + env.session
        + struct.pack(">QI", env.round_index, client)
        + c_pk
        + s_pk
    )


def survivors_statement(env: Envelope, survivors: list[int]) -> bytes:
    """What a client signs in the consistency round: the survivor set ``U3`` of this round.

    Bonawitz et al. 2017 §4 (Fig. 4 round 3) sign ``U3``; the session id and round make a
    signature useless in any other round. The signer is bound by the key that verifies it.
    """
    return (
        _STATEMENT_PREFIX
        + b"survivors"
        + env.session
        + struct.pack(f">QI{len(survivors)}I", env.round_index, len(survivors), *survivors)
    )


# -- SIGNED_ADVERTISE and SIGNED_KEYS -----------------------------------------------------------


def encode_signed_advertise(
    env: Envelope, sender: int, c_pk: bytes, s_pk: bytes, signature: bytes
) -> bytes:
    if len(signature) != SIGNATURE_BYTES:
        raise ValueError("signature has the wrong length")
    return env.pack(Kind.SIGNED_ADVERTISE, sender, SERVER, c_pk + s_pk + signature)


def decode_signed_advertise(
    env: Envelope, message: bytes, *, sender: int
) -> tuple[bytes, bytes, bytes]:
    """``(c_pk, s_pk, signature)``; the signature is checked by the caller against the directory."""
    r = _Reader(env.open(message, Kind.SIGNED_ADVERTISE, sender=sender, receiver=SERVER))
    c_pk, s_pk = bytes(r.take(KEY_BYTES)), bytes(r.take(KEY_BYTES))
    signature = bytes(r.take(SIGNATURE_BYTES))
    r.done()
    return c_pk, s_pk, signature


def encode_signed_keys(
    env: Envelope, receiver: int, keys: list[tuple[int, bytes, bytes, bytes]]
) -> bytes:
    body = [_U32.pack(len(keys))]
    for cid, c_pk, s_pk, signature in keys:
        body.append(_SIGNED_KEY_ENTRY.pack(cid, c_pk, s_pk, signature))
    return env.pack(Kind.SIGNED_KEYS, SERVER, receiver, b"".join(body))


def decode_signed_keys(
    env: Envelope, message: bytes, *, receiver: int, n_clients: int
) -> list[tuple[int, bytes, bytes, bytes]]:
    r = _Reader(env.open(message, Kind.SIGNED_KEYS, sender=SERVER, receiver=receiver))
    return _decode_table(r, _SIGNED_KEY_ENTRY, n_clients)


# -- SURVIVORS, SURVIVORS_SIGNATURE and SIGNED_UNMASK_REQUEST (consistency round) ---------------


def encode_survivors(env: Envelope, receiver: int, survivors: list[int]) -> bytes:
    body = _U32.pack(len(survivors)) + struct.pack(f">{len(survivors)}I", *survivors)
    return env.pack(Kind.SURVIVORS, SERVER, receiver, body)


def decode_survivors(env: Envelope, message: bytes, *, receiver: int, n_clients: int) -> list[int]:
    r = _Reader(env.open(message, Kind.SURVIVORS, sender=SERVER, receiver=receiver))
    ids = r.ids(n_clients, n_clients)
    r.done()
    return ids


def encode_survivors_signature(env: Envelope, sender: int, signature: bytes) -> bytes:
    if len(signature) != SIGNATURE_BYTES:
        raise ValueError("signature has the wrong length")
    return env.pack(Kind.SURVIVORS_SIGNATURE, sender, SERVER, signature)


def decode_survivors_signature(env: Envelope, message: bytes, *, sender: int) -> bytes:
    r = _Reader(env.open(message, Kind.SURVIVORS_SIGNATURE, sender=sender, receiver=SERVER))
    signature = bytes(r.take(SIGNATURE_BYTES))
    r.done()
    return signature


def encode_signed_unmask_request(
    env: Envelope, receiver: int, signatures: list[tuple[int, bytes]]
) -> bytes:
    body = [_U32.pack(len(signatures))]
    for cid, signature in signatures:
        body.append(_SIGNATURE_ENTRY.pack(cid, signature))
    return env.pack(Kind.SIGNED_UNMASK_REQUEST, SERVER, receiver, b"".join(body))


def decode_signed_unmask_request(
    env: Envelope, message: bytes, *, receiver: int, n_clients: int
) -> list[tuple[int, bytes]]:
    r = _Reader(env.open(message, Kind.SIGNED_UNMASK_REQUEST, sender=SERVER, receiver=receiver))
    return _decode_table(r, _SIGNATURE_ENTRY, n_clients)
