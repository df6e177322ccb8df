"""The server rebuilds every secret from every share it has and rejects inconsistent shares.

With ``m > t`` shares of one secret, the shares form a Reed-Solomon codeword; the server
checks every share against the polynomial through the others, so one lying client makes the
round abort (an :class:`IntegrityError`), never produce a wrong sum.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocols.errors import ConfigError, IntegrityError
from protocols.secagg import (
    RoundAborted,
    SecAggClient,
    SecAggConfig,
    SecAggServer,
    ShareVerificationFailed,
    Stage,
    shamir,
    wire,
)
from protocols.secagg.primitives import session_id

SEED = b"public-seed-verify"
N, D, BITS, ROUND = 6, 5, 20, 1
CFG = SecAggConfig(n_clients=N, neighbours=N - 1, threshold=3, modulus_bits=BITS)


# -- shamir.reconstruct ------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    t=st.integers(1, 6),
    extra=st.integers(1, 5),
    data=st.data(),
)
def test_any_one_to_m_minus_t_wrong_shares_are_detected(t, extra, data):
    m = t + extra
    xs = data.draw(st.lists(st.integers(1, 2**32), min_size=m, max_size=m, unique=True))
    secret = os.urandom(32)
    ys = shamir.split(secret, xs, t)
    assert shamir.reconstruct(xs, ys, threshold=t) == secret
    wrong = data.draw(st.sets(st.integers(0, m - 1), min_size=1, max_size=extra))
    bad = list(ys)
    for i in wrong:
        delta = data.draw(st.integers(1, shamir.PRIME - 1))
        bad[i] = (bad[i] + delta) % shamir.PRIME  # still a valid, in-field share value
    with pytest.raises(IntegrityError) as info:
        shamir.reconstruct(xs, bad, threshold=t)
    assert str(info.value) == "protocol message failed integrity validation"


def test_one_wrong_share_among_the_first_t_or_the_extras_is_detected():
    xs = [2, 3, 5, 7, 11, 13, 17]
    secret = os.urandom(32)
    ys = shamir.split(secret, xs, 4)
    for i in range(len(xs)):
        bad = list(ys)
        bad[i] = (bad[i] + 1) % shamir.PRIME
        with pytest.raises(IntegrityError):
            shamir.reconstruct(xs, bad, threshold=4)
        # Any t shares that avoid the wrong one still reconstruct.
        keep = [j for j in range(len(xs)) if j != i][:4]
        assert shamir.reconstruct([xs[j] for j in keep], [ys[j] for j in keep], threshold=4) == (
            secret
        )


def test_exactly_t_shares_cannot_be_checked_and_give_another_secret():
    """Why the server must use every share: with no redundancy a wrong share goes unseen."""
    xs = [1, 2, 3]
    secret = os.urandom(32)
    ys = shamir.split(secret, xs, 3)
    ys[0] = (ys[0] + 1) % shamir.PRIME
    try:
        got = shamir.reconstruct(xs, ys, threshold=3)
    except IntegrityError:  # the shifted secret left 32 bytes (probability ~2**-256)
        return
    assert got != secret


def test_reconstruct_validates_its_arguments():
    xs, ys = [1, 2, 3], shamir.split(os.urandom(32), [1, 2, 3], 2)
    for threshold in (0, 4, True):
        with pytest.raises(ConfigError, match="threshold"):
            shamir.reconstruct(xs, ys, threshold=threshold)
    with pytest.raises(ConfigError):
        shamir.reconstruct(xs, ys[:2], threshold=2)
    for bad_xs in ([1, 1, 3], [0, 2, 3], [shamir.PRIME, 2, 3]):
        with pytest.raises(IntegrityError):
            shamir.reconstruct(bad_xs, ys, threshold=2)
    for bad_y in (-1, shamir.PRIME):
        with pytest.raises(IntegrityError):
            shamir.reconstruct(xs, [bad_y, *ys[1:]], threshold=2)


# -- the server -------------------------------------------------------------------------------


def _round_to_unmask(dropped: frozenset[int] = frozenset({5})):
    kw = {"config": CFG, "round_index": ROUND, "public_seed": SEED, "dim": D}
    clients = [SecAggClient(i, **kw) for i in range(N)]
    server = SecAggServer(**kw)
    for i, c in enumerate(clients):
        server.receive_advertise(i, c.advertise())
    for i, m in server.finish_advertise().items():
        server.receive_shares(i, clients[i].share_keys(m))
    x = np.random.default_rng(4).integers(0, 1 << BITS, size=(N, D), dtype=np.uint64)
    for i, m in server.finish_shares().items():
        if i not in dropped:
            server.receive_masked_input(i, clients[i].masked_input(m, x[i]))
    requests = server.finish_masked_input()
    replies = {i: clients[i].unmask(m) for i, m in requests.items()}
    expected = x[sorted(server.u3)].sum(axis=0, dtype=np.uint64) & np.uint64((1 << BITS) - 1)
    return server, replies, expected


def _lie(reply: bytes, sender: int, owner: int) -> bytes:
    """``sender``'s unmask reply with its share of ``owner``'s secret off by one (in range)."""
    env = wire.Envelope(session=session_id(SEED, ROUND), round_index=ROUND)
    shares = []
    for o, kind, share in wire.decode_unmask_shares(env, reply, sender=sender, n_clients=N):
        if o == owner:
            y = (shamir.share_from_bytes(share) + 1) % shamir.PRIME
            share = shamir.share_to_bytes(y)
        shares.append((o, kind, share))
    return wire.encode_unmask_shares(env, sender, shares)


def test_honest_unmask_with_redundant_shares_is_exact():
    server, replies, expected = _round_to_unmask()
    for i, msg in replies.items():
        server.receive_unmask_shares(i, msg)
    np.testing.assert_array_equal(server.finish_unmask(), expected)


@pytest.mark.parametrize(
    ("owner", "kind"), [(3, "self-mask seed of a survivor"), (5, "mask key of a dropped client")]
)
def test_one_bad_in_range_share_aborts_the_round_instead_of_a_wrong_sum(owner, kind):
    """Client 0 answers first, so its share is among the first t the old server used: the
    survivor's seed came out wrong and the sum with it."""
    server, replies, _ = _round_to_unmask()
    for i, msg in replies.items():
        server.receive_unmask_shares(i, _lie(msg, i, owner) if i == 0 else msg)
    with pytest.raises(ShareVerificationFailed) as info:
        server.finish_unmask()
    assert isinstance(info.value, IntegrityError) and isinstance(info.value, RoundAborted)
    assert str(info.value) == "protocol message failed integrity validation"
    assert server.stage is Stage.ABORTED
    with pytest.raises(IntegrityError):  # an aborted server answers nothing more
        server.finish_unmask()


