"""Tests written for surviving mutants of the second mutation run over ``protocols/``
(docs/mutation.md, "Second run"): each pins a behaviour that a mutant changed without
failing any earlier test.

Secure aggregation: the client's checks and their messages, the duplicate-key check of the
KEYS message, the share boxes opened by an independent peer (HKDF salt = session id), the
shared :class:`MaskExpander`, the secrets' absence after their stage, and the server's
counterparts. DP: the mechanisms' and the ledger's exact bounds, events and messages.
"""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
import torch
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from test_secagg_breaks import masked_round  # tests/ is on sys.path under pytest

from protocols.dp.accounting import gaussian_epsilon, rdp_orders, rdp_to_epsilon
from protocols.dp.ledger import PrivacyEvent, PrivacyLedger
from protocols.dp.mechanisms import (
    CentralGaussian,
    DistributedDiscreteGaussian,
    DistributedGaussian,
    calibrate_distributed_noise_multiplier,
    conditional_randomized_round,
    distributed_epsilon,
    distributed_noise_plan,
)
from protocols.errors import ConfigError, DataError, IntegrityError, PrivacyBudgetError
from protocols.secagg import (
    ClientAborted,
    RoundAborted,
    SecAggClient,
    SecAggConfig,
    SecAggServer,
    Stage,
    shamir,
    wire,
)
from protocols.secagg.primitives import MaskExpander, open_sealed, session_id, share_box_keys

SEED = b"public-seed-mutants"
N, D, BITS = 6, 5, 20
CFG = SecAggConfig(n_clients=N, neighbours=N - 1, threshold=3, modulus_bits=BITS)
KW = {"config": CFG, "round_index": 1, "public_seed": SEED, "dim": D}


def _env(round_index: int = 1) -> wire.Envelope:
    return wire.Envelope(session=session_id(SEED, round_index), round_index=round_index)


def _exact(message: str) -> str:
    """A ``pytest.raises(match=...)`` pattern for exactly ``message``."""
    return "^" + re.escape(message) + "$"


def _masked_clients(dropped: frozenset[int] = frozenset({5})):
    """Clients after masking (the dropped ones never masked)."""
    return masked_round(KW, dropped)


def _peer_keys(ids):
    """Fresh key pairs for test-played neighbours: ``{id: (c_sk, s_sk)}``."""
    return {j: (X25519PrivateKey.generate(), X25519PrivateKey.generate()) for j in ids}


def _keys_message(receiver: int, peers) -> bytes:
    return wire.encode_keys(
        _env(),
        receiver,
        [
            (j, c.public_key().public_bytes_raw(), s.public_key().public_bytes_raw())
            for j, (c, s) in sorted(peers.items())
        ],
    )


# -- secagg client -----------------------------------------------------------------------------


def test_missing_modulus_message_is_exact():
    cfg = SecAggConfig(n_clients=N, neighbours=N - 1, threshold=3)
    with pytest.raises(
        ConfigError,
        match=_exact("SecAggConfig.modulus_bits is None; set it to FixedPointCodec.modulus_bits"),
    ):
        SecAggClient(0, **{**KW, "config": cfg})


@pytest.mark.parametrize("cid", [-1, N, N + 1])
def test_client_id_outside_the_cohort_is_refused_with_its_range(cid):
    with pytest.raises(ConfigError, match=_exact(f"client_id must be in [0, {N}), got {cid!r}")):
        SecAggClient(cid, **KW)


@pytest.mark.parametrize(
    ("dim", "dtype"),
    [(D + 1, np.dtype("<u4")), (D, np.dtype("<u8")), (D + 1, np.dtype("<u8"))],
)
def test_an_expander_of_the_wrong_dim_or_dtype_is_refused(dim, dtype):
    """BITS=20 needs 4-byte words: a wrong dim alone, a wrong dtype alone, or both."""
    ex = MaskExpander(dim, dtype)
    msg = _exact(f"expander must have dim {D} and dtype uint32, got {dim} and {ex.dtype}")
    with pytest.raises(ConfigError, match=msg):
        SecAggClient(0, **KW, expander=ex)
    with pytest.raises(ConfigError, match=_exact(f"expander must have dim {D} and dtype uint32")):
        SecAggServer(**KW, expander=ex)


class _CountingExpander(MaskExpander):
    def __init__(self, dim, dtype):
        super().__init__(dim, dtype)
        self.calls = 0

    def expand(self, key):
        self.calls += 1
        return super().expand(key)


