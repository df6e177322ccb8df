"""Malicious mode (issue 16 item 3): signed advertisements and the consistency round.

The attacks are played by a server that drives the honest stage machines but rewrites the
messages it sends: it swaps a relayed public key, forges, strips or replays a signature, or
tells different clients different survivor sets. Every attack test asserts on what reached
the server (the senders of each message kind), not only on the exception: an honest client
that detects the attack must not have sent any share material. Each has a semi-honest or
honest-server control showing the same transcript goes through when the attack is absent or
the mode does not check it.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Callable

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

from protocols.errors import ConfigError, IntegrityError
from protocols.secagg import (
    ClientAborted,
    DropoutSchedule,
    RoundAborted,
    SecAggClient,
    SecAggConfig,
    SecAggServer,
    Stage,
    secure_sum,
    wire,
)
from protocols.secagg.batched import batched_round
from protocols.secagg.config import corrupt_neighbour_bound
from protocols.secagg.identity import ClientIdentity, IdentityDirectory, enroll
from protocols.secagg.primitives import open_sealed, session_id, share_box_keys

SEED = b"malicious-seed-0123"
ROUND = 5
BITS = 24
DIM = 16


def _inputs(n: int, d: int = DIM, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 1 << BITS, size=(n, d), dtype=np.uint64)


def _plain(x: np.ndarray, ids) -> np.ndarray:
    return x[np.asarray(ids)].sum(axis=0, dtype=np.uint64) & np.uint64((1 << BITS) - 1)


def _env(round_index: int = ROUND, seed: bytes = SEED) -> wire.Envelope:
    return wire.Envelope(session=session_id(seed, round_index), round_index=round_index)


def _kind(message: bytes) -> wire.Kind:
    return wire.Kind(message[5])  # magic 4 | version 1 | kind 1


class Round:
    """Honest clients and an honest server whose outgoing messages a test may rewrite.

    ``received[kind]`` is the set of clients whose message of that kind reached the server;
    ``aborted`` the clients that raised (and so sent nothing) at some stage.
    """

    def __init__(self, cfg: SecAggConfig, x: np.ndarray) -> None:
        self.cfg, self.x = cfg, x
        n = cfg.n_clients
        self.identities, self.directory = enroll(n)
        kw = {"config": cfg, "round_index": ROUND, "public_seed": SEED, "dim": x.shape[1]}
        mal = cfg.malicious
        self.clients = [
            SecAggClient(
                i,
                identity=self.identities[i] if mal else None,
                directory=self.directory if mal else None,
                **kw,
            )
            for i in range(n)
        ]
        self.server = SecAggServer(directory=self.directory if mal else None, **kw)
        self.received: dict[wire.Kind, set[int]] = defaultdict(set)
        self.aborted: dict[int, type] = {}
        self.sent: dict[tuple[wire.Kind, int], bytes] = {}

    def step(
        self,
        inbox: dict[int, bytes | None],
        call: Callable[[SecAggClient, bytes | None], bytes],
        receive: Callable[[int, bytes], None] | None,
    ) -> None:
        for i, msg in inbox.items():
            if i in self.aborted:
                continue
            try:
                reply = call(self.clients[i], msg)
            except (IntegrityError, ClientAborted) as exc:
                assert self.clients[i].stage is Stage.ABORTED
                self.aborted[i] = type(exc)
                continue
            self.received[_kind(reply)].add(i)
            self.sent[_kind(reply), i] = reply
            if receive is not None:
                receive(i, reply)

    def advertise(self) -> dict[int, bytes]:
        n = self.cfg.n_clients
        self.step(
            dict.fromkeys(range(n)), lambda c, _m: c.advertise(), self.server.receive_advertise
        )
        return self.server.finish_advertise()

    def share(self, keys: dict[int, bytes]) -> dict[int, bytes]:
        self.step(keys, lambda c, m: c.share_keys(m), self.server.receive_shares)
        return self.server.finish_shares()

    def mask(self, forward: dict[int, bytes], silent: frozenset[int] = frozenset()) -> dict:
        inbox = {i: m for i, m in forward.items() if i not in silent}
        self.step(
            inbox, lambda c, m: c.masked_input(m, self.x[c.id]), self.server.receive_masked_input
        )
        return self.server.finish_masked_input()

    def consistency(self, survivors: dict[int, bytes]) -> dict[int, bytes]:
        self.step(survivors, lambda c, m: c.consistency(m), self.server.receive_consistency)
        return self.server.finish_consistency()

    def unmask(self, requests: dict[int, bytes]) -> np.ndarray:
        self.step(requests, lambda c, m: c.unmask(m), self.server.receive_unmask_shares)
        return self.server.finish_unmask()

    def share_material_from(self, ids) -> set[int]:
        """Which of ``ids`` sent any message carrying shares (sealed or revealed)."""
        kinds = (wire.Kind.SHARES, wire.Kind.UNMASK_SHARES)
        return {i for i in ids if any(i in self.received[k] for k in kinds)}


def _malicious(n: int, **kw) -> SecAggConfig:
    return SecAggConfig(n_clients=n, modulus_bits=BITS, mode="malicious", **kw)


def _complete7() -> SecAggConfig:
    """n = 7 on the complete graph, no dropouts or colluders assumed: k = 6, c = 0, t = 4."""
    return _malicious(7, neighbours=6, dropout_tolerance=0.0, corrupt_fraction=0.0)


# -- the honest path ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "dropouts",
    [
        None,
        DropoutSchedule(masked_input=frozenset({3})),
        DropoutSchedule(share=frozenset({11}), unmask=frozenset({5})),  # no common neighbour
    ],
    ids=["none", "masked-input-dropout", "share-and-unmask-dropouts"],
)
def test_honest_round_sums_exactly_like_semi_honest(dropouts):
    n = 20
    x = _inputs(n)
    mal = _malicious(n)
    semi = SecAggConfig(n_clients=n, modulus_bits=BITS, neighbours=mal.k, threshold=mal.t)
    res = secure_sum(
        x, config=mal, round_index=ROUND, public_seed=SEED, dropouts=dropouts, engine="objects"
    )
    ref = secure_sum(x, config=semi, round_index=ROUND, public_seed=SEED, dropouts=dropouts)
    np.testing.assert_array_equal(res.sum, _plain(x, res.survivors))
    np.testing.assert_array_equal(res.sum, ref.sum)
    np.testing.assert_array_equal(res.survivors, ref.survivors)
    np.testing.assert_array_equal(res.dropped, ref.dropped)
    if dropouts is not None and dropouts.masked_input:
        assert res.dropped.tolist() == [3]  # its mask key was rebuilt, as in semi-honest mode
    assert res.bytes_per_stage["consistency"] > 0
    assert set(res.bytes_per_stage) == {
        "advertise",
        "share",
        "masked_input",
        "consistency",
        "unmask",
    }


def test_stage_machines_complete_round_and_server_checks_signatures():
    r = Round(_complete7(), _inputs(7))
    total = r.unmask(r.consistency(r.mask(r.share(r.advertise()))))
    assert not r.aborted
    np.testing.assert_array_equal(total, _plain(r.x, range(7)))
    assert r.server.u4 == frozenset(range(7))


# -- a server swapping a relayed public key (man in the middle on key agreement) -----------


def _swap_key(
    env: wire.Envelope, message: bytes, receiver: int, victim: int, signed: bool, mitm_c: bytes
) -> bytes:
    """Replace ``victim``'s two X25519 keys in a KEYS message by the server's own."""
    mitm_s = X25519PrivateKey.generate().public_key().public_bytes_raw()
    n = 1 << 20
    if signed:
        entries = wire.decode_signed_keys(env, message, receiver=receiver, n_clients=n)
        swapped = [
            (c, mitm_c, mitm_s, sig) if c == victim else (c, cp, sp, sig)
            for c, cp, sp, sig in entries
        ]
        return wire.encode_signed_keys(env, receiver, swapped)
    plain = wire.decode_keys(env, message, receiver=receiver, n_clients=n)
    return wire.encode_keys(
        env, receiver, [(c, mitm_c, mitm_s) if c == victim else (c, cp, sp) for c, cp, sp in plain]
    )


@pytest.mark.parametrize("mode", ["malicious", "semi-honest"])
def test_swapped_public_key_aborts_affected_clients_before_any_share(mode):
    n, victim = 20, 0
    cfg = _malicious(n) if mode == "malicious" else SecAggConfig(n_clients=n, modulus_bits=BITS)
    r = Round(cfg, _inputs(n))
    keys = r.advertise()
    affected = {int(j) for j in r.server.neighbours(victim)}
    env = _env()
    signed = mode == "malicious"
    mitm = X25519PrivateKey.generate()
    mitm_c = mitm.public_key().public_bytes_raw()
    tampered = {
        i: _swap_key(env, m, i, victim, signed, mitm_c) if i in affected else m
        for i, m in keys.items()
    }
    forward = r.share(tampered)
    with contextlib.suppress(RoundAborted):  # the victim's neighbourhood is gone
        r.unmask(r.consistency(r.mask(forward)) if signed else r.mask(forward))
    if mode == "semi-honest":  # control: without signatures the swap goes unnoticed and the
        # server opens the affected clients' boxes to the victim: their Shamir shares
        assert r.share_material_from(affected) == affected
        for i in affected:
            boxes = dict(
                wire.decode_shares(env, r.sent[wire.Kind.SHARES, i], sender=i, n_clients=n)
            )
            c_pk_i = wire.decode_advertise(env, r.sent[wire.Kind.ADVERTISE, i], sender=i)[0]
            k_out, _ = share_box_keys(
                mitm.exchange(X25519PublicKey.from_public_bytes(c_pk_i)),
                session=env.session,
                round_index=ROUND,
                a=i,
                b=victim,
            )
            plain = open_sealed(k_out, boxes[victim], wire.share_associated_data(env, i, victim))
            assert wire.unpack_share_plaintext(plain, sender=i, receiver=victim)
        return
    assert r.aborted.keys() >= affected
    assert all(r.aborted[i] is IntegrityError for i in affected)
    assert r.share_material_from(affected) == set()  # no sealed share, no revealed share
    assert r.received[wire.Kind.SHARES] == set(range(n)) - affected
    assert all(r.clients[i].stage is Stage.ABORTED for i in affected)


# -- forged, replayed or missing signatures -------------------------------------------------


def _forge(kind: str, env: wire.Envelope, r: Round, victim: int):
    """A function rewriting one KEYS message so that ``victim``'s entry is badly signed."""

    def rewrite(message: bytes, receiver: int) -> bytes:
        entries = wire.decode_signed_keys(
            env, message, receiver=receiver, n_clients=r.cfg.n_clients
        )
        out = []
        for cid, c_pk, s_pk, sig in entries:
            if cid == victim:
                statement = wire.advertise_statement(env, cid, c_pk, s_pk)
                if kind == "other-key":  # signed by a key the directory does not hold for victim
                    sig = ClientIdentity.generate(cid).sign(statement)
                elif kind == "other-client":  # a real client's valid signature, wrong signer
                    sig = r.identities[receiver].sign(statement)
                elif kind == "other-round":  # victim's own key, statement of another round
                    sig = r.identities[cid].sign(
                        wire.advertise_statement(_env(ROUND + 1), cid, c_pk, s_pk)
                    )
                elif kind == "other-session":  # victim's own key, same round, other seed
                    sig = r.identities[cid].sign(
                        wire.advertise_statement(_env(seed=b"another-seed-0123"), cid, c_pk, s_pk)
                    )
                elif kind == "zeroed":
                    sig = bytes(64)
                elif kind == "bit-flip":
                    sig = bytes([sig[0] ^ 1]) + sig[1:]
            out.append((cid, c_pk, s_pk, sig))
        if kind == "unsigned":  # the semi-honest KEYS message: no signatures at all
            return wire.encode_keys(env, receiver, [e[:3] for e in out])
        if kind == "truncated":
            return message[:-1]
        return wire.encode_signed_keys(env, receiver, out)

    return rewrite


