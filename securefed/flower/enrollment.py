"""Long-term user identities for malicious-mode secure aggregation on Flower (enrollment).

Against a server that may substitute the keys it relays or equivocate about survivors,
``privacy.secagg_mode = "malicious"`` runs Bonawitz et al.'s active-adversary protocol
(:mod:`protocols.secagg`, docs/secagg.md "Malicious mode"): every user signs its round key
advertisement and the survivor set with a long-term Ed25519 key, and checks its peers'
signatures against an **enrollment directory** (user id -> public key) that it got out of
band, never from the aggregation server at round time. Here:

* each node creates its users' key pairs once (:func:`enroll_users`) and keeps the private
  keys in its own state directory (``identity-keys.json``, mode 0600): they never leave it;
* the public keys of every node are gathered by the operator into one directory file
  (:func:`write_directory`, ``enrollment.json``) and given to every node and to the server
  (``--node-config 'enrollment="..."'``, the ServerApp's run config ``enrollment``);
* in a round, secure-aggregation ids are positions in the cohort, so each side maps the
  cohort's users to their enrolled keys (:func:`round_directory`, :func:`round_identities`).

A server that lies about the cohort cannot forge a signature: an advertisement verifies only
under the key enrolled for the user the verifier believes holds that position, and the
server holds no user's private key. The directory's authenticity is the operator's job
(signed, or copied over a trusted channel); a directory the server could rewrite would undo
the mode. ``securefed flower local`` enrolls its nodes itself (the whole deployment is one
operator's).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from protocols.secagg.identity import ClientIdentity, IdentityDirectory
from securefed import runs
from securefed.errors import ConfigError, ProtocolError

#: A node's users' private signing keys, inside its state directory.
KEYS_FILE = "identity-keys.json"
#: The enrollment directory an operator gathers (user id -> public key).
DIRECTORY_FILE = "enrollment.json"
_FORMAT = "securefed-enrollment/1"


#: What reading a keys file that is missing or not ours raises (:func:`_read_keys`).
_UNREADABLE = (OSError, ValueError, KeyError, TypeError, AttributeError)


def _read_keys(path: Path, field: str) -> dict[int, bytes]:
    """``user id -> raw key`` of a keys file of ours (``field``: ``private_keys`` or
    ``public_keys``); raises one of :data:`_UNREADABLE` otherwise."""
    record = json.loads(path.read_text(encoding="utf-8"))
    if record.get("format") != _FORMAT:
        raise ValueError(f"not {_FORMAT}")
    return {int(u): bytes.fromhex(h) for u, h in record[field].items()}


def enroll_users(users: Iterable[int], state_dir: str | Path) -> dict[int, bytes]:
    """Long-term Ed25519 keys for ``users`` on this node: created once from the OS's
    randomness and kept (private keys, mode 0600) in ``state_dir/identity-keys.json``; users
    enrolled before keep their keys. Returns every listed user's raw public key."""
    path = Path(state_dir) / KEYS_FILE
    keys = load_private_keys(state_dir) if path.exists() else {}
    added = False
    for u in users:
        if int(u) not in keys:
            keys[int(u)] = Ed25519PrivateKey.generate()
            added = True
    if added:
        raw = {str(u): k.private_bytes_raw().hex() for u, k in sorted(keys.items())}
        path.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps({"format": _FORMAT, "private_keys": raw})
        runs.atomic_write_text(path, text)
        os.chmod(path, 0o600)
    return {int(u): keys[int(u)].public_key().public_bytes_raw() for u in users}


def load_private_keys(state_dir: str | Path) -> dict[int, Ed25519PrivateKey]:
    """The node's users' private keys (:func:`enroll_users`).

    Raises:
        ConfigError: the file is missing or malformed.
    """
    path = Path(state_dir) / KEYS_FILE
    try:
        raw = _read_keys(path, "private_keys")
        return {u: Ed25519PrivateKey.from_private_bytes(k) for u, k in raw.items()}
    except _UNREADABLE:
        raise ConfigError(
            f"{path} holds no enrolled user keys; enroll this node's users first "
            "(securefed.flower.enrollment.enroll_users, docs/deployment.md)"
        ) from None


def write_directory(path: str | Path, public_keys: Mapping[int, bytes]) -> Path:
    """Write the enrollment directory (every node's users' public keys) to ``path``."""
    IdentityDirectory(dict(public_keys))  # refuses malformed or shared keys
    path = Path(path)
    keys = {str(u): pk.hex() for u, pk in sorted(public_keys.items())}
    text = json.dumps({"format": _FORMAT, "public_keys": keys})
    runs.atomic_write_text(path, text)
    return path


def load_directory(path: str | Path) -> dict[int, bytes]:
    """The enrollment directory's ``user id -> raw Ed25519 public key``.

    Raises:
        ConfigError: the file is missing or malformed, or two users share a key.
    """
    try:
        keys = _read_keys(Path(path), "public_keys")
    except _UNREADABLE:
        raise ConfigError(
            f"{path} is not an enrollment directory; give the file "
            "securefed.flower.enrollment.write_directory wrote"
        ) from None
    IdentityDirectory(keys)
    return keys


def enroll_partitions(n_users: int, state_dirs: list[Path], directory: str | Path) -> Path:
    """Enroll every user of ``len(state_dirs)`` partitions, one node each (the keys of
    partition ``p``'s users in ``state_dirs[p]``), and write the directory of all public
    keys to ``directory``: what an operator does by hand across machines, in one place for a
    local deployment and tests."""
    from securefed.flower.node import partition_users

    public: dict[int, bytes] = {}
    for p, state in enumerate(state_dirs):
        users = partition_users(n_users, p, len(state_dirs)).tolist()
        public.update(enroll_users(users, state))
    return write_directory(directory, public)


def round_directory(cohort: Iterable[int], public_keys: Mapping[int, bytes]) -> IdentityDirectory:
    """The round's directory: secure-aggregation id (cohort position) -> its user's key.

    Raises:
        ProtocolError: a user of the cohort is not enrolled.
    """
    by_sid: dict[int, bytes] = {}
    for sid, user in enumerate(cohort):
        key = public_keys.get(int(user))
        if key is None:
            raise ProtocolError(
                f"user {int(user)} of the round's cohort is not in the enrollment directory; "
                "enroll every user before a malicious-mode run"
            )
        by_sid[sid] = key
    return IdentityDirectory(by_sid)


def round_identities(
    cohort: Iterable[int], own: Iterable[int], private_keys: Mapping[int, Ed25519PrivateKey]
) -> dict[int, ClientIdentity]:
    """This node's users' identities in the round, by secure-aggregation id.

    Raises:
        ConfigError: a user of this node has no key here.
    """
    mine = {int(u) for u in own}
    out: dict[int, ClientIdentity] = {}
    for sid, user in enumerate(cohort):
        if int(user) not in mine:
            continue
        key = private_keys.get(int(user))
        if key is None:
            raise ConfigError(
                f"user {int(user)} has no enrolled key on this node; enroll it "
                "(securefed.flower.enrollment.enroll_users)"
            )
        out[sid] = ClientIdentity(sid, key)
    return out


__all__ = [
    "DIRECTORY_FILE",
    "KEYS_FILE",
    "enroll_partitions",
    "enroll_users",
    "load_directory",
    "load_private_keys",
    "round_directory",
    "round_identities",
    "write_directory",
]
