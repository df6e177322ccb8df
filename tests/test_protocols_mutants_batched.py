"""Tests written for surviving mutants of the fifth mutation run over ``protocols/``
(docs/mutation.md, "Fifth run"): ``secagg/batched.py``, the default engine of
:func:`secure_sum` (pairwise masks, self masks, Shamir shares, reconstruction).

The engine is compared with the per-client stage machines in tests/test_secagg_engines.py;
these tests pin what that comparison does not see: the thread count, the abort messages and
the round at which each abort happens, the share-verification paths, the client secrets, the
stage timings and the locality order.

Each pins a behaviour that a mutant changed without failing any earlier test.
"""

from __future__ import annotations

import os
import re
import threading
import time

import numpy as np
import pytest

from protocols.errors import ConfigError
from protocols.secagg import RoundAborted, SecAggConfig, neighbour_table, shamir, wire
from protocols.secagg import batched as batched_mod
from protocols.secagg.batched import (
    MAX_WORKERS,
    STAGES,
    ClientSecrets,
    batched_round,
    default_workers,
    locality_order,
)
from protocols.secagg.errors import ShareVerificationFailed
from protocols.secagg.primitives import (
    MaskExpander,
    open_sealed,
    pair_mask_key,
    self_mask_key,
    session_id,
    share_box_keys,
)

SEED = b"batched-mutants-0123"


def _round(x, cfg, *, silent=None, secrets=None, observe=None, workers=1, chunk_bytes=1 << 17):
    return batched_round(
        x,
        config=cfg,
        bits=cfg.modulus_bits,
        round_index=3,
        public_seed=SEED,
        silent={name: frozenset((silent or {}).get(name, ())) for name in STAGES},
        secrets=secrets,
        observe=observe,
        chunk_bytes=chunk_bytes,
        workers=workers,
    )


def _inputs(n, dim, bits, seed=0):
    return np.random.default_rng(seed).integers(0, 1 << bits, size=(n, dim), dtype=np.uint64)


# -- default_workers ---------------------------------------------------------------------------


@pytest.mark.parametrize(("cores", "want"), [(0, 1), (1, 1), (3, 3), (4, 4), (16, 4)])
def test_default_workers_is_the_affinity_clamped_to_one_and_max_workers(monkeypatch, cores, want):
    assert MAX_WORKERS == 4
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: set(range(cores)), raising=False)
    assert default_workers() == want


@pytest.mark.parametrize(("count", "want"), [(None, 1), (1, 1), (2, 2), (3, 3), (64, 4)])
def test_default_workers_without_affinity_uses_cpu_count_or_one(monkeypatch, count, want):
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: count)
    assert default_workers() == want


# -- ClientSecrets -----------------------------------------------------------------------------


def test_client_secrets_are_two_distinct_fresh_x25519_keys_and_a_32_byte_seed():
    a, b = ClientSecrets.generate(), ClientSecrets.generate()
    for s in (a, b):
        assert isinstance(s.seed, bytes) and len(s.seed) == shamir.SECRET_BYTES == 32
        assert s.c_sk.private_bytes_raw() != s.s_sk.private_bytes_raw()
    assert a.seed != b.seed
    assert a.c_sk.private_bytes_raw() != b.c_sk.private_bytes_raw()
    assert a.s_sk.private_bytes_raw() != b.s_sk.private_bytes_raw()


# -- checks and abort messages -----------------------------------------------------------------


@pytest.mark.parametrize("workers", [0, -1, 1.0, "2", None])
def test_batched_round_refuses_workers_that_are_not_a_positive_int(workers):
    cfg = SecAggConfig(n_clients=3, neighbours=2, modulus_bits=8, dropout_tolerance=0.0)
    with pytest.raises(
        ConfigError, match=re.escape(f"workers must be an int >= 1, got {workers!r}")
    ):
        _round(np.zeros((3, 2), np.uint64), cfg, workers=workers)


def _abort_message(what, count, t):
    return (
        f"only {count} clients {what}, fewer than the threshold t={t}; "
        "the round is aborted and reveals nothing"
    )