@pytest.mark.parametrize(
    "kind",
    [
        "other-key",
        "other-client",
        "other-round",
        "other-session",
        "zeroed",
        "bit-flip",
        "unsigned",
        "truncated",
    ],
)
def test_forged_or_missing_signature_aborts_before_any_share(kind):
    n, victim = 20, 4
    r = Round(_malicious(n), _inputs(n))
    keys = r.advertise()
    affected = {int(j) for j in r.server.neighbours(victim)}
    rewrite = _forge(kind, _env(), r, victim)
    tampered = {i: rewrite(m, i) if i in affected else m for i, m in keys.items()}
    r.share(tampered)
    assert {i for i, e in r.aborted.items() if e is IntegrityError} == affected
    assert r.received[wire.Kind.SHARES] == set(range(n)) - affected
    assert r.share_material_from(affected) == set()


def test_honest_server_rejects_forged_advertisement():
    cfg = _complete7()
    r = Round(cfg, _inputs(7))
    env = _env()
    c_pk = X25519PrivateKey.generate().public_key().public_bytes_raw()
    s_pk = X25519PrivateKey.generate().public_key().public_bytes_raw()
    good = r.identities[2].sign(wire.advertise_statement(env, 2, c_pk, s_pk))
    with pytest.raises(IntegrityError):  # client 2's signature presented as client 3's
        r.server.receive_advertise(3, wire.encode_signed_advertise(env, 3, c_pk, s_pk, good))
    with pytest.raises(IntegrityError):  # unsigned advertisement
        r.server.receive_advertise(3, wire.encode_advertise(env, 3, c_pk, s_pk))
    r.server.receive_advertise(2, wire.encode_signed_advertise(env, 2, c_pk, s_pk, good))  # control
    assert 3 not in r.server._keys and 2 in r.server._keys


