"""Errors specific to secure aggregation (all in the :mod:`protocols.errors` hierarchy)."""

from __future__ import annotations

from protocols.errors import IntegrityError, ProtocolError


class RoundAborted(ProtocolError):
    """The round cannot produce a sum: fewer than ``t`` clients (or shares) survived.

    Nothing about any client's input is revealed when this is raised. The caller catches it,
    leaves the global model unchanged and continues with the next round.
    """


class ClientAborted(ProtocolError):
    """An honest client refused to continue because the server's request was unsafe.

    Raised by a client's stage machine when the server asks it to reveal shares that could
    unmask an individual input (a client named both survivor and dropped, or fewer than ``t``
    survivors). The message names the rule that was violated, never a key or share.
    """


class ShareVerificationFailed(RoundAborted, IntegrityError):
    """The server rejected the revealed shares: the round is aborted and reveals nothing.

    Raised by :meth:`SecAggServer.finish_unmask` when the shares revealed for one secret do
    not lie on one polynomial of degree ``< t`` or a reconstructed mask key does not match
    its owner's advertised public key. Both are verification failures, so this is an
    :class:`IntegrityError` with its one fixed message; it is also a :class:`RoundAborted`,
    so a caller that keeps the model and moves on after an abort does the same here. Only a
    client that lies about a share causes it.
    """
