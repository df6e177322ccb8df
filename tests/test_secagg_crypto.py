"""Known-answer tests for the HKDF, AES-GCM and AES-CTR usage, and Shamir sharing."""

from __future__ import annotations

import hashlib
import itertools
import os
import struct

import numpy as np
import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from protocols.errors import ConfigError, IntegrityError
from protocols.secagg import shamir
from protocols.secagg.primitives import (
    MaskExpander,
    hkdf_sha256,
    keystream,
    open_sealed,
    pair_mask_key,
    seal,
    self_mask_key,
    session_id,
    share_box_keys,
)


@pytest.mark.parametrize(
    ("ikm", "salt", "info", "length", "okm"),
    [
        (  # RFC 5869 A.1
            "0b" * 22,
            "000102030405060708090a0b0c",
            "f0f1f2f3f4f5f6f7f8f9",
            42,
            "3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf34007208d5b887185865",
        ),
        (  # RFC 5869 A.3 (empty salt and info)
            "0b" * 22,
            "",
            "",
            42,
            "8da4e775a563c18f715f802a063c5a31b8a11f5c5ee1879ec3454e5f3c738d2d9d201395faa4b61a96c8",
        ),
    ],
)
def test_hkdf_sha256_rfc5869_vectors(ikm, salt, info, length, okm):
    got = hkdf_sha256(
        bytes.fromhex(ikm), salt=bytes.fromhex(salt), info=bytes.fromhex(info), length=length
    )
    assert got.hex() == okm


@pytest.mark.parametrize(
    ("plaintext", "expected"),
    [  # McGrew & Viega, "The GCM mode of operation", test cases 1 and 2 (K = 0, IV = 0)
        ("", "58e2fccefa7e3061367f1d57a4e7455a"),
        ("00" * 16, "0388dace60b6a392f328c2b971b2fe78ab6e47d42cec13bdf53a67b21257bddf"),
    ],
)
def test_seal_matches_gcm_spec_vectors(plaintext, expected):
    key = bytes(16)
    assert seal(key, bytes.fromhex(plaintext), b"").hex() == expected
    assert open_sealed(key, bytes.fromhex(expected), b"") == bytes.fromhex(plaintext)


def test_open_sealed_rejects_any_change_with_one_error():
    key = os.urandom(16)
    ct = seal(key, b"share", b"ad")
    for bad_ct, bad_ad, bad_key in [
        (bytes([ct[0] ^ 1]) + ct[1:], b"ad", key),
        (ct[:-1], b"ad", key),
        (ct, b"ae", key),
        (ct, b"ad", os.urandom(16)),
    ]:
        with pytest.raises(IntegrityError) as info:
            open_sealed(bad_key, bad_ct, bad_ad)
        assert str(info.value) == "protocol message failed integrity validation"


def test_keystream_is_aes_ctr_from_counter_zero():
    key = bytes.fromhex("2b7e151628aed2a6abf7158809cf4f3c")  # SP 800-38A key
    ecb = Cipher(algorithms.AES(key), modes.ECB()).encryptor()
    blocks = b"".join(i.to_bytes(16, "big") for i in range(8))
    expected = np.frombuffer(ecb.update(blocks), dtype=np.uint64)
    np.testing.assert_array_equal(keystream(key, 16), expected)
    # A short expander gives the prefix of the same stream; narrow words split it.
    np.testing.assert_array_equal(MaskExpander(5).expand(key), expected[:5])
    np.testing.assert_array_equal(keystream(key, 32, np.uint32), expected.view(np.uint32))


def test_pairwise_keys_agree_across_the_pair_and_differ_per_pair():
    shared = os.urandom(32)
    s = os.urandom(32)
    assert pair_mask_key(shared, session=s, round_index=3, a=1, b=7) == pair_mask_key(
        shared, session=s, round_index=3, a=7, b=1
    )
    assert pair_mask_key(shared, session=s, round_index=3, a=1, b=7) != pair_mask_key(
        shared, session=s, round_index=4, a=1, b=7
    )
    out_17, in_17 = share_box_keys(shared, session=s, round_index=3, a=1, b=7)
    out_71, in_71 = share_box_keys(shared, session=s, round_index=3, a=7, b=1)
    assert out_17 == in_71 and out_71 == in_17 and out_17 != out_71


def test_shamir_prime_is_probably_prime_and_exceeds_secret_space():
    assert shamir.PRIME > 1 << 256
    for base in (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37):
        assert pow(base, shamir.PRIME - 1, shamir.PRIME) == 1