def test_honest_server_rejects_a_bad_survivor_signature():
    r = Round(_complete7(), _inputs(7))
    r.mask(r.share(r.advertise()))
    env = _env()
    other_set = r.identities[1].sign(wire.survivors_statement(env, [1, 2, 3, 4, 5, 6]))
    with pytest.raises(IntegrityError):
        r.server.receive_consistency(1, wire.encode_survivors_signature(env, 1, other_set))
    good = r.identities[1].sign(wire.survivors_statement(env, list(range(7))))
    r.server.receive_consistency(1, wire.encode_survivors_signature(env, 1, good))  # control
    assert r.server._survivor_sigs.keys() == {1}


# -- a server equivocating about the survivors (the consistency round) ----------------------


def _signed_survivor_sets(
    r: Round, env: wire.Envelope, shown: dict[int, list[int]]
) -> dict[int, bytes]:
    """The consistency round: client ``i`` is shown ``shown[i]``; each one's signature."""
    sigs: dict[int, bytes] = {}
    r.step(
        {i: wire.encode_survivors(env, i, ids) for i, ids in shown.items()},
        lambda c, m: c.consistency(m),
        lambda i, m: sigs.__setitem__(i, wire.decode_survivors_signature(env, m, sender=i)),
    )
    return sigs


def _signed_requests(env, sigs: dict[int, bytes], relay: dict[int, list[int]]) -> dict[int, bytes]:
    return {
        i: wire.encode_signed_unmask_request(env, i, [(j, sigs[j]) for j in sorted(ids)])
        for i, ids in relay.items()
    }


