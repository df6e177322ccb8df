"""Tampered, truncated, replayed, mis-addressed and out-of-order messages; decoder fuzzing;
and the client's refusal of unsafe unmask requests."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocols.errors import IntegrityError
from protocols.secagg import ClientAborted, SecAggClient, SecAggConfig, SecAggServer, Stage, wire
from protocols.secagg.primitives import session_id

SEED = b"public-seed-wire"
N, D, BITS = 6, 5, 20
CFG = SecAggConfig(n_clients=N, neighbours=N - 1, threshold=3, modulus_bits=BITS)


def _parties(round_index: int = 1):
    kw = {"config": CFG, "round_index": round_index, "public_seed": SEED, "dim": D}
    return [SecAggClient(i, **kw) for i in range(N)], SecAggServer(**kw)


def _run_until_masked(round_index: int = 1, masked_drop: frozenset = frozenset({5})):
    """Run a round up to the unmask requests; client 5 drops before masking."""
    clients, server = _parties(round_index)
    adv = {i: c.advertise() for i, c in enumerate(clients)}
    for i, m in adv.items():
        server.receive_advertise(i, m)
    keys = server.finish_advertise()
    shares = {i: clients[i].share_keys(m) for i, m in keys.items()}
    for i, m in shares.items():
        server.receive_shares(i, m)
    fwd = server.finish_shares()
    x = np.arange(D, dtype=np.uint64)
    masked = {i: clients[i].masked_input(m, x) for i, m in fwd.items() if i not in masked_drop}
    for i, m in masked.items():
        server.receive_masked_input(i, m)
    requests = server.finish_masked_input()
    return (
        clients,
        server,
        {
            "adv": adv,
            "keys": keys,
            "shares": shares,
            "fwd": fwd,
            "masked": masked,
            "requests": requests,
        },
    )


def _flip(msg: bytes, pos: int) -> bytes:
    b = bytearray(msg)
    b[pos] ^= 0x01
    return bytes(b)


def test_honest_round_through_the_public_stage_api():
    clients, server, m = _run_until_masked()
    for i, req in m["requests"].items():
        server.receive_unmask_shares(i, clients[i].unmask(req))
    total = server.finish_unmask()
    assert np.array_equal(total, (np.arange(D, dtype=np.uint64) * 5) % (1 << BITS))
    assert server.dropped == frozenset({5})
    assert all(c.stage is Stage.DONE for c in clients[:5])


def test_tampered_share_ciphertext_is_rejected_by_the_receiver():
    clients, server = _parties()
    for i, c in enumerate(clients):
        server.receive_advertise(i, c.advertise())
    keys = server.finish_advertise()
    for i, m in keys.items():
        server.receive_shares(i, clients[i].share_keys(m))
    fwd = server.finish_shares()
    bad = _flip(fwd[0], len(fwd[0]) - 3)  # inside the last AES-GCM box
    with pytest.raises(IntegrityError) as info:
        clients[0].masked_input(bad, np.zeros(D, np.uint64))
    assert str(info.value) == "protocol message failed integrity validation"
    assert clients[0].stage is Stage.ABORTED
    # An aborted client answers nothing afterwards, even the genuine message.
    with pytest.raises(IntegrityError):
        clients[0].masked_input(fwd[0], np.zeros(D, np.uint64))


@pytest.mark.parametrize("cut", [0, 1, wire.HEADER_BYTES - 1, wire.HEADER_BYTES, -1])
def test_truncated_messages_are_rejected(cut):
    clients, server = _parties()
    msg = clients[0].advertise()
    with pytest.raises(IntegrityError):
        server.receive_advertise(0, msg[:cut])


def test_every_header_byte_is_checked():
    clients, server = _parties()
    msg = clients[0].advertise()
    for pos in range(wire.HEADER_BYTES):
        with pytest.raises(IntegrityError):
            server.receive_advertise(0, _flip(msg, pos))
    server.receive_advertise(0, msg)


def test_replayed_messages_are_rejected():
    _, _, old = _run_until_masked(round_index=1)
    clients, server = _parties(round_index=2)
    with pytest.raises(IntegrityError):  # message of another round
        server.receive_advertise(0, old["adv"][0])
    server.receive_advertise(0, clients[0].advertise())
    with pytest.raises(IntegrityError):  # same message twice
        server.receive_advertise(0, clients[0].advertise())
    # Another session with the same round index (other public seed) is a replay too.
    other = SecAggServer(config=CFG, round_index=1, public_seed=b"x" * 16, dim=D)
    with pytest.raises(IntegrityError):
        other.receive_advertise(0, old["adv"][0])
    # A client that already shared rejects a second KEYS message.
    c2, s2, m2 = _run_until_masked(round_index=3)
    with pytest.raises(IntegrityError):
        c2[0].share_keys(m2["keys"][0])


def test_misaddressed_and_spoofed_messages_are_rejected():
    clients, server, m = _run_until_masked()
    fresh, fresh_server = _parties()
    for i, c in enumerate(fresh):
        fresh_server.receive_advertise(i, c.advertise())
    keys = fresh_server.finish_advertise()
    with pytest.raises(IntegrityError):  # client 1's keys delivered to client 2
        fresh[2].share_keys(keys[1])
    _, s3, _ = _run_until_masked(round_index=1, masked_drop=frozenset({0, 1, 5}))
    s3.stage = Stage.SHARED  # reopen the masked-input stage to replay into it
    with pytest.raises(IntegrityError):  # client 0's masked input claimed by client 1
        s3.receive_masked_input(1, m["masked"][0])


def test_out_of_order_calls_abort_the_client():
    clients, _ = _parties()
    with pytest.raises(IntegrityError):
        clients[0].masked_input(b"", np.zeros(D, np.uint64))
    assert clients[0].stage is Stage.ABORTED
    with pytest.raises(IntegrityError):
        clients[0].advertise()


def test_masked_input_with_bits_past_its_values_is_rejected():
    """D = 5 values of 20 bits fill 12.5 bytes: the last byte's high 4 bits are padding, and a
    message with any of them set (what a value outside the ring would leave) is refused;
    another bit count or dimension than the round's is refused too."""
    env = wire.Envelope(session=session_id(SEED, 1), round_index=1)
    good = wire.encode_masked_input(env, 4, np.full(D, (1 << BITS) - 1, np.uint64), BITS)
    assert len(good) == wire.masked_input_bytes(D, BITS) == wire.HEADER_BYTES + 5 + 13
    assert (
        wire.decode_masked_input(env, good, sender=4, bits=BITS, dim=D).tolist()
        == [(1 << BITS) - 1] * D
    )
    bad = good[:-1] + bytes([good[-1] | 0x10])
    with pytest.raises(IntegrityError):
        wire.decode_masked_input(env, bad, sender=4, bits=BITS, dim=D)
    with pytest.raises(IntegrityError):
        wire.decode_masked_input(env, good, sender=4, bits=BITS + 1, dim=D)
    with pytest.raises(IntegrityError):
        wire.decode_masked_input(env, good, sender=4, bits=BITS, dim=D + 1)
    # A 31-bit ring travels in whole 32-bit words: a value with bit 31 set is outside it.
    whole = wire.encode_masked_input(env, 4, np.full(D, 2**31 - 1, np.uint64), 31)
    assert len(whole) == wire.masked_input_bytes(D, 31) == wire.HEADER_BYTES + 5 + 4 * D
    outside = whole[:-1] + bytes([whole[-1] | 0x80])
    with pytest.raises(IntegrityError):
        wire.decode_masked_input(env, outside, sender=4, bits=31, dim=D)