def test_a_passed_expander_is_the_one_used_by_client_and_server():
    """The shared expander is what saves the allocations; a fresh one per party would not."""
    ex = _CountingExpander(D, wire.ring_dtype(BITS))
    clients = [SecAggClient(i, **KW, expander=ex) for i in range(N)]
    server = SecAggServer(**KW, expander=ex)
    for i, c in enumerate(clients):
        server.receive_advertise(i, c.advertise())
    for i, m in server.finish_advertise().items():
        server.receive_shares(i, clients[i].share_keys(m))
    x = np.arange(D, dtype=np.uint64)
    for i, m in server.finish_shares().items():
        if i != 5:
            server.receive_masked_input(i, clients[i].masked_input(m, x))
    after_clients = ex.calls
    assert after_clients == 5 * (1 + 5)  # each survivor: its self mask and 5 pair masks
    for i, m in server.finish_masked_input().items():
        server.receive_unmask_shares(i, clients[i].unmask(m))
    total = server.finish_unmask()
    assert ex.calls == after_clients + 5 + 5  # 5 self masks, dropped 5 paired with 0..4
    np.testing.assert_array_equal(total, 5 * x)


def test_keys_message_repeating_a_neighbour_key_is_rejected():
    """Two neighbours advertising one key (or one neighbour's c_pk == s_pk) is refused."""
    c = SecAggClient(0, **KW)
    c.advertise()
    peers = _peer_keys(range(1, N))
    entries = [
        (j, cs.public_key().public_bytes_raw(), ss.public_key().public_bytes_raw())
        for j, (cs, ss) in sorted(peers.items())
    ]
    entries[1] = (entries[1][0], entries[0][1], entries[1][2])  # 2 reuses 1's c_pk
    with pytest.raises(IntegrityError):
        c.share_keys(wire.encode_keys(_env(), 0, entries))
    assert c.stage is Stage.ABORTED

    c = SecAggClient(0, **KW)
    c.advertise()
    entries[1] = (entries[1][0], entries[1][2], entries[1][2])  # 2's c_pk == its s_pk
    with pytest.raises(IntegrityError):
        c.share_keys(wire.encode_keys(_env(), 0, entries))


@pytest.mark.parametrize("which", [0, 1])
def test_keys_message_reflecting_the_clients_own_key_is_rejected(which):
    """A server that hands a client its own public key as a neighbour's is refused."""
    c = SecAggClient(0, **KW)
    own = wire.decode_advertise(_env(), c.advertise(), sender=0)
    peers = _peer_keys(range(1, N))
    entries = [
        (j, cs.public_key().public_bytes_raw(), ss.public_key().public_bytes_raw())
        for j, (cs, ss) in sorted(peers.items())
    ]
    entries[2] = (entries[2][0], own[which], entries[2][2])
    with pytest.raises(IntegrityError):
        c.share_keys(wire.encode_keys(_env(), 0, entries))


def test_share_boxes_open_for_an_independent_peer_and_carry_consistent_shares():
    """The test plays every neighbour of client 0 with its own keys and derives the box keys
    itself (X25519, HKDF salted with the session id): each box opens, and the shares
    reconstruct client 0's advertised ``s`` key and one self-mask seed."""
    c = SecAggClient(0, **KW)
    c_pk0, s_pk0 = wire.decode_advertise(_env(), c.advertise(), sender=0)
    peers = _peer_keys(range(1, N))
    boxes = wire.decode_shares(_env(), c.share_keys(_keys_message(0, peers)), sender=0, n_clients=N)
    assert [j for j, _ in boxes] == [1, 2, 3, 4, 5]
    b_ys, sk_ys = [], []
    for j, ct in boxes:
        shared = peers[j][0].exchange(X25519PublicKey.from_public_bytes(c_pk0))
        _, k_in = share_box_keys(shared, session=session_id(SEED, 1), round_index=1, a=j, b=0)
        plain = open_sealed(k_in, ct, wire.share_associated_data(_env(), 0, j))
        b_share, sk_share = wire.unpack_share_plaintext(plain, sender=0, receiver=j)
        b_ys.append(shamir.share_from_bytes(b_share))
        sk_ys.append(shamir.share_from_bytes(sk_share))
    xs = [j + 1 for j, _ in boxes]
    sk = shamir.reconstruct(xs, sk_ys, threshold=CFG.t)  # all 5 on one polynomial
    assert X25519PrivateKey.from_private_bytes(sk).public_key().public_bytes_raw() == s_pk0
    shamir.reconstruct(xs, b_ys, threshold=CFG.t)


@pytest.mark.parametrize(
    "x",
    [
        np.zeros(D, np.int64),
        np.zeros(D, np.float64),
        np.zeros(D + 1, np.uint64),
        np.zeros((1, D), np.uint64),
    ],
)
def test_masked_input_refuses_a_wrong_dtype_or_a_wrong_shape(x):
    with pytest.raises(ConfigError, match=_exact(f"x must be a uint64 array of shape ({D},)")):
        SecAggClient(0, **KW).masked_input(b"", x)


def test_masked_input_refuses_an_unreduced_value_with_the_modulus():
    x = np.zeros(D, np.uint64)
    x[2] = 1 << BITS
    with pytest.raises(ConfigError, match=_exact(f"x must be reduced modulo 2**{BITS}")):
        SecAggClient(0, **KW).masked_input(b"", x)


