"""Tests that fail when a cryptographic property of secure aggregation is broken.

Each test names the break it catches (the issue's list of breaks that the older tests let
through): a constant self-mask seed, non-random Shamir coefficients, the ascending-id check of
the wire decoders removed, and the survivor/dropped overlap check of the client removed.
"""

from __future__ import annotations

import numpy as np
import pytest

from protocols.errors import IntegrityError
from protocols.secagg import ClientAborted, SecAggClient, SecAggConfig, SecAggServer, shamir, wire
from protocols.secagg.primitives import session_id

SEED = b"public-seed-break"
N, D, BITS = 6, 4, 16
CFG = SecAggConfig(n_clients=N, neighbours=N - 1, threshold=3, modulus_bits=BITS)


def _env(round_index: int) -> wire.Envelope:
    return wire.Envelope(session=session_id(SEED, round_index), round_index=round_index)


def _revealed_seeds(round_index: int) -> dict[int, bytes]:
    """Run an honest round (nobody drops) and rebuild every survivor's self-mask seed from
    the shares revealed to the server: exactly what the server learns in round 4."""
    kw = {"config": CFG, "round_index": round_index, "public_seed": SEED, "dim": D}
    clients = [SecAggClient(i, **kw) for i in range(N)]
    server = SecAggServer(**kw)
    for i, c in enumerate(clients):
        server.receive_advertise(i, c.advertise())
    for i, m in server.finish_advertise().items():
        server.receive_shares(i, clients[i].share_keys(m))
    for i, m in server.finish_shares().items():
        server.receive_masked_input(i, clients[i].masked_input(m, np.zeros(D, np.uint64)))
    points: dict[int, list[tuple[int, int]]] = {i: [] for i in range(N)}
    env = _env(round_index)
    for i, m in server.finish_masked_input().items():
        reply = clients[i].unmask(m)
        for owner, kind, share in wire.decode_unmask_shares(env, reply, sender=i, n_clients=N):
            assert kind is wire.ShareKind.SELF_MASK_SEED
            points[owner].append((i + 1, shamir.share_from_bytes(share)))
    return {
        owner: shamir.reconstruct(*zip(*pts, strict=True), threshold=CFG.t)
        for owner, pts in points.items()
    }


# -- break: a constant (or otherwise predictable) self-mask seed -------------------------------


def test_self_mask_seeds_are_fresh_per_client_and_per_round():
    """A self-mask seed the server can predict lets it strip the self mask of a client it
    was told dropped after its masked input arrived; every seed must be fresh."""
    seeds = [*_revealed_seeds(1).values(), *_revealed_seeds(2).values()]
    assert len(seeds) == 2 * N
    assert len(set(seeds)) == 2 * N
    # Not low-entropy either: 32 random bytes have ~32 distinct values per seed.
    assert all(len(set(s)) >= 16 for s in seeds)


# -- break: non-random Shamir coefficients ------------------------------------------------------


def test_shamir_shares_of_one_secret_differ_between_splits():
    """With fixed coefficients (0, 1, a hash of the secret, ...) the same secret gives the same
    shares every time, and t - 1 shares pin it down. Random coefficients give fresh shares:
    two equal share vectors happen with probability about 2**-256."""
    secret = bytes(range(32))
    xs = [1, 2, 3, 4, 5]
    splits = [shamir.split(secret, xs, 3) for _ in range(20)]
    for i in range(len(xs)):
        column = [s[i] for s in splits]
        assert len(set(column)) == len(column)
    # A share is not the secret itself (zero coefficients) nor a fixed offset of it.
    s = int.from_bytes(secret, "big")
    offsets = {(split[0] - s) % shamir.PRIME for split in splits}
    assert len(offsets) == len(splits)


def test_shamir_single_share_high_bits_are_balanced():
    """t = 2: the share at x = 1 is s + c mod p with c uniform, so each of bits 248..255 is
    1 in about half of the splits (binomial, 400 splits, sd 10: |ones - 200| > 60 is a
    6-sigma event, probability about 2e-9 per bit for a correct sampler)."""
    secret = bytes(32)
    shares = [shamir.split(secret, [1, 2], 2)[0] for _ in range(400)]
    for bit in range(248, 256):
        ones = sum((y >> bit) & 1 for y in shares)
        assert abs(ones - 200) <= 60, (bit, ones)


# -- break: the ascending-id check of the decoders removed -------------------------------------


def _keys_message(ids: list[int]) -> bytes:
    keys = [(cid, bytes([cid + 1]) * 32, bytes([cid + 101]) * 32) for cid in ids]
    return wire.encode_keys(_env(1), 0, keys)


def _boxes(ids: list[int]) -> list[tuple[int, bytes]]:
    return [(cid, bytes([cid]) * wire.CIPHERTEXT_BYTES) for cid in ids]


BAD_ID_LISTS = [[2, 1], [1, 1], [1, 3, 2], [1, N]]  # descending, repeated, unsorted, out of range


@pytest.mark.parametrize("ids", BAD_ID_LISTS)
def test_keys_message_with_unsorted_repeated_or_foreign_ids_is_rejected(ids):
    """A repeated id would make a client share twice with one neighbour (two shares of its
    secrets to one party) or count a neighbour twice towards t."""
    with pytest.raises(IntegrityError):
        wire.decode_keys(_env(1), _keys_message(ids), receiver=0, n_clients=N)
    assert wire.decode_keys(_env(1), _keys_message([1, 2, 3]), receiver=0, n_clients=N)