@pytest.mark.parametrize("relay", ["all-signatures", "matching-signatures-only"])
def test_different_survivor_sets_to_different_clients_release_no_share(relay):
    """The server tells A that client 0 survived and B that it dropped (to collect both
    ``b_0`` and ``s_0`` shares). Each client signs the set it was shown; no client then holds
    ``t`` neighbours' signatures over its own set, so nobody reveals anything."""
    # One dropout tolerated (the set shown to B names 6 of 7: not below the round's floor).
    cfg = _malicious(7, neighbours=6, dropout_tolerance=0.1, corrupt_fraction=0.0)
    assert (cfg.k, cfg.t, cfg.min_survivors) == (6, 4, 6)
    r = Round(cfg, _inputs(7))
    r.mask(r.share(r.advertise()))
    env = _env()
    world_a, world_b = [0, 1, 2, 3], [4, 5, 6]
    set_a, set_b = list(range(7)), [1, 2, 3, 4, 5, 6]  # set_b: client 0 "dropped"
    shown = {i: set_a for i in world_a} | {i: set_b for i in world_b}
    sigs = _signed_survivor_sets(r, env, shown)
    assert sorted(sigs) == list(range(7))  # every client signed the set it saw
    if relay == "all-signatures":
        plan = {i: [j for j in range(7) if j != i] for i in range(7)}
    else:
        plan = {i: [j for j in range(7) if j != i and shown[j] == shown[i]] for i in range(7)}
    r.step(_signed_requests(env, sigs, plan), lambda c, m: c.unmask(m), None)
    assert set(r.aborted) == set(range(7))
    expected = IntegrityError if relay == "all-signatures" else ClientAborted
    assert set(r.aborted.values()) == {expected}
    assert r.received[wire.Kind.UNMASK_SHARES] == set()