def test_too_few_advertised_neighbours_message_is_exact():
    c = SecAggClient(0, **KW)
    c.advertise()
    with pytest.raises(
        ClientAborted,
        match=_exact("only 2 neighbours advertised keys, fewer than the threshold t=3"),
    ):
        c.share_keys(_keys_message(0, _peer_keys([1, 2])))


def test_too_few_forwarded_shares_message_is_exact():
    c = SecAggClient(0, **KW)
    c.advertise()
    c.share_keys(_keys_message(0, _peer_keys(range(1, N))))
    with pytest.raises(
        ClientAborted,
        match=_exact("only 0 neighbours completed key sharing, fewer than the threshold t=3"),
    ):
        c.masked_input(wire.encode_forward(_env(), 0, []), np.zeros(D, np.uint64))


def _request(total, surv, drop, receiver=0):
    return wire.encode_unmask_request(_env(), receiver, total, surv, drop)


@pytest.mark.parametrize(
    ("total", "surv", "drop", "message"),
    [
        (N, [1, 2, 3, 4], [1, 5], "unmask request names a client both survivor and dropped"),
        (N, [1, 2, 3, 4], [5], None),  # control: answered
        (N, [], [1, 2, 3, 4, 5], None),  # control: everyone dropped is a valid request
        (3, [1, 2], [3, 4, 5], None),  # exactly t survivors is enough
        (2, [1], [2, 3, 4, 5], "unmask request names 2 survivors, fewer than t=3"),
        (4, [1, 2, 3, 4], [5], "unmask request's survivor count is inconsistent"),
        (
            N,
            [1, 2, 3],
            [5],
            "unmask request does not classify exactly the neighbours this client masked with",
        ),
    ],
)
def test_unmask_request_checks_and_their_exact_messages(total, surv, drop, message):
    clients, _ = _masked_clients()
    if message is None:
        reply = clients[0].unmask(_request(total, surv, drop))
        shares = wire.decode_unmask_shares(_env(), reply, sender=0, n_clients=N)
        assert [(o, k) for o, k, _ in shares] == [
            (o, wire.ShareKind.SELF_MASK_SEED if o in surv else wire.ShareKind.MASK_KEY)
            for o in range(1, N)
        ]
    else:
        with pytest.raises(ClientAborted, match=_exact(message)):
            clients[0].unmask(_request(total, surv, drop))


@pytest.mark.parametrize("where", ["surv", "drop"])
def test_unmask_request_naming_the_client_itself_on_one_side_is_refused_as_such(where):
    """Listing the client once, as survivor or as dropped, is refused by the self check
    (not only later by the classification check)."""
    kw = {"config": SecAggConfig(n_clients=N, neighbours=2, threshold=2, modulus_bits=BITS)}
    clients = [SecAggClient(i, **{**KW, **kw}) for i in range(N)]
    server = SecAggServer(**{**KW, **kw})
    for i, c in enumerate(clients):
        server.receive_advertise(i, c.advertise())
    for i, m in server.finish_advertise().items():
        server.receive_shares(i, clients[i].share_keys(m))
    for i, m in server.finish_shares().items():
        server.receive_masked_input(i, clients[i].masked_input(m, np.zeros(D, np.uint64)))
    u = 0
    nbrs = sorted(clients[u].neighbours)
    others = sorted(set(range(N)) - {u, *nbrs})
    surv, drop = list(nbrs), [others[0]]
    if where == "surv":
        surv = sorted([*nbrs, u])
        drop = []
    else:
        drop = [u]
    with pytest.raises(
        ClientAborted, match=_exact("unmask request lists this client among its neighbours")
    ):
        clients[u].unmask(_request(N, surv, drop, receiver=u))


def test_a_client_forced_past_its_stages_has_no_secrets_to_reveal():
    """The stage machine's guard: a fresh client whose ``stage`` is set by hand to MASKED
    holds no shares, so even an empty, otherwise valid request is refused."""
    c = SecAggClient(0, **KW)
    c.stage = Stage.MASKED
    with pytest.raises(IntegrityError):
        c.unmask(_request(CFG.t, [], []))
    assert c.stage is Stage.ABORTED


def test_a_client_forced_to_share_without_advertising_has_no_keys():
    c = SecAggClient(0, **KW)
    c.stage = Stage.ADVERTISED
    with pytest.raises(IntegrityError):
        c.share_keys(_keys_message(0, _peer_keys(range(1, N))))


def test_the_share_box_key_is_gone_after_its_stage():
    """``c_sk`` only serves the share boxes: sent once, a forced second round 1 fails."""
    c = SecAggClient(0, **KW)
    c.advertise()
    msg = _keys_message(0, _peer_keys(range(1, N)))
    c.share_keys(msg)
    c.stage = Stage.ADVERTISED
    with pytest.raises(IntegrityError):
        c.share_keys(msg)


# -- secagg server -----------------------------------------------------------------------------