def test_fewer_than_t_advertisers_abort_at_advertise_with_the_exact_message():
    cfg = SecAggConfig(n_clients=5, neighbours=4, threshold=3, modulus_bits=16)
    with pytest.raises(RoundAborted) as err:
        _round(_inputs(5, 4, 16), cfg, silent={"advertise": {0, 1, 2}})
    assert str(err.value) == _abort_message("advertised keys", 2, 3)


def test_exactly_t_advertisers_pass_advertise_and_abort_only_at_share():
    """``t`` advertisers are enough for the advertise stage; each then has only ``t - 1``
    advertising neighbours, so every client aborts at the share stage (not before)."""
    cfg = SecAggConfig(n_clients=5, neighbours=4, threshold=3, modulus_bits=16)
    with pytest.raises(RoundAborted) as err:
        _round(_inputs(5, 4, 16), cfg, silent={"advertise": {3, 4}})
    assert str(err.value) == _abort_message("shared keys", 0, 3)


def test_a_client_with_fewer_than_t_revealed_shares_aborts_the_round_with_its_message():
    cfg = SecAggConfig(n_clients=5, neighbours=4, threshold=3, modulus_bits=16)
    with pytest.raises(RoundAborted) as err:
        _round(_inputs(5, 4, 16), cfg, silent={"unmask": {2, 3, 4}})
    assert type(err.value) is RoundAborted
    assert str(err.value) == (
        "client 0 has 1 revealed shares, fewer than t=3; the round is aborted and reveals nothing"
    )


def test_exactly_t_revealed_shares_reconstruct_every_seed():
    """Client 4 answers no unmask request: each survivor then has exactly ``t = 3`` revealed
    shares (client 0..3 each have three responding neighbours, client 4 four)."""
    cfg = SecAggConfig(n_clients=5, neighbours=4, threshold=3, modulus_bits=16)
    x = _inputs(5, 4, 16, seed=1)
    out = _round(x, cfg, silent={"unmask": {4}})
    assert out.survivors.tolist() == [0, 1, 2, 3, 4]
    np.testing.assert_array_equal(out.sum, x.sum(axis=0, dtype=np.uint64) & np.uint64(0xFFFF))


# -- share verification ------------------------------------------------------------------------


def _secrets(n):
    return {u: ClientSecrets.generate() for u in range(n)}


def test_shares_that_fail_reed_solomon_verification_abort_with_share_verification_failed(
    monkeypatch,
):
    from protocols.errors import IntegrityError

    def broken(xs, ys, *, threshold):
        raise IntegrityError("inconsistent shares")

    monkeypatch.setattr(shamir, "reconstruct", broken)
    cfg = SecAggConfig(n_clients=5, neighbours=4, threshold=3, modulus_bits=16)
    with pytest.raises(ShareVerificationFailed) as err:
        _round(_inputs(5, 4, 16), cfg)
    assert err.value.__cause__ is None and err.value.__suppress_context__


def test_a_reconstructed_seed_that_is_not_the_clients_seed_aborts(monkeypatch):
    real = shamir.reconstruct
    calls = []

    def wrong_seed(xs, ys, *, threshold):
        calls.append(threshold)
        out = real(xs, ys, threshold=threshold)
        return bytes([out[0] ^ 1]) + out[1:]

    monkeypatch.setattr(shamir, "reconstruct", wrong_seed)
    cfg = SecAggConfig(n_clients=5, neighbours=4, threshold=3, modulus_bits=16)
    with pytest.raises(ShareVerificationFailed):
        _round(_inputs(5, 4, 16), cfg)
    assert calls == [3]  # the first survivor's seed is checked before anything else


