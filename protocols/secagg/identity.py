"""Long-term client identities for the malicious mode: Ed25519 keys and the enrollment directory.

Against an actively malicious server, Bonawitz et al. (CCS 2017, §4, "Active adversary"; Fig. 4
rounds 0, 1 and 3) assume a PKI: every client holds a long-term signing key, every client knows
every other client's verification key, and the server cannot change that mapping. Here:

* :class:`ClientIdentity` is one client's long-term Ed25519 key pair (RFC 8032, via
  ``cryptography``), created once at enrollment and kept on the device across rounds;
* :class:`IdentityDirectory` maps client ids to their 32-byte Ed25519 public keys. Clients
  receive it from the enrollment step (an authority, or keys provisioned with the app), **not**
  from the aggregation server at round time: a directory relayed by the server would let the
  server substitute keys exactly as it could substitute the X25519 keys without signatures.

What is signed, and the byte strings that are signed, are in :mod:`protocols.secagg.wire`
(``advertise_statement``, ``survivors_statement``). Verification failures of any kind
(unknown client, malformed key, wrong signature) raise one :class:`IntegrityError`, so a
forger learns nothing from which check failed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from protocols.errors import ConfigError, IntegrityError

PUBLIC_KEY_BYTES = 32
SIGNATURE_BYTES = 64


class ClientIdentity:
    """One client's long-term Ed25519 signing key (private: never leaves the client).

    Args:
        client_id: The enrolled client's id.
        private_key: Its Ed25519 private key; use :meth:`generate` for a fresh one.
    """

    __slots__ = ("_sk", "client_id", "public_key")

    def __init__(self, client_id: int, private_key: Ed25519PrivateKey) -> None:
        if isinstance(client_id, bool) or not isinstance(client_id, int) or client_id < 0:
            raise ConfigError(f"client_id must be an int >= 0, got {client_id!r}")
        if not isinstance(private_key, Ed25519PrivateKey):
            raise ConfigError("private_key must be an Ed25519PrivateKey")
        self.client_id = client_id
        self._sk = private_key
        self.public_key: bytes = private_key.public_key().public_bytes_raw()

    @classmethod
    def generate(cls, client_id: int) -> ClientIdentity:
        """A fresh key pair from the OS's randomness (what a device does at enrollment)."""
        return cls(client_id, Ed25519PrivateKey.generate())

    def sign(self, statement: bytes) -> bytes:
        """The 64-byte Ed25519 signature of ``statement``."""
        return self._sk.sign(statement)

    def __repr__(self) -> str:
        return f"ClientIdentity(client_id={self.client_id})"


class IdentityDirectory:
    """The enrolled clients' Ed25519 verification keys, by client id (public, immutable).

    Args:
        public_keys: ``client id -> 32-byte raw Ed25519 public key``.

    Raises:
        ConfigError: a key of the wrong length, not a valid Ed25519 point, or two clients
            sharing one key.
    """

    __slots__ = ("_keys", "_raw")

    def __init__(self, public_keys: Mapping[int, bytes]) -> None:
        raw: dict[int, bytes] = {}
        keys: dict[int, Ed25519PublicKey] = {}
        for cid, pk in sorted(public_keys.items()):
            if isinstance(cid, bool) or not isinstance(cid, int) or cid < 0:
                raise ConfigError(f"client ids must be ints >= 0, got {cid!r}")
            if not isinstance(pk, bytes) or len(pk) != PUBLIC_KEY_BYTES:
                raise ConfigError(
                    f"client {cid}'s public key must be {PUBLIC_KEY_BYTES} bytes of raw Ed25519"
                )
            try:
                keys[cid] = Ed25519PublicKey.from_public_bytes(pk)
            except ValueError:
                raise ConfigError(f"client {cid}'s public key is not an Ed25519 key") from None
            raw[cid] = pk
        if len(set(raw.values())) != len(raw):
            raise ConfigError("two enrolled clients share one public key; re-enroll them")
        self._raw: Mapping[int, bytes] = MappingProxyType(raw)
        self._keys = keys

    @classmethod
    def from_identities(cls, identities: Iterable[ClientIdentity]) -> IdentityDirectory:
        """The directory of the given enrolled clients' public keys."""
        return cls({ident.client_id: ident.public_key for ident in identities})

    @property
    def public_keys(self) -> Mapping[int, bytes]:
        """Read-only ``client id -> raw public key``."""
        return self._raw

    def __contains__(self, client_id: object) -> bool:
        return client_id in self._raw

    def __len__(self) -> int:
        return len(self._raw)

    def covers(self, n_clients: int) -> bool:
        """True when every id in ``[0, n_clients)`` is enrolled."""
        return all(i in self._raw for i in range(n_clients))

    def verify(self, client_id: int, statement: bytes, signature: bytes) -> None:
        """Check ``signature`` is ``client_id``'s Ed25519 signature of ``statement``.

        Raises:
            IntegrityError: (one fixed message) unknown client, malformed or wrong signature.
        """
        key = self._keys.get(client_id)
        if key is None or len(signature) != SIGNATURE_BYTES:
            raise IntegrityError()
        try:
            key.verify(bytes(signature), statement)
        except InvalidSignature:
            raise IntegrityError() from None

    def __repr__(self) -> str:
        return f"IdentityDirectory({len(self._raw)} clients)"


def enroll(n_clients: int) -> tuple[tuple[ClientIdentity, ...], IdentityDirectory]:
    """Enroll clients ``0 .. n_clients - 1`` in one process (simulation and tests).

    A deployment enrolls each device on the device (:meth:`ClientIdentity.generate`), collects
    the public keys through an authenticated enrollment channel and ships the resulting
    :class:`IdentityDirectory` to every client; this helper does the same in one place.

    Returns:
        The identities (index = client id) and the directory of their public keys.
    """
    if isinstance(n_clients, bool) or not isinstance(n_clients, int) or n_clients < 1:
        raise ConfigError(f"n_clients must be an int >= 1, got {n_clients!r}")
    identities = tuple(ClientIdentity.generate(i) for i in range(n_clients))
    return identities, IdentityDirectory.from_identities(identities)