def _aborted(count: int, what: str) -> str:
    return _exact(
        f"only {count} clients {what}, fewer than the threshold t=3; "
        "the round is aborted and reveals nothing"
    )


def test_a_fresh_server_has_empty_client_sets():
    server = SecAggServer(**KW)
    assert server.u1 == server.u2 == server.u3 == server.dropped == frozenset()
    assert server.stage is Stage.INIT


@pytest.mark.parametrize("stage", ["advertise", "share", "masked_input"])
def test_server_aborts_below_t_at_each_stage_with_the_stage_named(stage):
    clients = [SecAggClient(i, **KW) for i in range(N)]
    server = SecAggServer(**KW)
    few = [0, 1]
    for i, c in enumerate(clients):
        if stage != "advertise" or i in few:
            server.receive_advertise(i, c.advertise())
    if stage == "advertise":
        with pytest.raises(RoundAborted, match=_aborted(2, "advertised keys")):
            server.finish_advertise()
    else:
        for i, m in server.finish_advertise().items():
            share = clients[i].share_keys(m)
            if stage != "share" or i in few:
                server.receive_shares(i, share)
        if stage == "share":
            with pytest.raises(RoundAborted, match=_aborted(2, "shared keys")):
                server.finish_shares()
        else:
            for i, m in server.finish_shares().items():
                if i in few:
                    server.receive_masked_input(
                        i, clients[i].masked_input(m, np.zeros(D, np.uint64))
                    )
            with pytest.raises(RoundAborted, match=_aborted(2, "sent masked inputs")):
                server.finish_masked_input()
    assert server.stage is Stage.ABORTED


def _server_until_masked(dropped=frozenset({5})):
    clients, server = _masked_clients(dropped)
    return clients, server, server.finish_masked_input()


def test_too_few_unmask_replies_abort_with_the_owner_named():
    clients, server, requests = _server_until_masked(frozenset())
    for i in (1, 2):
        server.receive_unmask_shares(i, clients[i].unmask(requests[i]))
    with pytest.raises(
        RoundAborted,
        match=_exact(
            "client 0 has 2 revealed shares, fewer than t=3; "
            "the round is aborted and reveals nothing"
        ),
    ):
        server.finish_unmask()
    assert server.stage is Stage.ABORTED


def test_a_finished_round_is_done():
    clients, server, requests = _server_until_masked()
    for i, m in requests.items():
        server.receive_unmask_shares(i, clients[i].unmask(m))
    server.finish_unmask()
    assert server.stage is Stage.DONE
    with pytest.raises(IntegrityError):
        server.finish_unmask()


def test_server_refuses_a_second_masked_input_and_one_from_outside_u2():
    """A repeated masked input would be added to the sum twice."""
    clients = [SecAggClient(i, **KW) for i in range(N)]
    server = SecAggServer(**KW)
    for i, c in enumerate(clients):
        server.receive_advertise(i, c.advertise())
    keys = server.finish_advertise()
    for i, m in keys.items():
        share = clients[i].share_keys(m)
        if i != 4:  # 4 drops before sharing: not in U2
            server.receive_shares(i, share)
    fwd = server.finish_shares()
    y = clients[0].masked_input(fwd[0], np.zeros(D, np.uint64))
    server.receive_masked_input(0, y)
    with pytest.raises(IntegrityError):
        server.receive_masked_input(0, y)
    stray = wire.encode_masked_input(_env(), 4, np.zeros(D, np.uint32), BITS)
    with pytest.raises(IntegrityError):
        server.receive_masked_input(4, stray)


def test_server_refuses_a_second_unmask_reply_and_one_from_a_dropped_client():
    clients, server, requests = _server_until_masked()
    reply = clients[0].unmask(requests[0])
    server.receive_unmask_shares(0, reply)
    with pytest.raises(IntegrityError):
        server.receive_unmask_shares(0, reply)
    stray = wire.encode_unmask_shares(_env(), 5, [])
    with pytest.raises(IntegrityError):
        server.receive_unmask_shares(5, stray)


@pytest.mark.parametrize("sender", [-1, N, N + 1, 1.0, "1"])
def test_server_refuses_an_advertise_from_an_id_outside_the_cohort(sender):
    server = SecAggServer(**KW)
    pk = X25519PrivateKey.generate().public_key().public_bytes_raw()
    sk = X25519PrivateKey.generate().public_key().public_bytes_raw()
    wire_id = sender if isinstance(sender, int) and sender >= 0 else 1
    msg = wire.encode_advertise(_env(), int(wire_id), pk, sk)
    with pytest.raises(IntegrityError):
        server.receive_advertise(sender, msg)
    assert server._keys == {}


def test_server_refuses_a_second_advertise_from_one_client():
    server = SecAggServer(**KW)
    c = SecAggClient(0, **KW)
    msg = c.advertise()
    server.receive_advertise(0, msg)
    other = SecAggClient(0, **KW).advertise()
    with pytest.raises(IntegrityError):
        server.receive_advertise(0, other)
    assert server._keys[0] == wire.decode_advertise(_env(), msg, sender=0)