def test_a_reconstructed_dropped_key_whose_public_key_differs_aborts(monkeypatch):
    """Seeds reconstruct correctly; the dropped client's mask key does not match the public
    key it advertised: the server refuses it instead of removing a wrong mask."""
    real = shamir.reconstruct
    n = 6
    secrets = _secrets(n)
    seeds = {s.seed for s in secrets.values()}

    def wrong_key(xs, ys, *, threshold):
        out = real(xs, ys, threshold=threshold)
        return out if out in seeds else ClientSecrets.generate().s_sk.private_bytes_raw()

    cfg = SecAggConfig(n_clients=n, neighbours=4, threshold=3, modulus_bits=16)
    x = _inputs(n, 4, 16)
    ok = _round(x, cfg, silent={"masked_input": {2}}, secrets=secrets)
    assert ok.dropped.tolist() == [2]
    monkeypatch.setattr(shamir, "reconstruct", wrong_key)
    _round(x, cfg, secrets=secrets)  # no dropout: only seeds are reconstructed
    with pytest.raises(ShareVerificationFailed):
        _round(x, cfg, silent={"masked_input": {2}}, secrets=secrets)


# -- result ------------------------------------------------------------------------------------


def test_result_client_sets_are_int64_also_when_empty_and_name_each_stage():
    cfg = SecAggConfig(n_clients=12, neighbours=10, threshold=6, modulus_bits=20)
    x = _inputs(12, 5, 20, seed=2)
    out = _round(
        x, cfg, silent={"advertise": {0}, "share": {1}, "masked_input": {2}, "unmask": {3}}
    )
    assert out.excluded.tolist() == [0, 1]
    assert out.dropped.tolist() == [2]
    assert out.survivors.tolist() == list(range(3, 12))
    np.testing.assert_array_equal(
        out.sum, x[3:].sum(axis=0, dtype=np.uint64) & np.uint64(2**20 - 1)
    )
    full = _round(x, cfg)
    assert full.dropped.tolist() == [] and full.excluded.tolist() == []
    for res in (out, full):
        for arr in (res.survivors, res.dropped, res.excluded):
            assert arr.dtype == np.int64
        assert res.sum.dtype == np.uint64


def test_stage_times_are_non_negative_and_add_up_to_at_most_the_wall_time():
    cfg = SecAggConfig(n_clients=8, neighbours=4, threshold=3, modulus_bits=20)
    x = _inputs(8, 300, 20)
    t0 = time.perf_counter()
    out = _round(x, cfg, silent={"masked_input": {2}})
    wall = time.perf_counter() - t0
    assert list(out.seconds_per_stage) == list(STAGES)
    assert all(isinstance(s, float) and s > 0 for s in out.seconds_per_stage.values())
    assert sum(out.seconds_per_stage.values()) <= wall
    assert list(out.bytes_per_stage) == list(STAGES)


# -- masked inputs against the protocol written out ----------------------------------------------


def _expected_masked_inputs(x, cfg, secrets, u2, u3, round_index=3):
    """``y_u = x_u + PRG(b_u) + sum_{v > u} PRG(s_uv) - sum_{v < u} PRG(s_uv)`` over the
    neighbours ``v`` in U2 (Bonawitz et al. 2017, Sec. 4), each mask expanded from offset 0
    with the primitives, independently of the engine's chunks and threads."""
    n, dim = x.shape
    session = session_id(SEED, round_index)
    table = neighbour_table(session, n, cfg.k)
    word = wire.ring_dtype(cfg.modulus_bits)
    ex = MaskExpander(dim, word)
    ring = word.type((1 << cfg.modulus_bits) - 1)
    out = {}
    for u in sorted(u3):
        y = x[u].astype(word)
        ex.add(
            self_mask_key(secrets[u].seed, session=session, round_index=round_index, client=u), y
        )
        for v in table[u].tolist():
            if v not in u2:
                continue
            shared = secrets[u].s_sk.exchange(secrets[v].s_sk.public_key())
            key = pair_mask_key(shared, session=session, round_index=round_index, a=u, b=v)
            (ex.add if u < v else ex.sub)(key, y)
        out[u] = y & ring
    return out


