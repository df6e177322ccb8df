"""The client's stage machine (Bonawitz et al. 2017, Fig. 4, rounds 0-4; SecAgg+ graph).

A :class:`SecAggClient` lives for one round and holds fresh keys. Its methods must be called
in order, once each (``advertise``, ``share_keys``, ``masked_input``, in malicious mode
``consistency``, then ``unmask``); any out-of-order or repeated call, malformed message or
failed check moves it to ``ABORTED`` (secrets wiped) and raises, after which it answers
nothing.

Eager masking (semi-honest mode; securefed's, not Bonawitz et al.'s): ``share_keys(...,
eager=True)`` also shares a second self-mask seed ``b'``, and the client then sends
``eager_masked_input``, its input masked with ``b`` and every neighbour whose keys it received,
in the same message as its shares. If every one of those neighbours delivered shares too, the
server asks for the unmasking shares at once and sends the forwarded share boxes with that
request (``unmask(request, forward)``): one exchange fewer per round. Otherwise the server
discards every eager input and the round goes on as in the paper (``masked_input`` with the
FORWARD message, then ``unmask``) with ``b'`` as the self mask, and the unmask stage reveals
shares of ``b'``, never of ``b``: the server can unmask at most one of a client's two inputs
(docs/secagg.md, "Eager masking", has the argument and the attack this prevents).

In ``mode="malicious"`` (Bonawitz et al. §4, active adversary; see docs/secagg.md) the client
also holds its long-term :class:`~protocols.secagg.identity.ClientIdentity` and the enrollment's
:class:`~protocols.secagg.identity.IdentityDirectory`: it signs its advertisement, verifies
every neighbour's advertisement before any key agreement or share, signs the survivor set the
server announces and reveals unmasking shares only after ``t`` neighbours' signatures over that
same set.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from enum import Enum
from typing import TypeVar

import numpy as np
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

from protocols.errors import ConfigError, IntegrityError
from protocols.secagg import shamir, wire
from protocols.secagg.config import SecAggConfig, neighbour_table
from protocols.secagg.errors import ClientAborted
from protocols.secagg.identity import ClientIdentity, IdentityDirectory
from protocols.secagg.primitives import (
    MaskExpander,
    open_sealed,
    pair_mask_key,
    seal,
    self_mask_key,
    session_id,
    share_box_keys,
)

_T = TypeVar("_T")


class Stage(Enum):
    """Where a party is in the round."""

    INIT = "init"
    ADVERTISED = "advertised"
    SHARED = "shared"
    MASKED = "masked"
    EAGER = "eager"  # shares sent with an input masked towards every advertised neighbour
    CONSISTENT = "consistent"  # malicious mode: survivor set signed (Bonawitz et al. round 3)
    DONE = "done"
    ABORTED = "aborted"


def exchange(private: X25519PrivateKey, public_bytes: bytes) -> bytes:
    """X25519 shared secret; invalid or low-order peer keys raise :class:`IntegrityError`."""
    try:
        return private.exchange(X25519PublicKey.from_public_bytes(public_bytes))
    except ValueError:
        raise IntegrityError() from None


def _need(value: _T | None) -> _T:
    """A secret of an earlier stage; missing means the stage machine was bypassed."""
    if value is None:
        raise IntegrityError()
    return value


def require_modulus(config: SecAggConfig) -> int:
    if config.modulus_bits is None:
        raise ConfigError(
            "SecAggConfig.modulus_bits is None; set it to FixedPointCodec.modulus_bits"
        )
    return config.modulus_bits


class SecAggClient:
    """One honest client of one round.

    Args:
        client_id: This client's id in ``[0, n_clients)``.
        config: The round's public parameters (``modulus_bits`` set).
        round_index: Round number (bound into every key and message).
        public_seed: The round's public seed (graph and session id).
        dim: Length of the input vector.
        expander: Optional shared :class:`MaskExpander` of length ``dim`` (saves allocations
            when many clients are simulated in one process).
        identity: This client's long-term signing key from enrollment (malicious mode only;
            required there).
        directory: The enrolled clients' verification keys, from the enrollment step and never
            from the server (malicious mode only; required there).
    """

    _c_sk: X25519PrivateKey | None
    _s_sk: X25519PrivateKey | None
    _b: bytes | None
    _b2: bytes | None  # eager masking's fallback self-mask seed b'
    _own_keys: tuple[bytes, ...]
    _s_pks: dict[int, bytes] | None
    _box_in: dict[int, bytes] | None
    _held: dict[int, tuple[bytes, ...]] | None
    _survivors: frozenset[int] | None
    _statement: bytes | None

    def __init__(
        self,
        client_id: int,
        *,
        config: SecAggConfig,
        round_index: int,
        public_seed: bytes,
        dim: int,
        expander: MaskExpander | None = None,
        identity: ClientIdentity | None = None,
        directory: IdentityDirectory | None = None,
    ) -> None:
        if not 0 <= client_id < config.n_clients:
            raise ConfigError(f"client_id must be in [0, {config.n_clients}), got {client_id!r}")
        if config.malicious:
            if identity is None or directory is None:
                raise ConfigError(
                    "mode='malicious' needs the client's enrolled identity and the identity "
                    "directory; pass identity= and directory= (see protocols.secagg.identity)"
                )
            if identity.client_id != client_id or (
                directory.public_keys.get(client_id) != identity.public_key
            ):
                raise ConfigError(
                    f"identity of client {identity.client_id} does not match client {client_id}'s "
                    "enrolled key in the directory"
                )
        self._identity = identity
        self._directory = directory
        self.id = client_id
        self.config = config
        self.bits = require_modulus(config)
        self.dim = dim
        self.round_index = round_index
        self._session = session_id(public_seed, round_index)
        self._env = wire.Envelope(session=self._session, round_index=round_index)
        table = neighbour_table(self._session, config.n_clients, config.k)
        self.neighbours = frozenset(int(j) for j in table[client_id])
        word = wire.ring_dtype(self.bits)
        self._expander = expander if expander is not None else MaskExpander(dim, word)
        if self._expander.dim != dim or self._expander.dtype != word:
            raise ConfigError(
                f"expander must have dim {dim} and dtype {word}, got "
                f"{self._expander.dim} and {self._expander.dtype}"
            )
        self.stage = Stage.INIT
        self._eager = False  # shares carry b' (share_keys(eager=True))
        self._fallback = False  # the eager round fell back: b' masks, b' shares revealed
        self._wipe()

    def __repr__(self) -> str:
        return f"SecAggClient(id={self.id}, round={self.round_index}, stage={self.stage.value})"

    # -- stages -----------------------------------------------------------------------------

    def advertise(self) -> bytes:
        """Round 0: fresh key pairs ``(c, s)`` and self-mask seed ``b``; send both public keys."""
        with self._stage_step(Stage.INIT, Stage.ADVERTISED):
            c_sk, s_sk = X25519PrivateKey.generate(), X25519PrivateKey.generate()
            self._c_sk, self._s_sk = c_sk, s_sk
            self._b = os.urandom(shamir.SECRET_BYTES)
            self._own_keys = (
                c_sk.public_key().public_bytes_raw(),
                s_sk.public_key().public_bytes_raw(),
            )
            if self.config.malicious:
                c_pk, s_pk = self._own_keys
                statement = wire.advertise_statement(self._env, self.id, c_pk, s_pk)
                signature = _need(self._identity).sign(statement)
                return wire.encode_signed_advertise(self._env, self.id, c_pk, s_pk, signature)
            return wire.encode_advertise(self._env, self.id, *self._own_keys)

    def share_keys(self, keys_message: bytes, *, eager: bool = False) -> bytes:
        """Round 1: t-of-k shares of ``b`` and of ``s_sk`` for each neighbour, AES-GCM sealed.

        ``eager`` (semi-honest mode): also shares of a fresh fallback seed ``b'``, for
        :meth:`eager_masked_input` (which needs them) and its fallback.

        In malicious mode every neighbour's advertisement must carry its valid Ed25519
        signature under the directory's key (Bonawitz et al. §4, round 1: "verify all
        signatures"); one bad or missing signature aborts (:class:`IntegrityError`) before any
        key agreement, share or box is computed.
        """
        with self._stage_step(Stage.ADVERTISED, Stage.SHARED):
            if eager and self.config.malicious:  # the consistency round needs the paper's
                raise IntegrityError()
            entries = self._verified_keys(keys_message)
            ids = [cid for cid, _, _ in entries]
            if not set(ids) <= self.neighbours:
                raise IntegrityError()
            all_keys = [k for _, c_pk, s_pk in entries for k in (c_pk, s_pk)]
            all_keys += list(self._own_keys)
            if len(set(all_keys)) != len(all_keys):
                raise IntegrityError()
            if len(ids) < self.config.t:
                raise ClientAborted(
                    f"only {len(ids)} neighbours advertised keys, fewer than the threshold "
                    f"t={self.config.t}"
                )
            xs = [cid + 1 for cid in ids]
            c_sk, s_sk, seed = _need(self._c_sk), _need(self._s_sk), _need(self._b)
            sk_bytes = s_sk.private_bytes_raw()
            b_shares = shamir.split(seed, xs, self.config.t)
            sk_shares = shamir.split(sk_bytes, xs, self.config.t)
            del sk_bytes
            b2_shares: list[int | None] = [None] * len(xs)
            if eager:
                self._b2 = os.urandom(shamir.SECRET_BYTES)
                b2_shares = list(shamir.split(self._b2, xs, self.config.t))
            boxes = []
            s_pks: dict[int, bytes] = {}
            box_in: dict[int, bytes] = {}
            for j, (cid, c_pk, s_pk) in enumerate(entries):
                shared = exchange(c_sk, c_pk)
                k_out, k_in = share_box_keys(
                    shared, session=self._session, round_index=self.round_index, a=self.id, b=cid
                )
                box_in[cid] = k_in
                s_pks[cid] = s_pk
                plaintext = wire.pack_share_plaintext(
                    self.id, cid, b_shares[j], sk_shares[j], b2_shares[j]
                )
                ad = wire.share_associated_data(self._env, self.id, cid)
                boxes.append((cid, seal(k_out, plaintext, ad)))
            self._s_pks, self._box_in = s_pks, box_in
            self._eager = eager
            self._c_sk = None  # only needed for the share boxes
            return wire.encode_shares(self._env, self.id, boxes)

    def eager_masked_input(self, x: np.ndarray) -> bytes:
        """Rounds 1 and 2 in one message (eager masking, semi-honest mode only): ``x``
        masked as in :meth:`masked_input`, towards every neighbour whose keys came in round 1.

        Called right after ``share_keys(..., eager=True)``; its message travels with the
        shares. The client then answers either :meth:`unmask` with the forwarded share boxes
        (every neighbour it masked with delivered shares) or, when someone did not, the
        paper's :meth:`masked_input` with the fallback seed ``b'`` as its self mask (``s_sk``
        and ``b'`` are kept for it).

        Args:
            x: This client's ring-encoded input, uint64 ``[dim]`` with values ``< 2**bits``.
        """
        self._check_input(x)
        with self._stage_step(Stage.SHARED, Stage.EAGER):
            if self.config.malicious or not self._eager:  # no b' shared: no safe fallback
                raise IntegrityError()
            acc = self._mask(x, _need(self._s_pks), _need(self._b))
            self._b = None  # used; a fallback masks with b'
            return wire.encode_masked_input(self._env, self.id, acc, self.bits)

    def masked_input(self, forward_message: bytes, x: np.ndarray) -> bytes:
        """Round 2: ``y = x + PRG(b) + sum_{v>u} PRG(s_uv) - sum_{v<u} PRG(s_uv) mod 2**bits``.

        Also the fallback after :meth:`eager_masked_input` when some neighbour delivered no
        shares (the server discards the eager input): then the self mask is ``PRG(b')``, and
        :meth:`unmask` reveals shares of ``b'``. The eager input, masked with ``b`` and with
        pairwise masks the server chose fewer of here, stays padded by ``PRG(b)`` for good.

        Args:
            forward_message: The server's FORWARD message (shares from neighbours that
                completed round 1; these are exactly the neighbours this client masks with).
            x: This client's ring-encoded input, uint64 ``[dim]`` with values ``< 2**bits``.
        """
        self._check_input(x)
        with self._stage_step((Stage.SHARED, Stage.EAGER), Stage.MASKED):
            held = self._open_forward(forward_message)
            s_pks = _need(self._s_pks)
            self._fallback = self.stage is Stage.EAGER
            seed = _need(self._b2) if self._fallback else _need(self._b)
            acc = self._mask(x, {cid: s_pks[cid] for cid in held}, seed)
            self._held = held
            self._s_sk = None  # recoverable from shares if this client drops; no longer needed
            self._b = None
            self._b2 = None
            self._box_in = None
            return wire.encode_masked_input(self._env, self.id, acc, self.bits)

    def consistency(self, survivors_message: bytes) -> bytes:
        """Round 3 (malicious mode): sign the survivor set ``U3`` the server announces.

        Bonawitz et al. 2017 §4, Fig. 4 round 3 ("ConsistencyCheck"). Before signing, the
        client checks the set names itself, that every neighbour it names is one this client
        masked with, that it names at least ``t`` of its neighbours, and that it names at
        least :attr:`SecAggConfig.min_survivors` clients (otherwise it aborts:
        :class:`ClientAborted`, nothing signed). The set is kept; round 4 releases
        shares only after ``t`` neighbours' signatures over exactly this set, and classifies
        its neighbours as survivors or dropped by it.
        """
        with self._stage_step(Stage.MASKED, Stage.CONSISTENT):
            if not self.config.malicious:
                raise IntegrityError()
            survivors = wire.decode_survivors(
                self._env, survivors_message, receiver=self.id, n_clients=self.config.n_clients
            )
            surv = frozenset(survivors)
            held = _need(self._held)
            if self.id not in surv:
                raise ClientAborted("survivor set does not name this client")
            named = surv & self.neighbours
            if not named <= set(held):
                raise ClientAborted("survivor set names a neighbour this client did not mask with")
            if len(named) < self.config.t:
                raise ClientAborted(
                    f"survivor set names {len(named)} of this client's neighbours, fewer than "
                    f"t={self.config.t}"
                )
            if len(surv) < self.config.min_survivors:
                raise ClientAborted(
                    f"survivor set names {len(surv)} clients, fewer than the "
                    f"{self.config.min_survivors} the round is sized for"
                )
            statement = wire.survivors_statement(self._env, survivors)
            signature = _need(self._identity).sign(statement)
            self._survivors, self._statement = surv, statement
            return wire.encode_survivors_signature(self._env, self.id, signature)

    def unmask(self, request_message: bytes, forward_message: bytes | None = None) -> bytes:
        """Round 4: reveal ``b``-shares of surviving and ``s_sk``-shares of dropped neighbours
        (``b'``-shares of surviving ones after an eager round's fallback).

        After :meth:`eager_masked_input` (and no fallback) ``forward_message`` is the FORWARD
        message the paper's round 2 would have carried: the client opens its boxes first, and
        aborts unless they come from exactly the neighbours it masked with and the request
        names none of them dropped (every one of them sent its input with its shares).

        Aborts (:class:`ClientAborted`) if the request names a client both survivor and
        dropped, names this client dropped, claims fewer than ``t`` survivors, or does not
        classify exactly the neighbours this client masked with. Never reveals both shares of
        one client: each owner appears once, and the client answers only one request (of
        ``b``, ``b'`` and ``s_sk``, one share per neighbour).

        In malicious mode the request is the neighbours' signatures over the survivor set of
        round 3: every entry must be a neighbour named in that set with a valid signature over
        it (else :class:`IntegrityError`), and at least ``t`` must be present (else
        :class:`ClientAborted`); the survivors and dropped neighbours are then the signed set's,
        not the server's word.
        """
        if self.config.malicious:
            if forward_message is not None:  # no eager masking in malicious mode
                self._abort()
                raise IntegrityError()
            return self._unmask_signed(request_message)
        if self.stage is Stage.EAGER:
            return self._unmask_eager(request_message, forward_message)
        with self._stage_step(Stage.MASKED, Stage.DONE):
            if forward_message is not None:
                raise IntegrityError()
            held = _need(self._held)
            return self._reveal(held, self._classified(request_message, held, eager=False))

    # -- machinery --------------------------------------------------------------------------

    def _check_input(self, x: np.ndarray) -> None:
        x = np.asarray(x)
        if x.dtype != np.uint64 or x.shape != (self.dim,):
            raise ConfigError(f"x must be a uint64 array of shape ({self.dim},)")
        if self.bits < 64 and int(x.max()) >> self.bits:
            raise ConfigError(f"x must be reduced modulo 2**{self.bits}")

    def _open_forward(self, forward_message: bytes) -> dict[int, tuple[bytes, ...]]:
        """The neighbours' shares for this client from a FORWARD message (at least ``t``):
        ``(b, s_sk)`` or, with eager masking, ``(b, s_sk, b')`` per neighbour."""
        entries = wire.decode_forward(
            self._env,
            forward_message,
            receiver=self.id,
            n_clients=self.config.n_clients,
            eager=self._eager,
        )
        unpack = wire.unpack_eager_share_plaintext if self._eager else wire.unpack_share_plaintext
        box_in = _need(self._box_in)
        held: dict[int, tuple[bytes, ...]] = {}
        for cid, ct in entries:
            key = box_in.get(cid)
            if key is None:
                raise IntegrityError()
            ad = wire.share_associated_data(self._env, cid, self.id)
            plaintext = open_sealed(key, ct, ad)
            held[cid] = unpack(plaintext, sender=cid, receiver=self.id)
        if len(held) < self.config.t:
            raise ClientAborted(
                f"only {len(held)} neighbours completed key sharing, fewer than the "
                f"threshold t={self.config.t}"
            )
        return held

    def _mask(self, x: np.ndarray, s_pks: dict[int, bytes], seed: bytes) -> np.ndarray:
        """``x + PRG(seed)`` plus the pairwise masks towards ``s_pks`` (the expander's
        buffer); ``seed`` is ``b``, or ``b'`` in an eager round's fallback."""
        s_sk = _need(self._s_sk)
        ex = self._expander
        acc = ex.acc
        self_key = self_mask_key(
            seed, session=self._session, round_index=self.round_index, client=self.id
        )
        np.add(np.asarray(x), ex.expand(self_key), out=acc, casting="unsafe")  # mod 2**word
        for cid in sorted(s_pks):
            shared = exchange(s_sk, s_pks[cid])
            key = pair_mask_key(
                shared, session=self._session, round_index=self.round_index, a=self.id, b=cid
            )
            if cid > self.id:
                ex.add(key, acc)
            else:
                ex.sub(key, acc)
        return acc

    def _classified(
        self, request_message: bytes, held: dict[int, tuple[bytes, ...]], *, eager: bool
    ) -> set[int]:
        """The surviving neighbours of an UNMASK_REQUEST, after its checks."""
        total, survivors, dropped = wire.decode_unmask_request(
            self._env, request_message, receiver=self.id, n_clients=self.config.n_clients
        )
        surv, drop = set(survivors), set(dropped)
        if surv & drop:
            raise ClientAborted("unmask request names a client both survivor and dropped")
        if self.id in drop or self.id in surv:
            raise ClientAborted("unmask request lists this client among its neighbours")
        if total < self.config.t:
            raise ClientAborted(
                f"unmask request names {total} survivors, fewer than t={self.config.t}"
            )
        if total < len(surv) + 1:
            raise ClientAborted("unmask request's survivor count is inconsistent")
        if surv | drop != set(held):
            raise ClientAborted(
                "unmask request does not classify exactly the neighbours this client masked with"
            )
        if eager and drop:
            raise ClientAborted(
                "eager unmask request names a neighbour dropped; its input came with its shares"
            )
        return surv

    def _unmask_eager(self, request_message: bytes, forward_message: bytes | None) -> bytes:
        with self._stage_step(Stage.EAGER, Stage.DONE):
            if forward_message is None:
                raise IntegrityError()
            held = self._open_forward(forward_message)
            if set(held) != set(_need(self._s_pks)):
                raise ClientAborted(
                    "the server unmasks eagerly but a neighbour this client masked with sent "
                    "no shares"
                )
            return self._reveal(held, self._classified(request_message, held, eager=True))

    def _verified_keys(self, keys_message: bytes) -> list[tuple[int, bytes, bytes]]:
        """The KEYS entries; in malicious mode each signature is checked first."""
        if not self.config.malicious:
            return wire.decode_keys(
                self._env, keys_message, receiver=self.id, n_clients=self.config.n_clients
            )
        signed = wire.decode_signed_keys(
            self._env, keys_message, receiver=self.id, n_clients=self.config.n_clients
        )
        directory = _need(self._directory)
        for cid, c_pk, s_pk, signature in signed:
            directory.verify(cid, wire.advertise_statement(self._env, cid, c_pk, s_pk), signature)
        return [(cid, c_pk, s_pk) for cid, c_pk, s_pk, _ in signed]

    def _unmask_signed(self, request_message: bytes) -> bytes:
        with self._stage_step(Stage.CONSISTENT, Stage.DONE):
            entries = wire.decode_signed_unmask_request(
                self._env, request_message, receiver=self.id, n_clients=self.config.n_clients
            )
            surv, statement = _need(self._survivors), _need(self._statement)
            directory = _need(self._directory)
            signers = surv & self.neighbours
            for cid, signature in entries:
                if cid not in signers:
                    raise IntegrityError()
                directory.verify(cid, statement, signature)
            if len(entries) < self.config.t:
                raise ClientAborted(
                    f"only {len(entries)} neighbours signed the survivor set, fewer than "
                    f"t={self.config.t}"
                )
            return self._reveal(_need(self._held), surv)

    def _reveal(self, held: dict[int, tuple[bytes, ...]], surv: frozenset[int] | set[int]) -> bytes:
        """One share per neighbour masked with: ``b`` if it survived (``b'`` after a
        fallback, when every survivor's input carries ``PRG(b')``), else ``s_sk``."""
        out = []
        for owner in sorted(held):
            shares = held[owner]
            if owner not in surv:
                out.append((owner, wire.ShareKind.MASK_KEY, shares[1]))
            elif self._fallback:
                out.append((owner, wire.ShareKind.FALLBACK_SEED, shares[2]))
            else:
                out.append((owner, wire.ShareKind.SELF_MASK_SEED, shares[0]))
        return wire.encode_unmask_shares(self._env, self.id, out)

    @contextmanager
    def _stage_step(self, expected: Stage | tuple[Stage, ...], after: Stage) -> Iterator[None]:
        if self.stage not in (expected if isinstance(expected, tuple) else (expected,)):
            self._abort()
            raise IntegrityError()
        try:
            yield
        except BaseException:
            self._abort()
            raise
        self.stage = after
        if after is Stage.DONE:
            self._wipe()

    def _abort(self) -> None:
        self.stage = Stage.ABORTED
        self._wipe()

    def _wipe(self) -> None:
        self._c_sk = None
        self._s_sk = None
        self._b = None
        self._b2 = None
        self._own_keys = ()
        self._s_pks = None
        self._box_in = None
        self._held = None
        self._survivors = None
        self._statement = None