@pytest.mark.parametrize("bits", [1, 7, 8, 20, 25, 31, 32, 33, 37, 63, 64])
def test_masked_inputs_are_packed_to_the_ring_bits_and_read_back(bits):
    """Known answer against a bit-by-bit reference: value i occupies bits i * bits .. of the
    body's little-endian bit string, over more values than one packing pass (and a count not
    a multiple of 8); values are reduced modulo 2**bits; the message is exactly
    ceil(dim * bits / 8) body bytes past the 5-byte head."""
    env = wire.Envelope(session=session_id(SEED, 1), round_index=1)
    dim = wire._PACK_CHUNK + 13
    y = np.random.default_rng(bits).integers(0, 2**64, dim, dtype=np.uint64, endpoint=False)
    msg = wire.encode_masked_input(env, 2, y, bits)
    w = wire.wire_bits(bits)  # the ring's bits, or its whole word where packing saves < 1/8
    assert w == (32 if 29 <= bits <= 32 else 64 if bits >= 57 else bits)
    assert len(msg) == wire.masked_input_bytes(dim, bits)
    assert len(msg) == wire.HEADER_BYTES + 5 + -(-dim * w // 8)
    ring = y & np.uint64(2**bits - 1) if bits < 64 else y
    body = int.from_bytes(msg[wire.HEADER_BYTES + 5 :], "little")
    for i in (0, 1, 7, 8, 9, wire._PACK_CHUNK - 1, wire._PACK_CHUNK, dim - 1):
        assert (body >> (i * w)) & (2**w - 1) == int(ring[i])
    assert body >> (dim * w) == 0
    got = wire.decode_masked_input(env, msg, sender=2, bits=bits, dim=dim)
    assert got.dtype == wire.ring_dtype(bits)
    np.testing.assert_array_equal(got.astype(np.uint64), ring)


def _request(round_index: int, receiver: int, total: int, surv: list[int], drop: list[int]):
    env = wire.Envelope(session=session_id(SEED, round_index), round_index=round_index)
    return wire.encode_unmask_request(env, receiver, total, surv, drop)


def test_client_refuses_request_naming_a_client_survivor_and_dropped():
    clients, server, m = _run_until_masked()
    # Client 0 masked with 1..5; 5 dropped. Name 5 both survivor and dropped.
    bad = _request(1, 0, 5, [1, 2, 3, 4, 5], [5])
    with pytest.raises(ClientAborted):
        clients[0].unmask(bad)
    assert clients[0].stage is Stage.ABORTED


def test_client_refuses_request_with_fewer_than_t_survivors():
    clients, server, m = _run_until_masked()
    bad = _request(1, 0, CFG.t - 1, [1], [2, 3, 4, 5])
    with pytest.raises(ClientAborted):
        clients[0].unmask(bad)


@pytest.mark.parametrize(
    ("surv", "drop"),
    [
        ([1, 2, 3], [5]),  # neighbour 4 left unclassified
        ([1, 2, 3, 4], [0, 5]),  # names the client itself dropped
        ([1, 2, 3, 4, 5], []),  # claims the dropped client survived (reveals its b-share)
    ],
)
def test_client_refuses_requests_inconsistent_with_what_it_masked(surv, drop):
    clients, _, _ = _run_until_masked()
    with pytest.raises(ClientAborted):
        clients[0].unmask(_request(1, 0, 5, surv, drop))


def test_client_reveals_shares_once_only():
    clients, server, m = _run_until_masked()
    clients[0].unmask(m["requests"][0])
    with pytest.raises(IntegrityError):
        clients[0].unmask(_request(1, 0, 5, [1, 2, 3, 4], [5]))


# -- fuzzing: decoders raise IntegrityError and nothing else ---------------------------------

_ENV = wire.Envelope(session=session_id(SEED, 1), round_index=1)
_DECODERS = [
    lambda b: wire.decode_advertise(_ENV, b, sender=0),
    lambda b: wire.decode_keys(_ENV, b, receiver=0, n_clients=N),
    lambda b: wire.decode_shares(_ENV, b, sender=0, n_clients=N),
    lambda b: wire.decode_forward(_ENV, b, receiver=0, n_clients=N),
    lambda b: wire.decode_masked_input(_ENV, b, sender=0, bits=BITS, dim=D),
    lambda b: wire.decode_unmask_request(_ENV, b, receiver=0, n_clients=N),
    lambda b: wire.decode_unmask_shares(_ENV, b, sender=0, n_clients=N),
]
_, _, _SAMPLE = _run_until_masked()
_VALID = [
    _SAMPLE["adv"][0],
    _SAMPLE["keys"][0],
    _SAMPLE["shares"][0],
    _SAMPLE["fwd"][0],
    _SAMPLE["masked"][0],
    _SAMPLE["requests"][0],
]


def _decode_all(data: bytes) -> None:
    for decode in _DECODERS:
        with contextlib.suppress(IntegrityError):
            decode(data)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400))