def test_shamir_any_t_shares_reconstruct():
    secret = b"\xff" * 32  # the largest secret still fits the field
    xs = [3, 8, 9, 12, 40, 41]
    ys = shamir.split(secret, xs, 4)
    for subset in itertools.combinations(range(6), 4):
        assert shamir.combine([xs[i] for i in subset], [ys[i] for i in subset]) == secret
    wire_ys = [shamir.share_from_bytes(shamir.share_to_bytes(y)) for y in ys]
    assert wire_ys == ys


def _lagrange_at(z: int, xs: list[int], ys: list[int]) -> int:
    p = shamir.PRIME
    total = 0
    for i, (xi, yi) in enumerate(zip(xs, ys, strict=True)):
        term = yi
        for j, xj in enumerate(xs):
            if i != j:
                term = term * (z - xj) * pow(xi - xj, -1, p) % p
        total = (total + term) % p
    return total


def test_shamir_t_minus_one_shares_are_consistent_with_every_secret():
    """Perfect hiding, constructively: for any candidate secret s', the t-1 real shares and
    (0, s') define a valid sharing whose t-th share makes combine() return s'."""
    secret = os.urandom(32)
    xs = [1, 2, 3, 4]
    ys = shamir.split(secret, xs, 4)
    for fake in (bytes(32), b"\x01" * 32, secret):
        pts_x, pts_y = [0, *xs[:3]], [int.from_bytes(fake, "big"), *ys[:3]]
        y5 = _lagrange_at(5, pts_x, pts_y)
        assert shamir.combine([*xs[:3], 5], [*ys[:3], y5]) == fake
    assert shamir.combine(xs, ys) == secret


def test_shamir_rejects_bad_shares():
    with pytest.raises(IntegrityError):
        shamir.share_from_bytes(shamir.PRIME.to_bytes(33, "big"))
    with pytest.raises(IntegrityError):
        shamir.combine([1, 1], [2, 3])


# -- key derivation pinned to its specification (domain separation) ---------------------------


def _hkdf_spec(ikm: bytes, salt: bytes, purpose: bytes, round_index: int, *ids: int, n: int):
    """HKDF-SHA256 as docs/secagg.md specifies it, built from the primitive directly."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    label = b"securefed/secagg/v1/" + purpose + struct.pack(f">Q{len(ids)}I", round_index, *ids)
    return HKDF(algorithm=hashes.SHA256(), length=n, salt=salt, info=label).derive(ikm)


def test_mask_and_box_keys_are_hkdf_with_session_salt_and_labelled_info():
    shared, seed, session = os.urandom(32), os.urandom(32), os.urandom(32)
    assert pair_mask_key(shared, session=session, round_index=9, a=7, b=2) == _hkdf_spec(
        shared, session, b"pair-mask", 9, 2, 7, n=16
    )
    assert self_mask_key(seed, session=session, round_index=9, client=4) == _hkdf_spec(
        seed, session, b"self-mask", 9, 4, n=16
    )
    okm = _hkdf_spec(shared, session, b"share-box", 9, 2, 7, n=32)
    assert share_box_keys(shared, session=session, round_index=9, a=2, b=7) == (okm[:16], okm[16:])
    assert share_box_keys(shared, session=session, round_index=9, a=7, b=2) == (okm[16:], okm[:16])


def test_every_key_depends_on_session_round_purpose_and_ids():
    shared, session = os.urandom(32), os.urandom(32)
    keys = set()
    for s in (session, os.urandom(32)):
        for r in (1, 2):
            for a, b in ((0, 1), (0, 2), (1, 2)):
                keys.add(pair_mask_key(shared, session=s, round_index=r, a=a, b=b))
                keys.update(share_box_keys(shared, session=s, round_index=r, a=a, b=b))
            for c in (0, 1, 2):
                keys.add(self_mask_key(shared, session=s, round_index=r, client=c))
    assert len(keys) == 2 * 2 * (3 + 3 * 2 + 3)


def test_session_id_binds_seed_and_round():
    ids = {session_id(seed, r) for seed in (b"a" * 16, b"b" * 16, b"a" * 17) for r in (0, 1)}
    assert len(ids) == 6
    h = hashlib.sha256(b"securefed/secagg/v1/session" + (16).to_bytes(4, "big") + b"a" * 16)
    h.update((5).to_bytes(8, "big"))
    assert session_id(b"a" * 16, 5) == h.digest()


def test_mask_expander_rejects_bad_shapes_with_messages():
    with pytest.raises(ConfigError, match="dim must be >= 1, got 0"):
        MaskExpander(0)
    with pytest.raises(ConfigError, match="dtype must be unsigned, got int64"):
        MaskExpander(4, np.int64)
