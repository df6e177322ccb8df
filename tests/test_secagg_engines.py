"""The batched engine of secure_sum against the per-client stage machines, key for key.

``protocols.secagg.batched`` computes each pair's agreements and mask once; these tests drive
SecAggClient/SecAggServer objects through a round, replay the same clients' secrets through the
batched engine, and require the same masked inputs, the same sum, the same client sets, the
same traffic, and aborts in exactly the same rounds.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocols.errors import ConfigError, IntegrityError
from protocols.secagg import (
    ClientAborted,
    DropoutSchedule,
    RoundAborted,
    SecAggClient,
    SecAggConfig,
    SecAggServer,
    neighbour_table,
    secure_sum,
    shamir,
    wire,
)
from protocols.secagg.batched import ClientSecrets, batched_round, locality_order
from protocols.secagg.config import majority
from protocols.secagg.primitives import hkdf_sha256, session_id
from protocols.secagg.simulation import STAGES

SEED = b"engines-seed-0123"


def _objects_round(x, cfg, round_index, sched):
    """One round through the per-client objects; returns (secrets, masked inputs, sum,
    survivors, dropped) or (secrets, masked inputs, RoundAborted)."""
    n, dim = x.shape
    kw = {"config": cfg, "round_index": round_index, "public_seed": SEED, "dim": dim}
    clients = [SecAggClient(i, **kw) for i in range(n)]
    server = SecAggServer(**kw)
    secrets, masked = {}, {}
    try:
        for i, c in enumerate(clients):
            if i in sched.advertise:
                continue
            server.receive_advertise(i, c.advertise())
            secrets[i] = ClientSecrets(c._c_sk, c._s_sk, c._b)
        stages = [
            (server.finish_advertise, lambda c, m: c.share_keys(m), server.receive_shares),
            (
                server.finish_shares,
                lambda c, m: c.masked_input(m, x[c.id]),
                server.receive_masked_input,
            ),
            (server.finish_masked_input, lambda c, m: c.unmask(m), server.receive_unmask_shares),
        ]
        for (finish, step, receive), silent in zip(
            stages, (sched.share, sched.masked_input, sched.unmask), strict=True
        ):
            for i, msg in finish().items():
                if i in silent:
                    continue
                try:
                    reply = step(clients[i], msg)
                except ClientAborted:
                    continue
                if receive == server.receive_masked_input:
                    masked[i] = wire.decode_masked_input(
                        server._env, reply, sender=i, bits=cfg.modulus_bits, dim=dim
                    ).copy()
                receive(i, reply)
        total = server.finish_unmask()
    except RoundAborted as exc:
        return secrets, masked, exc
    return secrets, masked, (total, sorted(server.u3), sorted(server.dropped))


def _batched(x, cfg, round_index, sched, secrets, chunk_bytes, workers=1):
    masked: dict[int, np.ndarray] = {}

    def observe(client, start, values):
        row = masked.setdefault(client, np.zeros(x.shape[1], dtype=values.dtype))
        row[start : start + len(values)] = values

    out = batched_round(
        x,
        config=cfg,
        bits=cfg.modulus_bits,
        round_index=round_index,
        public_seed=SEED,
        silent={name: getattr(sched, name) for name in STAGES},
        secrets=secrets,
        observe=observe,
        chunk_bytes=chunk_bytes,
        workers=workers,
    )
    return masked, out


@st.composite
def rounds(draw):
    n = draw(st.integers(3, 14))
    d = draw(st.integers(1, 70))
    bits = draw(st.sampled_from([8, 16, 20, 33, 64]))
    k = draw(st.integers(2, n - 1))
    k = min(k + k % 2, n - 1)
    t = min(k, majority(k) + draw(st.integers(0, 2)))
    stage = draw(st.lists(st.sampled_from([None, None, 0, 1, 2, 3]), min_size=n, max_size=n))
    sched = DropoutSchedule(
        **{name: {i for i, s in enumerate(stage) if s == j} for j, name in enumerate(STAGES)}
    )
    chunk_bytes = draw(st.sampled_from([16, 48, 1 << 17]))
    workers = draw(st.integers(1, 3))
    return n, d, bits, k, t, sched, draw(st.integers(0, 2**16)), chunk_bytes, workers


OUTCOMES: list[bool] = []


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rounds())
def test_batched_engine_equals_the_client_and_server_objects(params):
    """Same secrets: every masked input the server receives is bit-identical (whatever the
    chunking and the number of mask threads, each starting its AES-CTR streams mid-way), and
    so are the sum and the client sets; a round aborts in one engine exactly when it aborts in
    the other."""
    n, d, bits, k, t, sched, seed, chunk_bytes, workers = params
    cfg = SecAggConfig(n_clients=n, neighbours=k, threshold=t, modulus_bits=bits)
    x = np.random.default_rng(seed).integers(0, 1 << bits, size=(n, d), dtype=np.uint64)
    secrets, masked, outcome = _objects_round(x, cfg, seed, sched)
    if isinstance(outcome, RoundAborted):
        OUTCOMES.append(False)
        with pytest.raises(RoundAborted):
            _batched(x, cfg, seed, sched, secrets, chunk_bytes, workers)
        return
    OUTCOMES.append(True)
    got_masked, out = _batched(x, cfg, seed, sched, secrets, chunk_bytes, workers)
    total, survivors, dropped = outcome
    assert sorted(got_masked) == sorted(masked) == survivors
    for i, y in masked.items():
        np.testing.assert_array_equal(got_masked[i], y)
    np.testing.assert_array_equal(out.sum, total)
    assert out.survivors.tolist() == survivors and out.dropped.tolist() == dropped
    ring = np.uint64((1 << bits) - 1 if bits < 64 else 2**64 - 1)
    plain = x[survivors].sum(axis=0, dtype=np.uint64) & ring
    np.testing.assert_array_equal(out.sum, plain)


def test_engine_property_run_exercised_both_outcomes():
    """Guard against a vacuous property: the comparison above saw sums and aborts."""
    if len(OUTCOMES) < 20:
        pytest.skip("property test did not run first")
    assert any(OUTCOMES) and not all(OUTCOMES)


def test_masked_inputs_differ_from_the_inputs_and_from_fresh_keys():
    """Control: the observed masked inputs are masked (not the inputs), and other secrets
    give other masked inputs, so the equality above is not between two copies of x."""
    n, d = 10, 40
    cfg = SecAggConfig(n_clients=n, neighbours=6, threshold=4, modulus_bits=33)
    x = np.random.default_rng(1).integers(0, 1 << 33, size=(n, d), dtype=np.uint64)
    sched = DropoutSchedule(masked_input={3})
    secrets = {u: ClientSecrets.generate() for u in range(n)}
    a, out_a = _batched(x, cfg, 2, sched, secrets, 64)
    b, out_b = _batched(x, cfg, 2, sched, {u: ClientSecrets.generate() for u in range(n)}, 64)
    for u in a:
        assert not np.array_equal(a[u], x[u]) and not np.array_equal(a[u], b[u])
    np.testing.assert_array_equal(out_a.sum, out_b.sum)


@pytest.mark.parametrize(
    "sched",
    [
        DropoutSchedule(),
        DropoutSchedule(advertise={0}, share={9}, masked_input={2, 17}, unmask={11}),
    ],
)
def test_engines_report_the_same_client_sets_and_traffic(sched):
    n, d = 24, 333
    cfg = SecAggConfig(n_clients=n, neighbours=12, threshold=7, modulus_bits=40)
    x = np.random.default_rng(3).integers(0, 1 << 40, size=(n, d), dtype=np.uint64)
    kw = {"config": cfg, "round_index": 5, "public_seed": SEED, "dropouts": sched}
    obj = secure_sum(x, engine="objects", **kw)
    bat = secure_sum(x, **kw)
    np.testing.assert_array_equal(obj.sum, bat.sum)
    for name in ("survivors", "dropped", "excluded"):
        assert getattr(obj, name).tolist() == getattr(bat, name).tolist()
    assert obj.bytes_per_stage == bat.bytes_per_stage
    assert set(bat.seconds_per_stage) == set(STAGES)


class _Blocks:
    """RingBlocks over an array, recording every block asked for (thread-safe enough: list
    appends hold the GIL)."""

    def __init__(self, x, bad=None, align=1):
        self.x, self.bad, self.align, self.calls = x, bad, align, []

    @property
    def shape(self):
        return self.x.shape

    def block(self, lo, hi):
        self.calls.append((lo, hi))
        out = self.x[:, lo:hi].copy()
        if self.bad == "dtype":
            return out.astype(np.int64)
        if self.bad == "shape":
            return out[:, :-1]
        if self.bad == "unreduced" and lo > 0:  # a later block: found as it arrives
            out[0, 0] = np.uint64(1 << 40)
        return out


@pytest.mark.parametrize("workers", [1, 2])
def test_streamed_inputs_give_the_same_masked_inputs_and_sum(monkeypatch, workers):
    """A RingBlocks source instead of the array: the same secrets give bit-identical masked
    inputs and sum (dropouts at every stage included), the blocks are narrowed to the stream
    budget, start and end on the source's alignment and cover every coordinate exactly
    once."""
    from protocols.secagg import batched

    n, d = 24, 333
    monkeypatch.setattr(batched, "STREAM_BLOCK_BYTES", 8 * n * 40)  # 40 columns a block
    cfg = SecAggConfig(n_clients=n, neighbours=12, threshold=7, modulus_bits=40)
    x = np.random.default_rng(4).integers(0, 1 << 40, size=(n, d), dtype=np.uint64)
    sched = DropoutSchedule(advertise={0}, share={9}, masked_input={2, 17}, unmask={11})
    secrets = {u: ClientSecrets.generate() for u in range(n)}
    want_masked, want = _batched(x, cfg, 3, sched, secrets, 1 << 17, workers)
    source = _Blocks(x, align=24)
    got_masked, got = _batched(source, cfg, 3, sched, secrets, 1 << 17, workers)
    np.testing.assert_array_equal(got.sum, want.sum)
    assert sorted(got_masked) == sorted(want_masked)
    for u, y in want_masked.items():
        np.testing.assert_array_equal(got_masked[u], y)
    assert max(hi - lo for lo, hi in source.calls) <= 40
    assert all(lo % 24 == 0 and (hi % 24 == 0 or hi == d) for lo, hi in source.calls)
    covered = np.zeros(d, dtype=np.int64)
    for lo, hi in source.calls:
        covered[lo:hi] += 1
    assert covered.tolist() == [1] * d
    plain = x[got.survivors].sum(axis=0, dtype=np.uint64) & np.uint64((1 << 40) - 1)
    np.testing.assert_array_equal(got.sum, plain)


@pytest.mark.parametrize(
    ("bad", "engine", "match"),
    [
        ("dtype", "batched", r"must return uint64 of shape \[6, "),
        ("shape", "batched", r"must return uint64 of shape \[6, "),
        ("unreduced", "batched", r"not reduced modulo 2\*\*33"),
        (None, "objects", "engine='batched' only"),
    ],
)
def test_streamed_inputs_are_checked_block_by_block(monkeypatch, bad, engine, match):
    from protocols.secagg import batched

    monkeypatch.setattr(batched, "STREAM_BLOCK_BYTES", 8 * 6 * 16)
    cfg = SecAggConfig(n_clients=6, neighbours=4, threshold=3, modulus_bits=33)
    x = np.random.default_rng(5).integers(0, 1 << 33, size=(6, 50), dtype=np.uint64)
    with pytest.raises(ConfigError, match=match):
        secure_sum(_Blocks(x, bad), config=cfg, round_index=1, public_seed=SEED, engine=engine)


def test_streamed_inputs_of_the_wrong_shape_are_refused_before_the_round():
    cfg = SecAggConfig(n_clients=6, neighbours=4, threshold=3, modulus_bits=33)
    source = _Blocks(np.zeros((5, 8), dtype=np.uint64))
    with pytest.raises(ConfigError, match=r"ring_inputs.shape must be \(6, dim >= 1\)"):
        secure_sum(source, config=cfg, round_index=1, public_seed=SEED)
    assert source.calls == []


@pytest.mark.parametrize(
    ("kwargs", "match"), [({"engine": "x"}, "engine"), ({"workers": 0}, "workers")]
)
def test_secure_sum_refuses_an_unknown_engine_or_no_workers(kwargs, match):
    cfg = SecAggConfig(n_clients=3, neighbours=2, modulus_bits=8, dropout_tolerance=0.0)
    with pytest.raises(ConfigError, match=match):
        secure_sum(
            np.zeros((3, 2), np.uint64), config=cfg, round_index=0, public_seed=SEED, **kwargs
        )


@pytest.mark.parametrize(("n", "k"), [(101, 10), (943, 30), (60, 59)])
def test_locality_order_is_a_permutation_of_the_members_with_a_narrow_window(n, k):
    table = neighbour_table(session_id(SEED, 1), n, k)
    members = np.random.default_rng(n).random(n) > 0.05
    order = locality_order(table, members)
    assert sorted(order) == np.flatnonzero(members).tolist()
    if k < n - 1:
        # On the Harary cycle the walk follows positions: neighbours in the graph are close
        # in the order except across the cycle's seam.
        pos = {u: i for i, u in enumerate(order)}
        gaps = [abs(pos[u] - pos[v]) for u in order for v in table[u] if members[v]]
        assert np.mean(np.array(gaps) <= k) > 0.9


@settings(max_examples=60, deadline=None)
@given(
    ikm=st.binary(max_size=80),
    salt=st.binary(max_size=130),
    info=st.binary(max_size=60),
    length=st.integers(1, 255 * 32),
)
def test_hkdf_equals_cryptography_hkdf(ikm, salt, info, length):
    ref = HKDF(algorithm=hashes.SHA256(), length=length, salt=salt or None, info=info).derive(ikm)
    assert hkdf_sha256(ikm, salt=salt, info=info, length=length) == ref


def test_hkdf_rejects_lengths_outside_the_rfc_range():
    for length in (0, 255 * 32 + 1):
        with pytest.raises(ConfigError):
            hkdf_sha256(b"k", salt=b"s", info=b"i", length=length)


@settings(max_examples=30, deadline=None)
@given(
    t=st.integers(1, 12),
    extra=st.integers(0, 6),
    big=st.booleans(),
    shift=st.integers(0, 3),
)
def test_shamir_with_large_or_unreduced_points(t, extra, big, shift):
    """Reductions are deferred; points near 2**32 and points given plus a multiple of the
    prime still split and reconstruct exactly, and a wrong extra share is still caught."""
    secret = os.urandom(32)
    base = 2**32 - 40 if big else 1
    xs = [base + 3 * i for i in range(t + extra)]
    ys = shamir.split(secret, xs, t)
    assert all(0 <= y < shamir.PRIME for y in ys)
    shifted = [x + shift * shamir.PRIME for x in xs]
    assert shamir.reconstruct(shifted, ys, threshold=t) == secret
    if extra:
        bad = list(ys)
        bad[-1] = (bad[-1] + 1) % shamir.PRIME
        with pytest.raises(IntegrityError):
            shamir.reconstruct(xs, bad, threshold=t)
