"""X25519 agreements in bulk (protocols/secagg/agreement.py): the helper process's part of a
batch gives the same secrets as the calling thread would, every failure falls back to the
in-process computation, and a batched SecAgg+ round is unchanged by it."""

from __future__ import annotations

import os

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from test_secagg_engines import _batched  # tests/ is on sys.path under pytest

from protocols.secagg import DropoutSchedule, SecAggConfig
from protocols.secagg import agreement as ag
from protocols.secagg.batched import STAGES, ClientSecrets


@pytest.fixture
def forced(monkeypatch):
    """The helper on for any batch of two pairs or more, as on a two-core machine; the
    helper's requests recorded (pairs sent)."""
    monkeypatch.setattr(ag, "MIN_PAIRS", 2)
    monkeypatch.setattr(ag, "usable_cores", lambda: 2)
    monkeypatch.setattr(ag, "_broken", False)
    sent: list[int] = []
    request = ag._Helper.request

    def spy(self, private, public):
        sent.append(len(private))
        return request(self, private, public)

    monkeypatch.setattr(ag._Helper, "request", spy)
    return sent


def _batch(n_keys, n_pairs, seed=0):
    keys = [X25519PrivateKey.generate() for _ in range(n_keys)]
    pubs = [k.public_key() for k in keys]
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n_keys, size=(n_pairs, 2)).tolist()
    return [keys[a] for a, _ in idx], [pubs[b] for _, b in idx]


@pytest.mark.parametrize("n_pairs", [2, 3, 64, 501])
def test_the_helper_computes_the_tail_and_the_secrets_are_exchange_s(forced, n_pairs):
    private, public = _batch(40, n_pairs)
    want = [sk.exchange(pk) for sk, pk in zip(private, public, strict=True)]
    assert ag.exchange_many(private, public) == want
    assert forced == [int(n_pairs * ag.HELPER_SHARE)]  # the helper took its share, once


def test_small_batches_and_one_core_stay_in_process(monkeypatch):
    private, public = _batch(10, 100)
    want = [sk.exchange(pk) for sk, pk in zip(private, public, strict=True)]
    called = []
    monkeypatch.setattr(ag, "_get_helper", lambda: called.append(1))
    monkeypatch.setattr(ag, "MIN_PAIRS", 101)
    monkeypatch.setattr(ag, "usable_cores", lambda: 2)
    assert ag.exchange_many(private, public) == want
    monkeypatch.setattr(ag, "MIN_PAIRS", 2)
    monkeypatch.setattr(ag, "usable_cores", lambda: 1)
    assert ag.exchange_many(private, public) == want
    assert called == []


def test_a_dead_helper_is_replaced_by_the_calling_thread(forced, monkeypatch):
    private, public = _batch(20, 300)
    want = [sk.exchange(pk) for sk, pk in zip(private, public, strict=True)]
    assert ag.exchange_many(private, public) == want
    assert ag._helper is not None
    ag._helper.proc.kill()
    ag._helper.proc.wait()
    monkeypatch.setattr(ag._Helper, "__init__", _no_start)  # and it cannot be restarted
    monkeypatch.setattr(ag, "_helper", None)
    assert ag.exchange_many(private, public) == want
    assert ag._broken  # later batches do not try again


def _no_start(self):
    raise OSError("no processes here")


def test_a_helper_that_dies_mid_batch_falls_back(forced, monkeypatch):
    private, public = _batch(20, 300)
    want = [sk.exchange(pk) for sk, pk in zip(private, public, strict=True)]
    ag.exchange_many(private, public)  # started
    request = ag._Helper.request

    def die_after_request(self, priv, pub):
        out = request(self, priv, pub)
        self.proc.kill()
        self.proc.wait()
        return out

    monkeypatch.setattr(ag._Helper, "request", die_after_request)
    assert ag.exchange_many(private, public) == want
    assert ag._broken and ag._helper is None


@pytest.mark.parametrize("where", ["head", "tail"])
def test_a_low_order_public_key_raises_as_exchange_does(forced, where):
    private, public = _batch(10, 50)
    public = list(public)
    bad = X25519PublicKey.from_public_bytes(bytes(32))
    with pytest.raises(ValueError) as want:
        private[0].exchange(bad)
    public[0 if where == "head" else -1] = bad
    with pytest.raises(ValueError) as got:
        ag.exchange_many(private, public)
    assert str(got.value) == str(want.value)


def test_lengths_must_match():
    private, public = _batch(3, 4)
    with pytest.raises(ValueError, match="same length, got 4 and 3"):
        ag.exchange_many(private, public[:3])


def test_the_helper_is_outside_the_terminal_s_process_group_and_exits_on_eof(forced):
    private, public = _batch(20, 100)
    ag.exchange_many(private, public)
    helper = ag._helper
    assert helper is not None
    assert os.getsid(helper.proc.pid) != os.getsid(0)  # Ctrl-C does not reach it
    helper.proc.stdin.close()  # what the parent's exit does
    assert helper.proc.wait(timeout=5) == 0


def test_a_forked_child_starts_its_own_helper(forced):
    private, public = _batch(20, 100)
    ag.exchange_many(private, public)
    parent = ag._helper
    assert parent is not None
    parent.pid = -1  # as a forked child sees its parent's helper
    ag.exchange_many(private, public)
    assert ag._helper is not parent and ag._helper.pid != -1
    parent.close()


@pytest.mark.parametrize("silent", [{}, {"masked_input": {3, 17}, "unmask": {8}}])
def test_a_batched_round_is_the_same_with_the_helper(forced, monkeypatch, silent):
    """Same secrets, helper on and off: the same masked inputs, sum and client sets (the
    engine without the helper is checked against the stage machines in test_secagg_engines)."""
    n, dim, bits = 40, 37, 20
    cfg = SecAggConfig(n_clients=n, neighbours=10, threshold=6, modulus_bits=bits)
    x = np.random.default_rng(1).integers(0, 1 << bits, size=(n, dim), dtype=np.uint64)
    secrets = {u: ClientSecrets.generate() for u in range(n)}
    sched = DropoutSchedule(**{name: set(silent.get(name, ())) for name in STAGES})
    masked_on, on = _batched(x, cfg, 5, sched, secrets, chunk_bytes=256, workers=2)
    assert len(forced) == 2  # share-box keys and mask keys
    monkeypatch.setattr(ag, "MIN_PAIRS", 10**9)
    masked_off, off = _batched(x, cfg, 5, sched, secrets, chunk_bytes=256, workers=2)
    assert len(forced) == 2
    assert sorted(masked_on) == sorted(masked_off)
    for u, y in masked_off.items():
        np.testing.assert_array_equal(masked_on[u], y)
    np.testing.assert_array_equal(on.sum, off.sum)
    assert on.survivors.tolist() == off.survivors.tolist()
    assert on.dropped.tolist() == off.dropped.tolist()
    plain = x[on.survivors].sum(axis=0, dtype=np.uint64) & np.uint64((1 << bits) - 1)
    np.testing.assert_array_equal(on.sum, plain)