def test_one_survivor_set_with_t_signatures_releases_shares():
    """Control for the test above: one set shown to all and ``t`` signatures relayed."""
    cfg = _complete7()
    r = Round(cfg, _inputs(7))
    r.mask(r.share(r.advertise()))
    env = _env()
    sigs = _signed_survivor_sets(r, env, {i: list(range(7)) for i in range(7)})
    plan = {i: [j for j in range(7) if j != i][: cfg.t] for i in range(7)}
    r.step(_signed_requests(env, sigs, plan), lambda c, m: c.unmask(m), None)
    assert not r.aborted
    assert r.received[wire.Kind.UNMASK_SHARES] == set(range(7))


def test_fewer_than_t_signatures_or_a_foreign_one_release_nothing():
    cfg = _complete7()
    r = Round(cfg, _inputs(7))
    r.mask(r.share(r.advertise()))
    env = _env()
    sigs = _signed_survivor_sets(r, env, {i: list(range(7)) for i in range(7)})
    other_round = r.identities[5].sign(wire.survivors_statement(_env(ROUND + 1), list(range(7))))
    other_seed = _env(seed=b"another-seed-0123")
    other_session = r.identities[5].sign(wire.survivors_statement(other_seed, list(range(7))))
    requests = {
        0: wire.encode_signed_unmask_request(env, 0, [(j, sigs[j]) for j in (1, 2, 3)]),  # t - 1
        1: wire.encode_signed_unmask_request(
            env, 1, [(1, sigs[1])] + [(j, sigs[j]) for j in (2, 3, 4)]
        ),
        2: wire.encode_signed_unmask_request(
            env, 2, [(1, sigs[1]), (3, sigs[3]), (4, sigs[4]), (5, other_round)]
        ),
        3: wire.encode_signed_unmask_request(env, 3, [(j, sigs[j]) for j in (0, 1, 2, 4)]),
        4: wire.encode_signed_unmask_request(
            env, 4, [(1, sigs[1]), (2, sigs[2]), (3, sigs[3]), (5, other_session)]
        ),
    }
    r.step(requests, lambda c, m: c.unmask(m), None)
    assert r.aborted == {0: ClientAborted, 1: IntegrityError, 2: IntegrityError, 4: IntegrityError}
    assert r.received[wire.Kind.UNMASK_SHARES] == {3}  # control: 3 got t valid signatures


@pytest.mark.parametrize("lie", ["omits-receiver", "too-few-neighbours", "names-unshared"])
def test_client_refuses_to_sign_an_impossible_survivor_set(lie):
    # A floor of 4 (t): the sets below are refused for their contents, not their size.
    cfg = _malicious(7, neighbours=6, dropout_tolerance=0.0, corrupt_fraction=0.0, survivors=4)
    r = Round(cfg, _inputs(7))
    keys = r.advertise()
    forward = r.share({i: m for i, m in keys.items() if i != 6})  # 6 never shares: not in U2
    assert 6 in r.aborted or r.server.u2 == frozenset(range(6))
    r.mask(forward)
    env = _env()
    sets = {
        "omits-receiver": [1, 2, 3, 4, 5],
        "too-few-neighbours": [0, 1, 2, 3],  # 3 neighbours < t = 4
        "names-unshared": [0, 1, 2, 3, 4, 5, 6],  # 6 never sent shares to 0
    }
    r.step({0: wire.encode_survivors(env, 0, sets[lie])}, lambda c, m: c.consistency(m), None)
    assert r.aborted.get(0) is ClientAborted
    assert r.received[wire.Kind.SURVIVORS_SIGNATURE] == set()


