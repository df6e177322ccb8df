"""The Shamir threshold is above a majority of every neighbourhood (2t > k).

A server that lies about dropouts tells some neighbours of client ``u`` that ``u`` survived
(they reveal shares of its self-mask seed) and the others that ``u`` dropped (they reveal
shares of its mask key). With ``t`` shares of each it removes both masks from ``u``'s masked
input. Each honest client reveals one share of ``u``, so this needs ``2t`` neighbours: a
majority threshold rules it out, and the config must never resolve or accept less.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from protocols.errors import ConfigError
from protocols.secagg import SecAggClient, SecAggConfig, SecAggServer, shamir, wire
from protocols.secagg.client import exchange
from protocols.secagg.config import choose_graph_parameters, majority
from protocols.secagg.primitives import MaskExpander, pair_mask_key, self_mask_key, session_id

SEED = b"equivocation-0001"
N, D, BITS, ROUND = 8, 16, 16, 3


def _equivocation_attack(cfg: SecAggConfig, told_survived: set[int]) -> np.ndarray | None:
    """Run one round with honest clients and a lying server that targets client 0.

    Clients in ``told_survived`` hear that 0 survived, the other neighbours that 0 dropped;
    every request passes the clients' own checks. Returns the server's reconstruction of
    client 0's input, or None when it cannot even rebuild a key matching 0's public key.
    """
    kw = {"config": cfg, "round_index": ROUND, "public_seed": SEED, "dim": D}
    clients = [SecAggClient(i, **kw) for i in range(N)]
    server = SecAggServer(**kw)
    env = wire.Envelope(session=session_id(SEED, ROUND), round_index=ROUND)
    adverts = {i: c.advertise() for i, c in enumerate(clients)}
    for i, m in adverts.items():
        server.receive_advertise(i, m)
    for i, m in server.finish_advertise().items():
        server.receive_shares(i, clients[i].share_keys(m))
    forward = server.finish_shares()
    x = np.random.default_rng(0).integers(0, 1 << BITS, size=(N, D), dtype=np.uint64)
    y0 = wire.decode_masked_input(
        env, clients[0].masked_input(forward[0], x[0]), sender=0, bits=BITS, dim=D
    )
    b_points, sk_points = [], []
    for v in range(1, N):
        others = [j for j in range(N) if j != v]
        surv = others if v in told_survived else [j for j in others if j != 0]
        drop = [] if v in told_survived else [0]
        clients[v].masked_input(forward[v], x[v])
        reply = clients[v].unmask(wire.encode_unmask_request(env, v, N, surv, drop))
        for owner, kind, share in wire.decode_unmask_shares(env, reply, sender=v, n_clients=N):
            if owner == 0:
                points = b_points if kind is wire.ShareKind.SELF_MASK_SEED else sk_points
                points.append((v + 1, shamir.share_from_bytes(share)))
    b0 = shamir.combine(*zip(*b_points, strict=True))
    sk0 = X25519PrivateKey.from_private_bytes(shamir.combine(*zip(*sk_points, strict=True)))
    pks = {i: wire.decode_advertise(env, m, sender=i) for i, m in adverts.items()}
    if sk0.public_key().public_bytes_raw() != pks[0][1]:
        return None
    session = session_id(SEED, ROUND)
    ex = MaskExpander(D, wire.ring_dtype(BITS))
    acc = y0.copy()
    ex.sub(self_mask_key(b0, session=session, round_index=ROUND, client=0), acc)
    for v in range(1, N):  # client 0 added +PRG(s_0v) for every v > 0
        shared = exchange(sk0, pks[v][1])
        ex.sub(pair_mask_key(shared, session=session, round_index=ROUND, a=0, b=v), acc)
    recovered = acc.astype(np.uint64) & np.uint64((1 << BITS) - 1)
    return recovered if np.array_equal(recovered, x[0]) else None


def test_below_majority_threshold_lets_an_equivocating_server_unmask_one_input():
    """Positive control: t = 3 of k = 7 (what an unchecked explicit threshold allowed)."""
    cfg = SecAggConfig(n_clients=N, neighbours=N - 1, threshold=4, modulus_bits=BITS)
    weak = dataclasses.replace(cfg)  # a fresh copy, then force the old, unchecked threshold
    object.__setattr__(weak, "t", 3)
    assert _equivocation_attack(weak, told_survived={1, 2, 3}) is not None


@pytest.mark.parametrize("told_survived", [{1, 2, 3}, {1, 2, 3, 4}])
def test_majority_threshold_defeats_the_equivocating_server(told_survived):
    cfg = SecAggConfig(n_clients=N, neighbours=N - 1, modulus_bits=BITS)
    assert cfg.t == 4 and 2 * cfg.t > cfg.k
    assert _equivocation_attack(cfg, told_survived) is None


@pytest.mark.parametrize(("n", "k", "t"), [(8, 7, 3), (40, 10, 5), (40, 4, 2), (3, 2, 1)])
def test_explicit_threshold_at_or_below_half_is_refused(n, k, t):
    with pytest.raises(ConfigError, match=rf"t={t} .* k={k} .*2t > k.*threshold >= {majority(k)}"):
        SecAggConfig(n_clients=n, neighbours=k, threshold=t, dropout_tolerance=0.0)


@pytest.mark.parametrize("t", [0, -1, 11, True, 5.5])
def test_explicit_threshold_outside_1_to_k_is_refused(t):
    with pytest.raises(ConfigError, match=r"threshold must be an int in \[1, k=10\]"):
        SecAggConfig(n_clients=40, neighbours=10, threshold=t, dropout_tolerance=0.0)


def test_explicit_majority_thresholds_are_accepted_up_to_k():
    for t in (6, 10):
        cfg = SecAggConfig(n_clients=40, neighbours=10, threshold=t, dropout_tolerance=0.0)
        assert (cfg.k, cfg.t) == (10, t)
    # On the complete graph of 3 clients (k = 2) only t = 2 is a majority.
    assert SecAggConfig(n_clients=3, dropout_tolerance=0.0).t == 2


def test_issue_case_n94_dropout_30_percent_now_resolves_to_a_majority():
    cfg = SecAggConfig(n_clients=94, dropout_tolerance=0.3)
    assert (cfg.k, cfg.t) != (28, 8)  # what the old chooser returned
    assert 2 * cfg.t > cfg.k
    g = cfg.guarantee()
    assert g.correctness_log2 <= -cfg.correctness_bits
    assert g.share_secrecy_log2 <= -cfg.security_bits
    assert g.connectivity_log2 <= -cfg.security_bits


@pytest.mark.parametrize("dropout", [0.05, 0.1, 0.15, 0.2, 0.25, 0.3])
def test_chosen_thresholds_are_majorities_that_meet_their_bounds(dropout):
    """A sample of the issue's grid (n in 4..399); the old chooser failed 2t > k on most."""
    for n in range(4, 400, 13):
        try:
            cfg = SecAggConfig(n_clients=n, dropout_tolerance=dropout)
        except ConfigError as err:  # only tiny cohorts cannot keep a majority
            assert n < 10 and "majority" in str(err)
            continue
        assert 2 * cfg.t > cfg.k >= 2, (n, dropout, cfg.k, cfg.t)
        g = cfg.guarantee()
        assert g.correctness_log2 <= -cfg.correctness_bits, (n, dropout)
        assert g.share_secrecy_log2 <= -cfg.security_bits, (n, dropout)


