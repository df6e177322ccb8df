"""The server's stage machine (Bonawitz et al. 2017, Fig. 4, server side; SecAgg+ graph).

For each stage call ``receive_*`` once per client message (in any order; a sender's identity
comes from the authenticated channel), then ``finish_*`` to close the stage and obtain the
messages for the next one. ``U1 >= U2 >= U3`` are the clients whose advertise, share and
masked-input messages arrived. A client missing from ``U1`` or ``U2`` simply leaves the graph:
nobody masks with it and nothing of it is reconstructed. The dropped set is ``U2 - U3``, the
clients some survivor masked with but whose masked input never came; the server rebuilds their
mask keys from shares and re-expands only the pairs (dropped, surviving neighbour).
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from protocols.errors import ConfigError, IntegrityError
from protocols.secagg import shamir, wire
from protocols.secagg.client import Stage, exchange, require_modulus
from protocols.secagg.config import SecAggConfig, neighbour_table
from protocols.secagg.errors import RoundAborted, ShareVerificationFailed
from protocols.secagg.primitives import MaskExpander, pair_mask_key, self_mask_key, session_id

_STAGE_NAMES = ("advertise", "share", "masked_input", "unmask")


class SecAggServer:
    """The honest-but-curious aggregator of one round.

    Args:
        config: The round's public parameters (``modulus_bits`` set).
        round_index: Round number.
        public_seed: The round's public seed.
        dim: Length of the input vectors.
        expander: Optional shared :class:`MaskExpander` of length ``dim``.
    """

    def __init__(
        self,
        *,
        config: SecAggConfig,
        round_index: int,
        public_seed: bytes,
        dim: int,
        expander: MaskExpander | None = None,
    ) -> None:
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
        self._requested: dict[int, dict[int, wire.ShareKind]] = {}
        self._revealed: dict[tuple[int, wire.ShareKind], list[tuple[int, int]]] = defaultdict(list)
        self._responded: set[int] = set()
        self.u1: frozenset[int] = frozenset()
        self.u2: frozenset[int] = frozenset()
        self.u3: frozenset[int] = frozenset()

    def neighbours(self, client: int) -> np.ndarray:
        """Client ``client``'s neighbours in the public graph (before any dropout)."""
        return self._table[client]

    # -- round 0 ----------------------------------------------------------------------------

    def receive_advertise(self, sender: int, message: bytes) -> None:
        self._check_stage(Stage.INIT)
        self._check_sender(sender, self._keys)
        self._keys[sender] = wire.decode_advertise(self._env, message, sender=sender)

    def finish_advertise(self) -> dict[int, bytes]:
        """Close round 0; returns the KEYS message for each client in ``U1``."""
        self._check_stage(Stage.INIT)
        self.u1 = frozenset(self._keys)
        self._require(len(self.u1), "advertised keys")
        out = {}
        for i in sorted(self.u1):
            peers = [int(j) for j in self._table[i] if int(j) in self.u1]
            out[i] = wire.encode_keys(self._env, i, [(j, *self._keys[j]) for j in peers])
        self.stage = Stage.ADVERTISED
        return out

    # -- round 1 ----------------------------------------------------------------------------

    def receive_shares(self, sender: int, message: bytes) -> None:
        self._check_stage(Stage.ADVERTISED)
        if sender not in self.u1:
            raise IntegrityError()
        self._check_sender(sender, self._boxes)
        boxes = wire.decode_shares(
            self._env, message, sender=sender, n_clients=self.config.n_clients
        )
        expected = [int(j) for j in self._table[sender] if int(j) in self.u1]
        if [cid for cid, _ in boxes] != expected:
            raise IntegrityError()
        self._boxes[sender] = boxes

    def finish_shares(self) -> dict[int, bytes]:
        """Close round 1; returns the FORWARD message for each client in ``U2``."""
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
        """Close round 2; returns the UNMASK_REQUEST for each survivor in ``U3``."""
        self._check_stage(Stage.SHARED)
        self.u3 = frozenset(self._u3)
        self._require(len(self.u3), "sent masked inputs")
        out = {}
        for i in sorted(self.u3):
            partners = [int(j) for j in self._table[i] if int(j) in self.u2]
            surv = [j for j in partners if j in self.u3]
            drop = [j for j in partners if j not in self.u3]
            self._requested[i] = {j: wire.ShareKind.SELF_MASK_SEED for j in surv} | {
                j: wire.ShareKind.MASK_KEY for j in drop
            }
            out[i] = wire.encode_unmask_request(self._env, i, len(self.u3), surv, drop)
        self.stage = Stage.MASKED
        return out

    @property
    def dropped(self) -> frozenset[int]:
        """``U2 - U3``: clients masked with by survivors whose masked input never arrived."""
        return self.u2 - self.u3

    # -- round 4 ----------------------------------------------------------------------------

    def receive_unmask_shares(self, sender: int, message: bytes) -> None:
        self._check_stage(Stage.MASKED)
        if sender not in self.u3 or sender in self._responded:
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
        self._check_stage(Stage.MASKED)
        t = self.config.t
        try:
            seeds = {
                u: self._reconstruct(u, wire.ShareKind.SELF_MASK_SEED, t) for u in sorted(self.u3)
            }
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