@pytest.mark.parametrize("floor", [None, 6])
def test_client_refuses_a_survivor_set_below_the_rounds_floor(floor):
    """``t`` bounds each neighbourhood only: a server could name few survivors, each still
    seeing ``t`` neighbours, and unmask a sum of far fewer inputs than the round was sized
    for (e.g. its distributed noise shares). Every client refuses a set below
    ``min_survivors`` (default: the dropouts the graph is designed for; or given)."""
    cfg = _malicious(7, neighbours=6, dropout_tolerance=0.0, corrupt_fraction=0.0, survivors=floor)
    assert (cfg.t, cfg.min_survivors) == (4, floor or 7)
    r = Round(cfg, _inputs(7))
    r.mask(r.share(r.advertise()))
    env = _env()
    small = [0, 1, 2, 3, 4]  # 4 neighbours each: t is met, the floor is not
    r.step(
        {i: wire.encode_survivors(env, i, small) for i in small},
        lambda c, m: c.consistency(m),
        None,
    )
    assert {r.aborted.get(i) for i in small} == {ClientAborted}
    assert r.received[wire.Kind.SURVIVORS_SIGNATURE] == set()
    with pytest.raises(ConfigError, match="survivors must be"):
        _malicious(7, survivors=8)


def test_unmask_without_consistency_round_is_refused():
    cfg = _complete7()
    r = Round(cfg, _inputs(7))
    r.mask(r.share(r.advertise()))
    semi_request = wire.encode_unmask_request(_env(), 0, 7, list(range(1, 7)), [])
    r.step({0: semi_request}, lambda c, m: c.unmask(m), None)
    assert r.aborted == {0: IntegrityError}
    assert r.received[wire.Kind.UNMASK_SHARES] == set()


# -- configuration: Bell et al.'s threshold and where malicious mode runs -------------------


@pytest.mark.parametrize("n", [20, 100, 943])
def test_malicious_threshold_exceeds_half_of_k_plus_corrupt_neighbours(n):
    cfg = _malicious(n)
    c = cfg.corrupt_neighbour_bound()
    assert 2 * cfg.t > cfg.k + c
    assert cfg.t == (cfg.k + c) // 2 + 1 or cfg.t > (cfg.k + c) // 2 + 1 and cfg.t <= cfg.k
    g = cfg.guarantee()
    assert g.correctness_log2 <= -cfg.correctness_bits
    assert g.share_secrecy_log2 <= -cfg.security_bits


def test_malicious_threshold_at_n100_is_stronger_than_semi_honest():
    semi, mal = SecAggConfig(n_clients=100), _malicious(100)
    assert (semi.k, semi.t) == (12, 7)  # 2t > k, but 2t <= k + c for c = 5
    assert semi.corrupt_neighbour_bound() == 5 and 2 * semi.t <= semi.k + 5
    assert (mal.k, mal.t) == (16, 11)


def test_corrupt_neighbour_bound_values():
    assert corrupt_neighbour_bound(100, 16, 0, 40) == 0
    assert corrupt_neighbour_bound(7, 6, 2, 40) == 2  # complete graph: every corrupt one
    assert corrupt_neighbour_bound(100, 16, 5, 40) == 5
    assert corrupt_neighbour_bound(943, 52, 48, 40) == 20


def test_explicit_threshold_below_bells_condition_is_refused():
    with pytest.raises(ConfigError, match=r"2t > k \+ c .*c=5 .*use threshold >= 11"):
        _malicious(100, neighbours=16, threshold=10)
    assert _malicious(100, neighbours=16, threshold=11).t == 11
    assert SecAggConfig(n_clients=100, neighbours=16, threshold=10).t == 10  # semi-honest: fine


def test_explicit_neighbours_that_cannot_keep_the_malicious_threshold_are_refused():
    with pytest.raises(
        ConfigError, match=r"neighbours=12 cannot keep the malicious-mode threshold t >= 9"
    ):
        _malicious(100, neighbours=12)
    assert SecAggConfig(n_clients=100, neighbours=12).t == 7


def test_batched_engine_refuses_malicious_mode():
    cfg = _malicious(20)
    x = _inputs(20)
    with pytest.raises(ConfigError, match="runs on engine='objects' only"):
        secure_sum(x, config=cfg, round_index=ROUND, public_seed=SEED)
    with pytest.raises(ConfigError, match="semi-honest only"):
        batched_round(x, config=cfg, bits=BITS, round_index=ROUND, public_seed=SEED, silent={})