@pytest.mark.parametrize("ids", BAD_ID_LISTS)
def test_share_boxes_with_unsorted_repeated_or_foreign_ids_are_rejected(ids):
    env = _env(1)
    with pytest.raises(IntegrityError):
        wire.decode_shares(env, wire.encode_shares(env, 0, _boxes(ids)), sender=0, n_clients=N)
    with pytest.raises(IntegrityError):
        wire.decode_forward(env, wire.encode_forward(env, 0, _boxes(ids)), receiver=0, n_clients=N)
    ok = wire.encode_forward(env, 0, _boxes([1, 2]))
    assert len(wire.decode_forward(env, ok, receiver=0, n_clients=N)) == 2


@pytest.mark.parametrize("which", ["survivors", "dropped"])
@pytest.mark.parametrize("ids", BAD_ID_LISTS)
def test_unmask_request_with_unsorted_repeated_or_foreign_ids_is_rejected(ids, which):
    env = _env(1)
    surv, drop = (ids, [4]) if which == "survivors" else ([4], ids)
    msg = wire.encode_unmask_request(env, 0, N, surv, drop)
    with pytest.raises(IntegrityError):
        wire.decode_unmask_request(env, msg, receiver=0, n_clients=N)
    good = wire.encode_unmask_request(env, 0, N, [1, 2], [4])
    assert wire.decode_unmask_request(env, good, receiver=0, n_clients=N) == (N, [1, 2], [4])


@pytest.mark.parametrize("ids", BAD_ID_LISTS)
def test_unmask_shares_with_unsorted_repeated_or_foreign_owners_are_rejected(ids):
    """Two shares for one owner would let one client count twice towards t."""
    env = _env(1)
    share = shamir.share_to_bytes(7)
    msg = wire.encode_unmask_shares(
        env, 0, [(o, wire.ShareKind.SELF_MASK_SEED, share) for o in ids]
    )
    with pytest.raises(IntegrityError):
        wire.decode_unmask_shares(env, msg, sender=0, n_clients=N)


def test_server_rejects_a_client_counting_itself_twice_towards_t():
    """End to end: an unmask reply that repeats one owner is refused by the server."""
    kw = {"config": CFG, "round_index": 1, "public_seed": SEED, "dim": D}
    clients = [SecAggClient(i, **kw) for i in range(N)]
    server = SecAggServer(**kw)
    for i, c in enumerate(clients):
        server.receive_advertise(i, c.advertise())
    for i, m in server.finish_advertise().items():
        server.receive_shares(i, clients[i].share_keys(m))
    for i, m in server.finish_shares().items():
        server.receive_masked_input(i, clients[i].masked_input(m, np.zeros(D, np.uint64)))
    requests = server.finish_masked_input()
    env = _env(1)
    reply = clients[0].unmask(requests[0])
    shares = wire.decode_unmask_shares(env, reply, sender=0, n_clients=N)
    doubled = wire.encode_unmask_shares(env, 0, [shares[0], *shares])
    with pytest.raises(IntegrityError):
        server.receive_unmask_shares(0, doubled)


# -- break: the client's survivor/dropped overlap check removed --------------------------------


def masked_round(kw: dict, dropped: frozenset[int] = frozenset({5})):
    """Clients and server of one round after the masking stage (the ``dropped`` never masked;
    zero inputs). ``kw`` holds SecAggClient's and SecAggServer's keyword arguments."""
    n, dim = kw["config"].n_clients, kw["dim"]
    clients = [SecAggClient(i, **kw) for i in range(n)]
    server = SecAggServer(**kw)
    for i, c in enumerate(clients):
        server.receive_advertise(i, c.advertise())
    for i, m in server.finish_advertise().items():
        server.receive_shares(i, clients[i].share_keys(m))
    for i, m in server.finish_shares().items():
        if i not in dropped:
            server.receive_masked_input(i, clients[i].masked_input(m, np.zeros(dim, np.uint64)))
    return clients, server


def _masked_clients():
    clients, _ = masked_round({"config": CFG, "round_index": 1, "public_seed": SEED, "dim": D})
    return clients


@pytest.mark.parametrize(
    ("surv", "drop"),
    [
        ([1, 2, 3, 4, 5], [5]),  # the dropped client also named a survivor
        ([1, 2, 3, 4, 5], [1, 5]),  # a survivor also named dropped
        ([1, 2, 3, 4, 5], [1, 2, 3, 4, 5]),  # everyone both
    ],
)
def test_client_refuses_a_request_naming_a_neighbour_both_survivor_and_dropped(surv, drop):
    """The survivor count is consistent here (total = N), so only the overlap check can
    refuse: a client named both ways would have both its secrets' shares requested."""
    clients = _masked_clients()
    request = wire.encode_unmask_request(_env(1), 0, N, surv, drop)
    with pytest.raises(ClientAborted, match="both survivor and dropped"):
        clients[0].unmask(request)


def test_the_same_request_without_the_overlap_is_answered():
    """Control for the test above: the same count with disjoint lists is a valid request."""
    clients = _masked_clients()
    reply = clients[0].unmask(wire.encode_unmask_request(_env(1), 0, N, [1, 2, 3, 4], [5]))
    shares = wire.decode_unmask_shares(_env(1), reply, sender=0, n_clients=N)
    kinds = {owner: kind for owner, kind, _ in shares}
    assert kinds == {
        1: wire.ShareKind.SELF_MASK_SEED,
        2: wire.ShareKind.SELF_MASK_SEED,
        3: wire.ShareKind.SELF_MASK_SEED,
        4: wire.ShareKind.SELF_MASK_SEED,
        5: wire.ShareKind.MASK_KEY,
    }
