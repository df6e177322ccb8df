"""The server's stage machine (Bonawitz et al. 2017, Fig. 4, server side; SecAgg+ graph).

For each stage call ``receive_*`` once per client message (in any order; a sender's identity
comes from the authenticated channel), then ``finish_*`` to close the stage and obtain the
messages for the next one. ``U1 >= U2 >= U3`` are the clients whose advertise, share and
masked-input messages arrived. A client missing from ``U1`` or ``U2`` simply leaves the graph:
nobody masks with it and nothing of it is reconstructed. The dropped set is ``U2 - U3``, the
clients some survivor masked with but whose masked input never came; the server rebuilds their
mask keys from shares and re-expands only the pairs (dropped, surviving neighbour).

In ``mode="malicious"`` the server also holds the enrollment's
:class:`~protocols.secagg.identity.IdentityDirectory`. It relays signed advertisements (and
drops a sender whose signature fails, so one lying client cannot make its neighbours abort),
and runs the consistency round between masked inputs and unmasking: ``finish_masked_input``
returns the SURVIVORS message (``U3``) for each survivor, ``receive_consistency`` collects each
one's signature over it (checked), and ``finish_consistency`` returns, for each signer in
``U4``, the signatures of its neighbours in ``U4`` (Bonawitz et al. 2017 §4, Fig. 4 round 3).
The clients check all of it; this server is honest, the checks on its side only keep honest
rounds alive.

Eager masking (semi-honest mode, :mod:`protocols.secagg.client`): ``receive_eager`` takes a
client's shares and its eager masked input together (both or neither), and ``finish_eager``
closes rounds 1 and 2 at once when every client of ``U1`` sent both (``U1 = U2 = U3``: the
unmask requests go out with the FORWARD messages); otherwise it discards every eager input
and returns the FORWARD messages of the paper's round 2 (``U2`` = the clients whose shares
came), after which ``receive_masked_input`` / ``finish_masked_input`` run as usual.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from protocols.errors import ConfigError, IntegrityError
from protocols.secagg import shamir, wire
from protocols.secagg.client import Stage, exchange, require_modulus
from protocols.secagg.config import SecAggConfig, neighbour_table
from protocols.secagg.errors import RoundAborted, ShareVerificationFailed
from protocols.secagg.identity import IdentityDirectory
from protocols.secagg.primitives import MaskExpander, pair_mask_key, self_mask_key, session_id


@dataclass(frozen=True)
class EagerOutcome:
    """What :meth:`SecAggServer.finish_eager` returns.

    Attributes:
        fallback: Some client of ``U1`` sent no shares or no eager input: every eager input
            was discarded; send ``forward`` as the paper's round 2 (``masked_input``).
        forward: The FORWARD message for each client of ``U2``.
        unmask: Without fallback, the UNMASK_REQUEST for each client (sent with its
            ``forward``); empty on fallback.
    """

    fallback: bool
    forward: dict[int, bytes]
    unmask: dict[int, bytes]


class SecAggServer:
    """The honest-but-curious aggregator of one round.

    Args:
        config: The round's public parameters (``modulus_bits`` set).
        round_index: Round number.
        public_seed: The round's public seed.
        dim: Length of the input vectors.
        expander: Optional shared :class:`MaskExpander` of length ``dim``.
        directory: The enrolled clients' verification keys (malicious mode only; required
            there).
    """

    def __init__(
        self,
        *,
        config: SecAggConfig,
        round_index: int,
        public_seed: bytes,
        dim: int,
        expander: MaskExpander | None = None,
        directory: IdentityDirectory | None = None,
    ) -> None:
        if config.malicious and directory is None:
            raise ConfigError(
                "mode='malicious' needs the identity directory from enrollment; pass directory="
            )
        self._directory = directory
        self.config = config
        self.bits = require_modulus(config)
        self.dim = dim
        self.round_index = round_index
        self._session = session_id(public_seed, round_index)
        self._env = wire.Envelope(session=self._session, round_index=round_index)
        self._table = neighbour_table(self._session, config.n_clients, config.k)
        word = wire.ring_dtype(self.bits)
        self._expander = expander if expander is not None else MaskExpander(dim, word)
        if self._expander.dim != dim or self._expander.dtype != word:
            raise ConfigError(f"expander must have dim {dim} and dtype {word}")
        self.stage = Stage.INIT
        self._keys: dict[int, tuple[bytes, bytes]] = {}
        self._boxes: dict[int, list[tuple[int, bytes]]] = {}
        self._acc = np.zeros(dim, dtype=word)
        self._u3: set[int] = set()
        self._eager = False  # the round's boxes are eager masking's (they carry b' shares)
        self._fallback = False  # an eager round fell back: inputs carry PRG(b'), not PRG(b)
        self._requested: dict[int, dict[int, wire.ShareKind]] = {}
        self._revealed: dict[tuple[int, wire.ShareKind], list[tuple[int, int]]] = defaultdict(list)
        self._responded: set[int] = set()
        self.u1: frozenset[int] = frozenset()
        self.u2: frozenset[int] = frozenset()
        self.u3: frozenset[int] = frozenset()
        self.u4: frozenset[int] = frozenset()  # malicious mode: signed the survivor set
        self._signed_keys: dict[int, bytes] = {}
        self._survivor_sigs: dict[int, bytes] = {}
        self._statement = b""

    def neighbours(self, client: int) -> np.ndarray:
        """Client ``client``'s neighbours in the public graph (before any dropout)."""
        return self._table[client]

    # -- round 0 ----------------------------------------------------------------------------

    def receive_advertise(self, sender: int, message: bytes) -> None:
        self._check_stage(Stage.INIT)
        self._check_sender(sender, self._keys)
        if not self.config.malicious:
            self._keys[sender] = wire.decode_advertise(self._env, message, sender=sender)
            return
        c_pk, s_pk, signature = wire.decode_signed_advertise(self._env, message, sender=sender)
        statement = wire.advertise_statement(self._env, sender, c_pk, s_pk)
        self._dir().verify(sender, statement, signature)
        self._keys[sender] = (c_pk, s_pk)
        self._signed_keys[sender] = signature

    def finish_advertise(self) -> dict[int, bytes]:
        """Close round 0; returns the KEYS message for each client in ``U1``."""
        self._check_stage(Stage.INIT)
        self.u1 = frozenset(self._keys)
        self._require(len(self.u1), "advertised keys")
        out = {}
        for i in sorted(self.u1):
            peers = [int(j) for j in self._table[i] if int(j) in self.u1]
            if self.config.malicious:
                entries = [(j, *self._keys[j], self._signed_keys[j]) for j in peers]
                out[i] = wire.encode_signed_keys(self._env, i, entries)
            else:
                out[i] = wire.encode_keys(self._env, i, [(j, *self._keys[j]) for j in peers])
        self.stage = Stage.ADVERTISED
        return out

    # -- round 1 ----------------------------------------------------------------------------

    def receive_shares(self, sender: int, message: bytes) -> None:
        self._boxes[sender] = self._decode_shares(sender, message, eager=False)

    def _decode_shares(
        self, sender: int, message: bytes, *, eager: bool
    ) -> list[tuple[int, bytes]]:
        self._check_stage(Stage.ADVERTISED)
        if sender not in self.u1:
            raise IntegrityError()
        self._check_sender(sender, self._boxes)
        if self._boxes and eager is not self._eager:  # one kind of box a round
            raise IntegrityError()
        boxes = wire.decode_shares(
            self._env, message, sender=sender, n_clients=self.config.n_clients, eager=eager
        )
        expected = [int(j) for j in self._table[sender] if int(j) in self.u1]
        if [cid for cid, _ in boxes] != expected:
            raise IntegrityError()
        return boxes

    def receive_eager(self, sender: int, shares_message: bytes, masked_message: bytes) -> None:
        """One client's shares and eager masked input: both are checked before either is
        kept, so a client with one bad message is simply absent from ``U2``."""
        if self.config.malicious:
            raise IntegrityError()
        boxes = self._decode_shares(sender, shares_message, eager=True)
        y = wire.decode_masked_input(
            self._env, masked_message, sender=sender, bits=self.bits, dim=self.dim
        )
        self._eager = True
        self._boxes[sender] = boxes
        np.add(self._acc, y, out=self._acc)
        self._u3.add(sender)

    def finish_eager(self) -> EagerOutcome:
        """Close round 1 after :meth:`receive_eager`, and round 2 too if nobody is missing.

        Without fallback ``U3 = U2 = U1`` and the outcome carries the unmask requests;
        otherwise the eager inputs are discarded (the running sum restarts) and the round
        continues with round 2's FORWARD messages, the survivors' self masks being their
        fallback seeds ``b'`` (requested and rebuilt in round 4 instead of ``b``).
        """
        if self.config.malicious or (self._boxes and not self._eager):
            raise IntegrityError()
        forward = self._close_shares()
        if self.u2 == self.u1 and self._u3 == set(self.u2):
            return EagerOutcome(fallback=False, forward=forward, unmask=self.finish_masked_input())
        self._acc[:] = 0
        self._u3.clear()
        self._fallback = True
        return EagerOutcome(fallback=True, forward=forward, unmask={})

    def finish_shares(self) -> dict[int, bytes]:
        """Close round 1; returns the FORWARD message for each client in ``U2``.

        An eager round closes with :meth:`finish_eager` instead, never this: its running sum
        holds the eager inputs."""
        if self._eager:
            raise IntegrityError()
        return self._close_shares()

    def _close_shares(self) -> dict[int, bytes]:
        self._check_stage(Stage.ADVERTISED)
        self.u2 = frozenset(self._boxes)
        self._require(len(self.u2), "shared keys")
        inbox: dict[int, list[tuple[int, bytes]]] = defaultdict(list)
        for sender in sorted(self.u2):
            for receiver, ct in self._boxes[sender]:
                if receiver in self.u2:
                    inbox[receiver].append((sender, ct))
        self._boxes = {}
        self.stage = Stage.SHARED
        return {i: wire.encode_forward(self._env, i, inbox[i]) for i in sorted(self.u2)}

    # -- round 2 ----------------------------------------------------------------------------

    def receive_masked_input(self, sender: int, message: bytes) -> None:
        """Add one masked input to the running sum (streaming: O(dim) server memory)."""
        self._check_stage(Stage.SHARED)
        if sender not in self.u2 or sender in self._u3:
            raise IntegrityError()
        y = wire.decode_masked_input(
            self._env, message, sender=sender, bits=self.bits, dim=self.dim
        )
        np.add(self._acc, y, out=self._acc)
        self._u3.add(sender)

    def finish_masked_input(self) -> dict[int, bytes]:
        """Close round 2; returns the UNMASK_REQUEST for each survivor in ``U3``.

        In malicious mode returns instead the SURVIVORS message (the sorted ``U3``) for each
        survivor: the consistency round comes first.
        """
        self._check_stage(Stage.SHARED)
        self.u3 = frozenset(self._u3)
        self._require(len(self.u3), "sent masked inputs")
        if self.config.malicious and len(self.u3) < self.config.min_survivors:
            # Every client would refuse to sign so small a set (SecAggConfig.min_survivors).
            self.stage = Stage.ABORTED
            raise RoundAborted(
                f"only {len(self.u3)} clients sent masked inputs, fewer than the "
                f"{self.config.min_survivors} the round may unmask; the round is aborted and "
                "reveals nothing"
            )
        self.stage = Stage.MASKED
        if self.config.malicious:
            survivors = sorted(self.u3)
            self._statement = wire.survivors_statement(self._env, survivors)
            return {i: wire.encode_survivors(self._env, i, survivors) for i in survivors}
        out = {}
        for i in sorted(self.u3):
            surv, drop = self._classify(i)
            out[i] = wire.encode_unmask_request(self._env, i, len(self.u3), surv, drop)
        return out

    def _classify(self, i: int) -> tuple[list[int], list[int]]:
        """Client ``i``'s partners split into survivors and dropped; records the request."""
        partners = [int(j) for j in self._table[i] if int(j) in self.u2]
        surv = [j for j in partners if j in self.u3]
        drop = [j for j in partners if j not in self.u3]
        self._requested[i] = {j: self._seed_kind for j in surv} | {
            j: wire.ShareKind.MASK_KEY for j in drop
        }
        return surv, drop

    # -- round 3 (malicious mode) -----------------------------------------------------------

    def receive_consistency(self, sender: int, message: bytes) -> None:
        """One survivor's signature over ``U3`` (checked; a bad one is rejected)."""
        self._check_stage(Stage.MASKED)
        if not self.config.malicious or sender not in self.u3 or sender in self._survivor_sigs:
            raise IntegrityError()
        signature = wire.decode_survivors_signature(self._env, message, sender=sender)
        self._dir().verify(sender, self._statement, signature)
        self._survivor_sigs[sender] = signature

    def finish_consistency(self) -> dict[int, bytes]:
        """Close round 3; returns the SIGNED_UNMASK_REQUEST for each signer in ``U4``.

        Each carries the signatures of the receiver's neighbours in ``U4``; a receiver with
        fewer than ``t`` of them will refuse to unmask, which the server cannot change.
        """
        self._check_stage(Stage.MASKED)
        if not self.config.malicious:
            raise IntegrityError()
        self.u4 = frozenset(self._survivor_sigs)
        self._require(len(self.u4), "signed the survivor set")
        out = {}
        for i in sorted(self.u4):
            self._classify(i)
            sigs = [(int(j), self._survivor_sigs[int(j)]) for j in self._table[i] if j in self.u4]
            out[i] = wire.encode_signed_unmask_request(self._env, i, sigs)
        self.stage = Stage.CONSISTENT
        return out

    @property
    def dropped(self) -> frozenset[int]:
        """``U2 - U3``: clients masked with by survivors whose masked input never arrived."""
        return self.u2 - self.u3

    # -- round 4 ----------------------------------------------------------------------------

    def receive_unmask_shares(self, sender: int, message: bytes) -> None:
        self._check_stage(self._unmask_stage())
        if sender not in self._requested or sender in self._responded:
            raise IntegrityError()
        shares = wire.decode_unmask_shares(
            self._env, message, sender=sender, n_clients=self.config.n_clients
        )
        if {owner: kind for owner, kind, _ in shares} != self._requested[sender]:
            raise IntegrityError()
        parsed = [(owner, kind, shamir.share_from_bytes(s)) for owner, kind, s in shares]
        for owner, kind, y in parsed:
            self._revealed[(owner, kind)].append((sender + 1, y))
        self._responded.add(sender)

    def finish_unmask(self) -> np.ndarray:
        """Reconstruct, remove the self masks and the dropped clients' pairwise masks.

        Every secret is rebuilt from every share revealed for it and checked before any mask
        is removed: the shares must lie on one polynomial of degree ``< t`` and a dropped
        client's mask key must match its advertised public key.

        Returns:
            The sum of the survivors' inputs modulo ``2**bits`` (a new uint64 ``[dim]``).

        Raises:
            RoundAborted: if some survivor's seed or some dropped client's key has fewer than
                ``t`` revealed shares.
            ShareVerificationFailed: (an :class:`IntegrityError` and a ``RoundAborted``) if
                some revealed share or reconstructed key fails verification.
        """
        self._check_stage(self._unmask_stage())
        t = self.config.t
        try:
            seeds = {u: self._reconstruct(u, self._seed_kind, t) for u in sorted(self.u3)}
            dropped_keys = {}
            for u in sorted(self.dropped):
                sk = X25519PrivateKey.from_private_bytes(
                    self._reconstruct(u, wire.ShareKind.MASK_KEY, t)
                )
                if sk.public_key().public_bytes_raw() != self._keys[u][1]:
                    raise ShareVerificationFailed()
                dropped_keys[u] = sk
        except BaseException:
            self.stage = Stage.ABORTED
            self._revealed.clear()
            raise
        acc = self._acc
        ex = self._expander
        for u, seed in seeds.items():
            key = self_mask_key(seed, session=self._session, round_index=self.round_index, client=u)
            ex.sub(key, acc)
        for u, sk in dropped_keys.items():
            for v in (int(j) for j in self._table[u]):
                if v not in self.u3:
                    continue
                shared = exchange(sk, self._keys[v][1])
                key = pair_mask_key(
                    shared, session=self._session, round_index=self.round_index, a=u, b=v
                )
                if v < u:  # v added +PRG(s_vu); take it out
                    ex.sub(key, acc)
                else:  # v subtracted it
                    ex.add(key, acc)
        total = acc.astype(np.uint64)
        if self.bits < 64:
            total &= np.uint64((1 << self.bits) - 1)
        self.stage = Stage.DONE
        self._revealed.clear()
        return total

    # -- machinery --------------------------------------------------------------------------

    def _reconstruct(self, owner: int, kind: wire.ShareKind, t: int) -> bytes:
        points = self._revealed.get((owner, kind), [])
        if len(points) < t:
            self.stage = Stage.ABORTED
            raise RoundAborted(
                f"client {owner} has {len(points)} revealed shares, fewer than t={t}; "
                "the round is aborted and reveals nothing"
            )
        xs, ys = zip(*points, strict=True)
        try:
            return shamir.reconstruct(xs, ys, threshold=t)
        except IntegrityError:
            raise ShareVerificationFailed() from None

    @property
    def _seed_kind(self) -> wire.ShareKind:
        """The self-mask seed of this round's inputs: ``b``, or ``b'`` after a fallback."""
        return wire.ShareKind.FALLBACK_SEED if self._fallback else wire.ShareKind.SELF_MASK_SEED

    def _unmask_stage(self) -> Stage:
        return Stage.CONSISTENT if self.config.malicious else Stage.MASKED

    def _dir(self) -> IdentityDirectory:
        if self._directory is None:
            raise IntegrityError()
        return self._directory

    def _check_stage(self, expected: Stage) -> None:
        if self.stage is not expected:
            raise IntegrityError()

    def _check_sender(self, sender: int, seen: dict) -> None:
        if not (isinstance(sender, int) and 0 <= sender < self.config.n_clients) or sender in seen:
            raise IntegrityError()

    def _require(self, count: int, what: str) -> None:
        if count < self.config.t:
            self.stage = Stage.ABORTED
            raise RoundAborted(
                f"only {count} clients {what}, fewer than the threshold t={self.config.t}; "
                "the round is aborted and reveals nothing"
            )