def test_malicious_parties_need_an_identity_and_the_directory():
    cfg = _complete7()
    ids, directory = enroll(7)
    kw = {"config": cfg, "round_index": ROUND, "public_seed": SEED, "dim": 4}
    with pytest.raises(ConfigError, match="identity"):
        SecAggClient(0, **kw)
    with pytest.raises(ConfigError, match="identity"):
        SecAggClient(0, identity=ids[0], **kw)
    with pytest.raises(ConfigError, match="does not match"):
        SecAggClient(0, identity=ids[1], directory=directory, **kw)
    with pytest.raises(ConfigError, match="does not match"):
        SecAggClient(0, identity=ClientIdentity.generate(0), directory=directory, **kw)
    with pytest.raises(ConfigError, match="directory"):
        SecAggServer(**kw)
    SecAggClient(0, identity=ids[0], directory=directory, **kw)  # control


def test_directory_validation_and_verification():
    ids, directory = enroll(3)
    assert len(directory) == 3 and directory.covers(3) and not directory.covers(4)
    assert repr(ids[1]) == "ClientIdentity(client_id=1)"
    sig = ids[1].sign(b"statement")
    directory.verify(1, b"statement", sig)
    for cid, statement, signature in [
        (2, b"statement", sig),
        (1, b"statemenT", sig),
        (9, b"statement", sig),
        (1, b"statement", sig[:-1]),
    ]:
        with pytest.raises(IntegrityError, match="^protocol message failed integrity validation$"):
            directory.verify(cid, statement, signature)
    with pytest.raises(ConfigError, match="32 bytes"):
        IdentityDirectory({0: b"short"})
    with pytest.raises(ConfigError, match="share one public key"):
        IdentityDirectory({0: ids[0].public_key, 1: ids[0].public_key})


def test_signed_wire_messages_round_trip_and_reject_tampering():
    env = _env()
    pk = bytes(range(32))
    sig = bytes(range(64))
    msg = wire.encode_signed_advertise(env, 3, pk, pk[::-1], sig)
    assert wire.decode_signed_advertise(env, msg, sender=3) == (pk, pk[::-1], sig)
    keys = wire.encode_signed_keys(env, 1, [(0, pk, pk, sig), (2, pk, pk, sig)])
    assert wire.decode_signed_keys(env, keys, receiver=1, n_clients=3) == [
        (0, pk, pk, sig),
        (2, pk, pk, sig),
    ]
    surv = wire.encode_survivors(env, 1, [0, 1, 2])
    assert wire.decode_survivors(env, surv, receiver=1, n_clients=3) == [0, 1, 2]
    req = wire.encode_signed_unmask_request(env, 1, [(0, sig)])
    assert wire.decode_signed_unmask_request(env, req, receiver=1, n_clients=3) == [(0, sig)]
    bad = [
        lambda: wire.decode_signed_advertise(env, msg[:-1], sender=3),
        lambda: wire.decode_signed_advertise(env, msg, sender=4),
        lambda: wire.decode_signed_advertise(_env(ROUND + 1), msg, sender=3),
        lambda: wire.decode_signed_keys(
            env,
            wire.encode_signed_keys(env, 1, [(2, pk, pk, sig), (0, pk, pk, sig)]),
            receiver=1,
            n_clients=3,
        ),
        lambda: wire.decode_survivors(
            env, wire.encode_survivors(env, 1, [0, 0]), receiver=1, n_clients=3
        ),
        lambda: wire.decode_survivors(env, surv, receiver=1, n_clients=2),
        lambda: wire.decode_survivors_signature(env, wire.encode_survivors(env, 1, [0]), sender=1),
        lambda: wire.decode_signed_unmask_request(env, req + b"\0", receiver=1, n_clients=3),
    ]
    for decode in bad:
        with pytest.raises(IntegrityError):
            decode()
    assert wire.advertise_statement(env, 1, pk, pk) != wire.advertise_statement(env, 2, pk, pk)
    assert wire.survivors_statement(env, [0, 1]) != wire.survivors_statement(env, [0, 2])