# -- dp mechanisms -----------------------------------------------------------------------------

_DELTA = 1e-5


def _plan(**kw):
    args = {"clip": 1.0, "noise_multiplier": 1.0, "scale": 64.0, "dim": 10, "min_survivors": 4}
    return distributed_noise_plan(**{**args, **kw})


def test_plan_rdp_names_a_bad_contributor_count():
    with pytest.raises(
        ConfigError, match=_exact("noise_contributors must be an integer >= 1, got 0")
    ):
        _plan().rdp([2.0], sample_rate=1.0, noise_contributors=0)


def test_distributed_epsilon_without_sampling_uses_the_fractional_order_grid():
    """At q = 1 the RDP curve is converted on the full grid (integer-only orders are only
    needed, and only used, under subsampling)."""
    plan = _plan()
    orders = rdp_orders(integer_only=False)
    rdp = plan.rdp(orders, sample_rate=1.0, noise_contributors=4)
    expected = rdp_to_epsilon(orders, 3 * rdp, _DELTA)
    got = distributed_epsilon(plan, sample_rate=1.0, steps=3, delta=_DELTA)
    assert got == expected
    coarse = rdp_orders(integer_only=True)
    assert got < rdp_to_epsilon(
        coarse, 3 * plan.rdp(coarse, sample_rate=1.0, noise_contributors=4), _DELTA
    )


_CAL = {"delta": _DELTA, "sample_rate": 1.0, "steps": 1, "clip": 1.0, "scale": 64.0, "dim": 10}


def test_calibration_refuses_delta_at_or_above_one_over_n_users():
    with pytest.raises(ConfigError, match="1/n"):
        calibrate_distributed_noise_multiplier(
            epsilon=5.0, **{**_CAL, "delta": 0.02}, min_survivors=4, n_users=100
        )


@pytest.mark.parametrize(("name", "bad"), [("dim", 0), ("min_survivors", 0)])
def test_calibration_names_a_bad_dim_or_survivor_count(name, bad):
    kw = {**_CAL, "min_survivors": 4, name: bad}
    with pytest.raises(ConfigError, match=_exact(f"{name} must be an integer >= 1, got {bad}")):
        calibrate_distributed_noise_multiplier(epsilon=5.0, **kw)


@pytest.mark.parametrize("beta", [0.0, 0.3])
@pytest.mark.parametrize("epsilon", [5.0, 20.0])
def test_calibration_is_tight_and_never_overshoots_at_any_rounding_beta(epsilon, beta):
    """The answer is within ``rel_tol`` (1e-3) of the smallest admissible sigma, for the
    rounding beta asked for (not the default one), also when sigma < 1."""
    kw = {**_CAL, "min_survivors": 4, "rounding_beta": beta}
    sigma = calibrate_distributed_noise_multiplier(epsilon=epsilon, **kw)
    plan_kw = {k: kw[k] for k in ("clip", "scale", "dim", "min_survivors", "rounding_beta")}
    at = distributed_noise_plan(noise_multiplier=sigma, **plan_kw)
    below = distributed_noise_plan(noise_multiplier=sigma * (1 - 2e-3), **plan_kw)
    assert distributed_epsilon(at, sample_rate=1.0, steps=1, delta=_DELTA) <= epsilon
    assert distributed_epsilon(below, sample_rate=1.0, steps=1, delta=_DELTA) > epsilon


def test_calibration_with_a_loose_budget_returns_the_smallest_admissible_sigma():
    """clip * scale = 1, d = 1, beta = 0: D2 = 2, t = 4, so the smallest sigma the plan
    accepts (share sigma 0.5) is exactly 0.5, and a budget of 1e4 admits it."""
    kw = {**_CAL, "scale": 1.0, "dim": 1, "min_survivors": 4, "rounding_beta": 0.0}
    assert calibrate_distributed_noise_multiplier(epsilon=1e4, **kw) == 0.5
    kw = {**_CAL, "scale": 3.0, "dim": 7, "min_survivors": 10}
    sigma = calibrate_distributed_noise_multiplier(epsilon=1e4, **kw)
    share = distributed_noise_plan(
        noise_multiplier=sigma, clip=1.0, scale=3.0, dim=7, min_survivors=10
    ).share_sigma
    assert share >= 0.5
    with pytest.raises(ConfigError, match="below 0.5 integer units"):
        distributed_noise_plan(
            noise_multiplier=math.nextafter(sigma, 0.0),
            clip=1.0,
            scale=3.0,
            dim=7,
            min_survivors=10,
        )