@pytest.mark.parametrize("bits", [8, 20, 64])
def test_masked_inputs_and_sum_equal_the_protocol_for_any_chunks_and_threads(bits):
    """Every observed masked input equals the protocol's, for 1 to 3 mask threads (each
    starting its AES-CTR streams at its range's block) and chunks of 16 bytes to 128 KiB;
    client 0 never advertises and client 2 drops before masking, so the server removes 2's
    pairwise masks by re-expanding them from offset 0 and the sum is the survivors' sum."""
    n, dim = 8, 101  # not a multiple of any chunk: every range ends on a short chunk
    cfg = SecAggConfig(n_clients=n, neighbours=6, threshold=4, modulus_bits=bits)
    x = _inputs(n, dim, min(bits, 63), seed=bits)
    secrets = _secrets(n)
    silent = {"advertise": {0}, "masked_input": {2}}
    want = _expected_masked_inputs(x, cfg, secrets, set(range(1, n)), set(range(1, n)) - {2})
    ring = np.uint64(2**bits - 1)
    for workers, chunk_bytes in [(1, 1 << 17), (1, 80), (2, 16), (3, 48), (3, 1 << 17)]:
        got: dict[int, np.ndarray] = {}

        def observe(client, start, values, got=got):
            assert values.dtype == wire.ring_dtype(bits)
            assert values.max(initial=0) <= ring  # reduced modulo 2**bits
            row = got.setdefault(client, np.zeros(dim, dtype=values.dtype))
            row[start : start + len(values)] = values

        out = _round(
            x,
            cfg,
            silent=silent,
            secrets=secrets,
            observe=observe,
            workers=workers,
            chunk_bytes=chunk_bytes,
        )
        assert sorted(got) == sorted(want)
        for u, y in want.items():
            np.testing.assert_array_equal(got[u], y, err_msg=f"client {u}, {workers} threads")
        assert out.dropped.tolist() == [2]
        survivors = sorted(want)
        np.testing.assert_array_equal(out.sum, x[survivors].sum(axis=0, dtype=np.uint64) & ring)


# -- locality order ----------------------------------------------------------------------------


def test_locality_order_walks_to_the_neighbour_with_most_visited_neighbours_then_restarts():
    """The greedy walk on a hand-made table: from 0 (whose neighbour 7 is no member) to 1,
    the first of its tied neighbours; from 1 to 3, which has two visited neighbours, not to 4
    (listed first, one); then 4 and 2; the walk restarts at the smallest unvisited member, 5."""
    table = np.array(
        [[7, 1, 3], [4, 3, 0], [0, 3, 4], [4, 2, 0], [1, 2, 3], [6, 6, 6], [5, 5, 5], [0, 1, 2]]
    )
    members = np.array([True] * 7 + [False])
    assert locality_order(table, members) == [0, 1, 3, 4, 2, 5, 6]


def test_locality_order_follows_a_cycle_from_its_first_listed_neighbour():
    """On the cycle 0-1-2-3-4-5 both neighbours of 0 tie; the first listed (1) wins."""
    n = 6
    table = np.array([sorted([(u - 1) % n, (u + 1) % n]) for u in range(n)])
    assert locality_order(table, np.ones(n, dtype=bool)) == [0, 1, 2, 3, 4, 5]
    members = np.ones(n, dtype=bool)
    members[[0, 3]] = False
    assert locality_order(table, members) == [1, 2, 4, 5]


def test_fewer_than_t_masked_inputs_abort_at_masked_input_with_the_exact_message():
    cfg = SecAggConfig(n_clients=5, neighbours=4, threshold=3, modulus_bits=16)
    with pytest.raises(RoundAborted) as err:
        _round(_inputs(5, 4, 16), cfg, silent={"masked_input": {0, 1, 2}})
    assert str(err.value) == _abort_message("sent masked inputs", 2, 3)