def test_fuzz_random_bytes_only_raise_integrity_error(data):
    _decode_all(data)


@settings(max_examples=300, deadline=None)
@given(
    which=st.integers(0, len(_VALID) - 1),
    edits=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=6),
    cut=st.integers(0, 10_000),
    extra=st.binary(max_size=8),
)
def test_fuzz_mutated_valid_messages_only_raise_integrity_error(which, edits, cut, extra):
    msg = bytearray(_VALID[which])
    for pos, val in edits:
        msg[pos % len(msg)] = val
    _decode_all(bytes(msg[: max(cut, len(msg) // 2)]) + extra)


def test_valid_messages_decode():
    assert wire.decode_advertise(_ENV, _VALID[0], sender=0)
    assert len(wire.decode_keys(_ENV, _VALID[1], receiver=0, n_clients=N)) == N - 1


def test_share_box_moved_to_another_receiver_fails_authentication():
    clients, server = _parties()
    for i, c in enumerate(clients):
        server.receive_advertise(i, c.advertise())
    keys = server.finish_advertise()
    shares = {i: clients[i].share_keys(m) for i, m in keys.items()}
    boxes_of_3 = dict(wire.decode_shares(_ENV, shares[3], sender=3, n_clients=N))
    env = wire.Envelope(session=session_id(SEED, 1), round_index=1)
    # The server hands client 0 the box client 3 sealed for client 1, labelled as 3 -> 0.
    forged = wire.encode_forward(env, 0, [(3, boxes_of_3[1])])
    with pytest.raises(IntegrityError):
        clients[0].masked_input(forged, np.zeros(D, np.uint64))


def test_secrets_never_leave_in_clear_or_in_repr():
    clients, server = _parties()
    sent = [c.advertise() for c in clients]
    secrets = []
    for c in clients:
        secrets += [c._s_sk.private_bytes_raw(), c._c_sk.private_bytes_raw(), c._b]
    for i, m in enumerate(sent):
        server.receive_advertise(i, m)
    for i, m in server.finish_advertise().items():
        reply = clients[i].share_keys(m)
        sent.append(reply)
        server.receive_shares(i, reply)
    for i, m in server.finish_shares().items():
        reply = clients[i].masked_input(m, np.zeros(D, np.uint64))
        sent.append(reply)
    texts = [repr(c) for c in clients] + [repr(server)]
    for secret in secrets:
        assert all(secret not in m for m in sent)
        assert all(secret.hex() not in t for t in texts)
    assert all(c._s_sk is None and c._b is None for c in clients)  # wiped after masking
