"""Keyed cryptographic building blocks: HKDF, AES-CTR mask expansion, AES-GCM share boxes.

Every random-looking value of the protocol comes from here. Masks are AES-128-CTR keystreams
under keys derived with HKDF-SHA256 (RFC 5869) from an X25519 shared secret (pairwise masks,
Bonawitz et al. 2017, §4 "PRG(s_uv)") or from a client's fresh 32-byte seed (self masks,
"PRG(b_u)"); numpy's and torch's generators are never used for anything secret.

Domain separation: every HKDF call uses the round's 32-byte session id as salt and an info
string ``securefed/secagg/v1/<purpose>`` followed by the big-endian round index and the client
ids it concerns, so no two keys of a run (purpose, round, pair) can coincide.
"""

from __future__ import annotations

import hashlib
import struct

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from protocols.errors import IntegrityError

_INFO_PREFIX = b"securefed/secagg/v1/"
_ZERO_NONCE_CTR = bytes(16)
_ZERO_NONCE_GCM = bytes(12)

MASK_KEY_BYTES = 16
SHARE_KEY_BYTES = 16
GCM_TAG_BYTES = 16


def session_id(public_seed: bytes, round_index: int) -> bytes:
    """The 32-byte public identifier of one round (HKDF salt and message header binding)."""
    h = hashlib.sha256()
    h.update(_INFO_PREFIX + b"session")
    h.update(len(public_seed).to_bytes(4, "big"))
    h.update(public_seed)
    h.update(int(round_index).to_bytes(8, "big"))
    return h.digest()


def hkdf_sha256(ikm: bytes, *, salt: bytes, info: bytes, length: int) -> bytes:
    """HKDF-SHA256 (RFC 5869) extract-and-expand via ``cryptography``."""
    return HKDF(algorithm=hashes.SHA256(), length=length, salt=salt, info=info).derive(ikm)


def info(purpose: bytes, round_index: int, *ids: int) -> bytes:
    """The HKDF info string of ``purpose`` for ``round_index`` and client ``ids``."""
    return _INFO_PREFIX + purpose + struct.pack(f">Q{len(ids)}I", round_index, *ids)


def pair_mask_key(shared: bytes, *, session: bytes, round_index: int, a: int, b: int) -> bytes:
    """AES-128 key of the pairwise mask between clients ``a`` and ``b`` (order-free)."""
    lo, hi = (a, b) if a < b else (b, a)
    return hkdf_sha256(
        shared, salt=session, info=info(b"pair-mask", round_index, lo, hi), length=MASK_KEY_BYTES
    )


def self_mask_key(seed: bytes, *, session: bytes, round_index: int, client: int) -> bytes:
    """AES-128 key of client ``client``'s self mask from its secret seed ``b_u``."""
    return hkdf_sha256(
        seed, salt=session, info=info(b"self-mask", round_index, client), length=MASK_KEY_BYTES
    )


def share_box_keys(
    shared: bytes, *, session: bytes, round_index: int, a: int, b: int
) -> tuple[bytes, bytes]:
    """AES-GCM keys ``(key a->b, key b->a)`` for the encrypted shares between ``a`` and ``b``.

    One HKDF output is split in two, one key per direction, so each key encrypts exactly one
    message and a fixed nonce is safe.
    """
    lo, hi = (a, b) if a < b else (b, a)
    okm = hkdf_sha256(
        shared,
        salt=session,
        info=info(b"share-box", round_index, lo, hi),
        length=2 * SHARE_KEY_BYTES,
    )
    up, down = okm[:SHARE_KEY_BYTES], okm[SHARE_KEY_BYTES:]
    return (up, down) if a < b else (down, up)


def seal(key: bytes, plaintext: bytes, associated_data: bytes) -> bytes:
    """AES-GCM encrypt under a single-use key (fixed zero nonce; see :func:`share_box_keys`)."""
    return AESGCM(key).encrypt(_ZERO_NONCE_GCM, plaintext, associated_data)


def open_sealed(key: bytes, ciphertext: bytes, associated_data: bytes) -> bytes:
    """AES-GCM decrypt; any failure raises :class:`IntegrityError` (fixed message)."""
    try:
        return AESGCM(key).decrypt(_ZERO_NONCE_GCM, ciphertext, associated_data)
    except InvalidTag:
        raise IntegrityError() from None


def keystream(key: bytes, n_words: int) -> np.ndarray:
    """``n_words`` uint64 words of AES-128-CTR keystream (counter block starts at zero)."""
    expander = MaskExpander(n_words)
    return expander.expand(key).copy()


class MaskExpander:
    """Expands AES-CTR keystreams into a reusable uint64 buffer and accumulates them.

    The keystream is written with ``encryptor.update_into`` over a preallocated zero buffer, so
    expanding a mask costs one AES-CTR pass and one vector add; no per-mask allocation. One
    expander can be shared by all clients simulated in one process (not across threads).

    Args:
        dim: Number of uint64 words per mask.
    """

    def __init__(self, dim: int) -> None:
        if dim < 1:
            raise ValueError(f"dim must be >= 1, got {dim!r}")
        self.dim = dim
        self._zeros = bytes(8 * dim)
        self._buf = bytearray(8 * dim + 16)  # update_into needs block_size - 1 spare bytes
        self._words = np.frombuffer(self._buf, dtype=np.uint64, count=dim)

    def expand(self, key: bytes) -> np.ndarray:
        """The keystream of ``key`` as a uint64 view, valid until the next call."""
        enc = Cipher(algorithms.AES(key), modes.CTR(_ZERO_NONCE_CTR)).encryptor()
        enc.update_into(self._zeros, self._buf)
        return self._words

    def add(self, key: bytes, acc: np.ndarray) -> None:
        """``acc += PRG(key)`` modulo 2**64, in place."""
        np.add(acc, self.expand(key), out=acc)

    def sub(self, key: bytes, acc: np.ndarray) -> None:
        """``acc -= PRG(key)`` modulo 2**64, in place."""
        np.subtract(acc, self.expand(key), out=acc)