def test_stages_missing_from_silent_mean_nobody_goes_silent_there():
    cfg = SecAggConfig(n_clients=6, neighbours=4, threshold=3, modulus_bits=16)
    x = _inputs(6, 3, 16)
    kw = {"config": cfg, "bits": 16, "round_index": 3, "public_seed": SEED}
    out = batched_round(x, silent={}, **kw)
    assert out.survivors.tolist() == list(range(6))
    out = batched_round(x, silent={"masked_input": frozenset({1})}, **kw)
    assert out.survivors.tolist() == [0, 2, 3, 4, 5] and out.dropped.tolist() == [1]
    want = x[[0, 2, 3, 4, 5]].sum(axis=0, dtype=np.uint64) & np.uint64(0xFFFF)
    np.testing.assert_array_equal(out.sum, want)


def test_masks_are_expanded_in_the_callers_thread_by_default():
    """``workers`` defaults to 1: no mask thread is started (``observe`` need not be
    thread-safe unless the caller asks for threads)."""
    cfg = SecAggConfig(n_clients=5, neighbours=4, threshold=3, modulus_bits=64)
    seen = set()
    batched_round(
        _inputs(5, 64, 63),
        config=cfg,
        bits=64,
        round_index=3,
        public_seed=SEED,
        silent={},
        observe=lambda *_: seen.add(threading.get_ident()),
        chunk_bytes=16,
    )
    assert seen == {threading.get_ident()}


def test_share_boxes_are_the_protocols_boxes_and_carry_shares_of_both_secrets(monkeypatch):
    """Every box is sealed under the pair's key from ``share_box_keys`` (salt: the session)
    with the associated data binding session, round, sender and receiver, and its plaintext
    holds the sender's shares at the receiver's point: any ``t`` of them reconstruct the
    sender's self-mask seed and mask key. The engine opens its own boxes, so nothing else
    shows whether they were sealed under the right key and associated data."""
    sealed = []
    real_seal = batched_mod.seal

    def spy(key, plaintext, ad):
        box = real_seal(key, plaintext, ad)
        sealed.append((box, ad))
        return box

    monkeypatch.setattr(batched_mod, "seal", spy)
    n, t, round_index = 6, 3, 3
    cfg = SecAggConfig(n_clients=n, neighbours=4, threshold=t, modulus_bits=16)
    secrets = _secrets(n)
    _round(_inputs(n, 4, 16), cfg, silent={"advertise": {5}}, secrets=secrets)
    session = session_id(SEED, round_index)
    env = wire.Envelope(session=session, round_index=round_index)
    table = neighbour_table(session, n, cfg.k)
    pairs = {(u, v) for u in range(5) for v in table[u].tolist() if v < 5}
    assert len(sealed) == len(pairs)
    got: dict[int, dict[int, tuple[bytes, bytes]]] = {u: {} for u in range(5)}
    for box, ad in sealed:
        src, dst = next((u, v) for u, v in pairs if ad == wire.share_associated_data(env, u, v))
        lo, hi = min(src, dst), max(src, dst)
        shared = secrets[lo].c_sk.exchange(secrets[hi].c_sk.public_key())
        k_up, k_down = share_box_keys(shared, session=session, round_index=round_index, a=lo, b=hi)
        plain = open_sealed(k_up if src == lo else k_down, box, ad)
        got[src][dst] = wire.unpack_share_plaintext(plain, sender=src, receiver=dst)
    for u in range(5):
        assert sorted(got[u]) == sorted(v for v in table[u].tolist() if v < 5)
        xs = sorted(got[u])[:t]
        for part, want in ((0, secrets[u].seed), (1, secrets[u].s_sk.private_bytes_raw())):
            ys = [shamir.share_from_bytes(got[u][v][part]) for v in xs]
            assert shamir.reconstruct([v + 1 for v in xs], ys, threshold=t) == want


def test_locality_order_walks_to_a_neighbour_seen_once_before_restarting():
    """0 -> 2 -> 1 along single edges (each next client has one visited neighbour); a walk
    that only followed neighbours seen twice would restart instead and give 0, 1, 2."""
    table = np.array([[2], [0], [1]])
    assert locality_order(table, np.ones(3, dtype=bool)) == [0, 2, 1]