def test_chooser_takes_the_smallest_degree_that_keeps_a_correct_majority():
    n, delta, gamma = 943, 0.05, 0.0
    k, t = choose_graph_parameters(n, dropout_tolerance=delta, corrupt_fraction=gamma)
    assert (k, t) == (22, 12)
    # Two fewer neighbours cannot keep a majority correct: the explicit config says so.
    with pytest.raises(ConfigError, match=r"neighbours=20 .* use neighbours >= 22"):
        SecAggConfig(n_clients=n, neighbours=k - 2, dropout_tolerance=delta, corrupt_fraction=0)
    ok = SecAggConfig(n_clients=n, neighbours=k, dropout_tolerance=delta, corrupt_fraction=0)
    assert ok.t == t


def test_explicit_neighbours_too_few_for_the_dropouts_is_one_clear_error():
    with pytest.raises(ConfigError) as info:
        SecAggConfig(n_clients=943, neighbours=10, dropout_tolerance=0.05)
    msg = str(info.value)
    assert "\n" not in msg
    assert "neighbours=10" in msg and "dropout_tolerance=0.05" in msg and "48 of 943" in msg
    assert "use neighbours >= " in msg


def test_dropouts_of_half_the_cohort_cannot_keep_a_majority_anywhere():
    with pytest.raises(ConfigError, match="majority"):
        SecAggConfig(n_clients=50, dropout_tolerance=0.5)
    with pytest.raises(ConfigError, match="even the complete graph"):
        SecAggConfig(n_clients=50, neighbours=10, dropout_tolerance=0.5)