def test_calibration_gives_up_above_a_million_with_the_reason():
    with pytest.raises(
        ConfigError,
        match=_exact(
            "cannot reach epsilon=0.0001 at delta=1e-10 with 1000000 rounds: the required "
            "noise multiplier exceeds 1e6 (or discretisation dominates: raise the scale)"
        ),
    ):
        calibrate_distributed_noise_multiplier(
            epsilon=1e-4, **{**_CAL, "delta": 1e-10, "steps": 10**6}, min_survivors=4
        )


def test_effective_noise_multiplier_is_kairouz_prop_14_third_term():
    """``1 / (D2 / (sqrt(n) s) + sqrt(d) tau)``, tau written out (Kairouz et al. 2021)."""
    plan = _plan(noise_multiplier=0.14, scale=8.0, dim=16)  # share sigma ~0.6: tau matters
    s, d2, d = plan.share_sigma, plan.l2_sensitivity_after_rounding, plan.dim
    for n in (1, 4, 9):
        tau = 10 * sum(math.exp(-2 * math.pi**2 * s**2 * k / (k + 1)) for k in range(1, n))
        expected = 1.0 / (d2 / (math.sqrt(n) * s) + math.sqrt(d) * tau)
        assert plan.effective_noise_multiplier(n) == pytest.approx(expected, rel=1e-12)
    assert plan.effective_noise_multiplier(9) < 1.0 / (d2 / (3 * s))  # tau > 0 here
    with pytest.raises(
        ConfigError, match=_exact("noise_contributors must be an integer >= 1, got 0")
    ):
        plan.effective_noise_multiplier(0)