def test_a_bad_share_from_the_last_responder_is_detected_too():
    server, replies, _ = _round_to_unmask()
    last = max(replies)
    for i, msg in replies.items():
        server.receive_unmask_shares(i, _lie(msg, i, 0) if i == last else msg)
    with pytest.raises(ShareVerificationFailed):
        server.finish_unmask()


def test_exactly_t_shares_of_a_secret_still_unmask():
    """No redundancy is no error: with t + 1 responders each responder's seed has exactly
    t shares (from the others) and still reconstructs."""
    server, replies, expected = _round_to_unmask()
    keep = sorted(replies)[: CFG.t + 1]
    for i in keep:
        server.receive_unmask_shares(i, replies[i])
    np.testing.assert_array_equal(server.finish_unmask(), expected)


def test_zero_is_a_valid_share_value_and_secret():
    assert shamir.reconstruct([5], [0], threshold=1) == bytes(32)
    xs = [1, 2, 3]
    ys = shamir.split(bytes(32), xs, 1)  # t = 1: every share is the secret itself
    assert ys == [0, 0, 0]
    assert shamir.reconstruct(xs, ys, threshold=1) == bytes(32)


def test_a_field_element_too_large_for_32_bytes_is_not_a_secret():
    """f(0) in [2**256, PRIME) is a valid field element but no 32-byte secret."""
    with pytest.raises(IntegrityError):
        shamir.reconstruct([4], [shamir.PRIME - 1], threshold=1)
    with pytest.raises(IntegrityError):
        shamir.reconstruct([4], [1 << 256], threshold=1)
    assert shamir.reconstruct([4], [(1 << 256) - 1], threshold=1) == b"\xff" * 32


def test_a_point_at_a_multiple_of_the_prime_is_refused():
    ys = shamir.split(os.urandom(32), [1, 2], 2)
    with pytest.raises(IntegrityError):
        shamir.reconstruct([shamir.PRIME + 1, 1], ys, threshold=2)  # same point twice mod p
    with pytest.raises(IntegrityError):
        shamir.reconstruct([2 * shamir.PRIME, 2], ys, threshold=2)


def test_exact_messages_of_invalid_sharing_arguments():
    with pytest.raises(ConfigError) as err:
        shamir.split(b"short", [1, 2], 2)
    assert str(err.value) == "secret must be 32 bytes, got 5 bytes"
    with pytest.raises(ConfigError) as err:
        shamir.split(bytes(32), [1, 2], 3)
    assert str(err.value) == "threshold must be in [1, 2], got 3"
    with pytest.raises(ConfigError) as err:
        shamir.reconstruct([1, 2], [3], threshold=1)
    assert str(err.value) == "need as many xs as ys (>= 1), got 2 and 1"


def test_a_share_equal_to_the_prime_is_refused_even_without_redundancy():
    with pytest.raises(IntegrityError):
        shamir.reconstruct([1], [shamir.PRIME], threshold=1)
