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
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from protocols.errors import ConfigError, IntegrityError

_INFO_PREFIX = b"securefed/secagg/v1/"
_ZERO_NONCE_CTR = bytes(16)
_ZERO_NONCE_GCM = bytes(12)

_HASH_BYTES = 32
_BLOCK_BYTES = 64
_IPAD = bytes(b ^ 0x36 for b in range(256))  # byte translation tables: key XOR ipad / opad
_OPAD = bytes(b ^ 0x5C for b in range(256))
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


def _hmac_sha256(key: bytes, message: bytes) -> bytes:
    """HMAC-SHA256 (RFC 2104) over ``hashlib.sha256``."""
    if len(key) > _BLOCK_BYTES:
        key = hashlib.sha256(key).digest()
    key = key.ljust(_BLOCK_BYTES, b"\0")
    inner = hashlib.sha256(key.translate(_IPAD) + message).digest()
    return hashlib.sha256(key.translate(_OPAD) + inner).digest()


def hkdf_sha256(ikm: bytes, *, salt: bytes, info: bytes, length: int) -> bytes:
    """HKDF-SHA256 (RFC 5869) extract-and-expand.

    Written out over ``hashlib.sha256`` (OpenSSL underneath): about twice as fast per call as
    building ``cryptography``'s HKDF object (and than ``hmac.digest``), and a round derives two
    keys per pair of neighbours. Checked against the RFC's test vectors and against
    ``cryptography``'s HKDF in tests/test_secagg_crypto.py and tests/test_secagg_engines.py.
    """
    if not 0 < length <= 255 * _HASH_BYTES:
        raise ConfigError(f"length must be in [1, {255 * _HASH_BYTES}], got {length!r}")
    prk = _hmac_sha256(salt or bytes(_HASH_BYTES), ikm)  # extract
    okm, block = b"", b""
    for counter in range(1, -(-length // _HASH_BYTES) + 1):  # expand: T(1) | T(2) | ...
        block = _hmac_sha256(prk, block + info + bytes([counter]))
        okm += block
    return okm[:length]


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


def keystream(key: bytes, n_words: int, dtype: np.dtype | type = np.uint64) -> np.ndarray:
    """``n_words`` little-endian words of AES-128-CTR keystream (counter block starts at 0)."""
    expander = MaskExpander(n_words, dtype)
    return expander.expand(key).copy()


class MaskExpander:
    """Expands AES-CTR keystreams into a reusable word buffer and accumulates them.

    ``PRG(key)`` is the AES-128-CTR keystream (zero IV) read as little-endian words of
    ``dtype``. Use the narrowest unsigned dtype holding the ring (``wire.ring_dtype(bits)``):
    ``2**bits`` divides ``2**(8 * itemsize)``, so wrapping word arithmetic followed by masking
    the low ``bits`` is exact, and a 32-bit ring needs half the keystream of a 64-bit one.
    The keystream is written with ``encryptor.update_into`` over a preallocated zero buffer,
    so a mask costs one AES-CTR pass and one vector add and no allocation. One expander may
    be shared by all clients simulated in one process (not across threads).

    Args:
        dim: Number of words per mask.
        dtype: Unsigned word type (uint8, uint16, uint32 or uint64).
    """

    def __init__(self, dim: int, dtype: np.dtype | type = np.uint64) -> None:
        if dim < 1:
            raise ConfigError(f"dim must be >= 1, got {dim!r}")
        self.dtype = np.dtype(dtype).newbyteorder("<")
        if self.dtype.kind != "u":
            raise ConfigError(f"dtype must be unsigned, got {self.dtype}")
        self.dim = dim
        nbytes = dim * self.dtype.itemsize
        self._zeros = bytes(nbytes)
        self._buf = bytearray(nbytes + 16)  # update_into needs block_size - 1 spare bytes
        self._words = np.frombuffer(self._buf, dtype=self.dtype, count=dim)
        self.acc = np.zeros(dim, dtype=self.dtype)  # scratch accumulator for one masked vector

    def expand(self, key: bytes) -> np.ndarray:
        """The keystream of ``key`` as a word view, valid until the next call."""
        enc = Cipher(algorithms.AES(key), modes.CTR(_ZERO_NONCE_CTR)).encryptor()
        enc.update_into(self._zeros, self._buf)
        return self._words

    def add(self, key: bytes, acc: np.ndarray) -> None:
        """``acc += PRG(key)`` modulo ``2**(8 * itemsize)``, in place."""
        np.add(acc, self.expand(key), out=acc)

    def sub(self, key: bytes, acc: np.ndarray) -> None:
        """``acc -= PRG(key)`` modulo ``2**(8 * itemsize)``, in place."""
        np.subtract(acc, self.expand(key), out=acc)