def test_ddg_mechanism_rounds_with_the_plans_scale_bound_and_source():
    plan = _plan(scale=8.0, dim=6)
    mech = DistributedDiscreteGaussian(plan=plan)
    x = torch.rand(5, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    x = x / torch.linalg.vector_norm(x, dim=1, keepdim=True)  # norm 1 = clip
    before = x.clone()
    got = mech.round_update(x, generator=torch.Generator().manual_seed(7))
    assert torch.equal(x, before)  # the caller's float64 updates are not scaled in place
    ref = conditional_randomized_round(
        x,
        scale=8.0,
        l2_bound=plan.l2_sensitivity_after_rounding,
        generator=torch.Generator().manual_seed(7),
    )
    assert torch.equal(got, ref)
    assert got.dtype == torch.int64
    y = 8.0 * x
    assert bool(((got == torch.floor(y)) | (got == torch.ceil(y))).all())
    secure = mech.round_update(x, generator=None, secure=True)  # OS randomness, no generator
    assert bool(((secure == torch.floor(y)) | (secure == torch.ceil(y))).all())
    with pytest.raises(ConfigError):
        mech.round_update(x, generator=torch.Generator().manual_seed(7), secure=True)
    with pytest.raises(DataError, match=_exact("update dimension 5 != planned dim 6")):
        mech.round_update(x[:3, :5], generator=torch.Generator())
    with pytest.raises(DataError, match=_exact("update dimension 5 != planned dim 6")):
        mech.round_update(x[0, :5], generator=torch.Generator())  # 1-D, wrong length
    with pytest.raises(DataError, match="updates must be a 2-D floating tensor"):
        mech.round_update(x[0], generator=torch.Generator())  # 1-D, right length


def test_ddg_mechanism_event_is_the_plans_event():
    plan = _plan()
    ev = DistributedDiscreteGaussian(plan=plan).event(7, sample_rate=0.25, noise_contributors=5)
    assert ev == plan.event(7, sample_rate=0.25, noise_contributors=5)
    assert (ev.round, ev.sample_rate, ev.noise_contributors) == (7, 0.25, 5)
    assert ev.mechanism == "distributed_discrete_gaussian"
    assert ev.share_sigma == plan.share_sigma
    assert ev.l2_sensitivity == plan.l2_sensitivity_after_rounding
    assert ev.l1_sensitivity == plan.l1_sensitivity_after_rounding
    assert (ev.dim, ev.min_survivors, ev.placement) == (plan.dim, 4, "distributed")


def test_noise_sum_bound_is_the_subgaussian_tail_bound():
    """``ceil(sqrt(2 n s^2 log(2 d / p)))`` (Canonne et al. 2020, Cor. 9, union over d)."""
    plan = _plan()
    s, d = plan.share_sigma, plan.dim
    for n, p in ((1, None), (7, None), (7, 1e-3)):
        q = plan.failure_prob if p is None else p
        expected = math.ceil(math.sqrt(2 * n * s**2 * math.log(2 * d / q)))
        assert plan.noise_sum_bound(n, p) == expected
    assert plan.noise_bound == plan.noise_sum_bound(plan.cohort_size)
    for bad in (0.0, 1.0, 1.5):
        with pytest.raises(
            ConfigError, match=_exact(f"failure probability must be in (0, 1), got {bad!r}")
        ):
            plan.noise_sum_bound(3, bad)
    for bad in (0, True, 2.5):
        with pytest.raises(
            ConfigError, match=_exact(f"n_clients must be an integer >= 1, got {bad!r}")
        ):
            plan.noise_sum_bound(bad)


def test_noise_sources_pass_secure_and_dtype_through():
    """Secure mode refuses a generator and needs none; the dtype asked for is returned."""
    central = CentralGaussian(clip=1.0, noise_multiplier=1.0)
    dist = DistributedGaussian(clip=1.0, noise_multiplier=1.0, min_survivors=4)
    ddg = DistributedDiscreteGaussian(plan=_plan())
    draws = [
        lambda **kw: central.noise_for_sum(3, **kw),
        lambda **kw: dist.client_share((2, 3), **kw),
    ]
    for draw in draws:
        assert draw(generator=None, secure=True, dtype=torch.float64).dtype == torch.float64
        g = torch.Generator().manual_seed(0)
        assert draw(generator=g, dtype=torch.float64).dtype == torch.float64
        with pytest.raises(ConfigError):
            draw(generator=torch.Generator(), secure=True)
    assert ddg.client_share(generator=None, secure=True).shape == (1, 10)
    assert ddg.client_share(generator=torch.Generator().manual_seed(0)).shape == (1, 10)
    with pytest.raises(ConfigError):
        ddg.client_share(generator=torch.Generator(), secure=True)
    for bad in (0, True, 1.5):
        with pytest.raises(ConfigError, match=_exact(f"dim must be an integer >= 1, got {bad!r}")):
            central.noise_for_sum(bad, generator=torch.Generator())
    with pytest.raises(ConfigError, match=_exact("min_survivors must be an integer >= 1, got 0")):
        DistributedGaussian(clip=1.0, noise_multiplier=1.0, min_survivors=0)


# -- dp ledger ---------------------------------------------------------------------------------


def _gauss(round_=0, z=1.0, q=1.0, clip=1.0):
    return PrivacyEvent(
        round=round_,
        mechanism="gaussian",
        noise_multiplier=z,
        sample_rate=q,
        clip=clip,
        noise_contributors=1,
        min_survivors=1,
        placement="central",
    )


def _discrete(round_=0, q=1.0, n=4):
    return _plan().event(round_, sample_rate=q, noise_contributors=n)


@pytest.mark.parametrize("bad", [0, True, 1.5])
def test_event_names_a_bad_contributor_count(bad):
    with pytest.raises(
        ConfigError, match=_exact(f"noise_contributors must be an integer >= 1, got {bad!r}")
    ):
        PrivacyEvent(
            round=0,
            mechanism="distributed_gaussian",
            noise_multiplier=1.0,
            sample_rate=1.0,
            clip=1.0,
            noise_contributors=bad,
            min_survivors=1,
            placement="distributed",
        )


def test_event_refuses_a_non_numeric_clip_as_config_error():
    with pytest.raises(ConfigError, match="clip must be a finite number > 0"):
        _gauss(clip="1.0")


def test_from_dict_reports_a_missing_field_as_malformed():
    d = _gauss().to_dict()
    del d["clip"]
    with pytest.raises(ConfigError, match="^malformed privacy event: .*clip"):
        PrivacyEvent.from_dict(d)


def test_record_messages_are_exact():
    ledger = PrivacyLedger([_gauss(0), _gauss(5)])
    with pytest.raises(ConfigError, match=_exact("expected a PrivacyEvent, got int")):
        ledger.record(3)
    with pytest.raises(
        ConfigError,
        match=_exact(
            "privacy event round 3 is before the last recorded round 5; "
            "events must be recorded in round order"
        ),
    ):
        ledger.record(_gauss(3))
    one = PrivacyLedger([_gauss(0)])
    local = PrivacyEvent(
        round=1,
        mechanism="gaussian",
        noise_multiplier=1.0,
        sample_rate=1.0,
        clip=1.0,
        noise_contributors=1,
        min_survivors=1,
        placement="local",
        privacy_unit="interaction",
    )
    with pytest.raises(
        ConfigError,
        match=_exact(
            "a interaction-level event cannot join a ledger of user-level events; "
            "keep one ledger per unit"
        ),
    ):
        one.record(local)
    one.record(_gauss(0))  # a second release in the same round is allowed
    assert len(one) == 2


def test_events_of_one_round_with_different_noise_are_both_accounted():
    ledger = PrivacyLedger([_gauss(0, z=1.0), _gauss(0, z=2.0)])
    expected = gaussian_epsilon([(1.0, 1.0, 1), (2.0, 1.0, 1)], delta=_DELTA, accountant="rdp")
    assert ledger.epsilon(_DELTA, accountant="rdp") == pytest.approx(expected, rel=1e-12)


def test_events_that_differ_only_in_clip_compose():
    """Same effective multiplier, different keys: both count (histogram adds up)."""
    ledger = PrivacyLedger([_gauss(0, clip=1.0), _gauss(1, clip=2.0)])
    expected = gaussian_epsilon([(1.0, 1.0, 2)], delta=_DELTA, accountant="rdp")
    assert ledger.epsilon(_DELTA, accountant="rdp") == pytest.approx(expected, rel=1e-12)


def test_would_exceed_and_spend_at_the_exact_budget():
    ledger = PrivacyLedger([_gauss(0)])
    ev = _gauss(1)
    eps = PrivacyLedger([_gauss(0), ev]).epsilon(_DELTA)  # default accountant (prv)
    assert ledger.would_exceed(ev, eps, _DELTA) is False
    assert ledger.would_exceed(ev, eps * 0.999, _DELTA) is True
    assert ledger.would_exceed(ev, eps * 0.999, _DELTA, accountant="rdp") is (
        PrivacyLedger([_gauss(0), ev]).epsilon(_DELTA, accountant="rdp") > eps * 0.999
    )
    with pytest.raises(
        ConfigError, match=_exact("target epsilon must be a finite number > 0, got 0")
    ):
        ledger.would_exceed(ev, 0, _DELTA)
    with pytest.raises(
        ConfigError, match=_exact("target epsilon must be a finite number > 0, got 0")
    ):
        ledger.spend(ev, target_epsilon=0, delta=_DELTA)
    target = eps * 0.999
    with pytest.raises(
        PrivacyBudgetError,
        match=_exact(
            f"round index 1 would raise epsilon to {eps:.4g} above the target {target:.4g} "
            f"(delta={_DELTA!r}); stop training or raise the budget"
        ),
    ):
        ledger.spend(ev, target_epsilon=target, delta=_DELTA)
    assert len(ledger) == 1
    assert ledger.spend(ev, target_epsilon=eps, delta=_DELTA) == eps
    assert ledger.events[-1] is ev
    rdp = PrivacyLedger([_gauss(0), _gauss(1), _gauss(2)]).epsilon(1e-6, accountant="rdp")
    assert ledger.spend(_gauss(2), target_epsilon=100.0, delta=1e-6, accountant="rdp") == rdp


def test_discrete_ledger_prv_message_is_exact():
    with pytest.raises(
        ConfigError,
        match=_exact(
            "the ledger holds distributed discrete Gaussian events, whose guarantee is an RDP "
            "bound (Kairouz et al. 2021); account it with accountant='rdp'"
        ),
    ):
        PrivacyLedger([_discrete()]).epsilon(_DELTA)


@pytest.mark.parametrize("q", [1.0, 0.5])
def test_discrete_ledger_uses_integer_orders_only_when_subsampled(q):
    events = [_discrete(0, q=q, n=4), _discrete(1, q=q, n=5)]
    orders = rdp_orders(integer_only=q < 1.0)
    total = sum(e.rdp(orders) for e in events)
    expected = rdp_to_epsilon(orders, total, _DELTA)
    assert PrivacyLedger(events).epsilon(_DELTA, accountant="rdp") == expected


_EV = {
    "round": 0,
    "mechanism": "gaussian",
    "noise_multiplier": 1.0,
    "sample_rate": 1.0,
    "clip": 1.0,
    "noise_contributors": 1,
    "min_survivors": 1,
    "placement": "central",
}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"clip": 0.0}, "clip must be a finite number > 0, got 0.0"),
        ({"round": 1.5}, "round must be an integer >= 0, got 1.5"),
        ({"placement": "x"}, "placement must be 'central', 'distributed' or 'local', got 'x'"),
        ({"privacy_unit": "x"}, "privacy_unit must be one of ('user', 'interaction'), got 'x'"),
        (
            {"placement": "local"},
            "local placement (client-side DP-SGD) goes with privacy_unit='interaction' and "
            "only with it; got placement 'local', unit 'user'",
        ),
        (
            {"placement": "distributed"},
            "mechanism 'gaussian' does not match placement 'distributed'",
        ),
        (
            {"noise_contributors": 2},
            "central or local noise has exactly one contributor; got "
            "noise_contributors=2, min_survivors=1",
        ),
        ({"min_survivors": 0}, "min_survivors must be an integer >= 1, got 0"),
        (
            {"dim": 3},
            "share_sigma, l2_sensitivity, l1_sensitivity and dim belong to discrete events",
        ),
    ],
)
def test_event_validation_messages_are_exact(change, message):
    with pytest.raises(ConfigError, match=_exact(message)):
        PrivacyEvent(**{**_EV, **change})


def test_event_normalises_numpy_scalars_to_python_types():
    ev = PrivacyEvent(
        **{**_EV, "round": np.int64(3), "noise_multiplier": np.float32(1.5), "clip": np.float64(2)}
    )
    assert type(ev.round) is int and type(ev.noise_multiplier) is float
    assert type(ev.clip) is float
    d = _discrete()
    ev2 = PrivacyEvent.from_dict({**d.to_dict(), "dim": np.int64(10), "share_sigma": np.float32(2)})
    assert type(ev2.dim) is int and type(ev2.share_sigma) is float
    json.dumps([ev.to_dict(), ev2.to_dict()])
