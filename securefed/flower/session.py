"""One round's secrets on a node, kept between the messages of a round.

The round's SecAgg stage machines (fresh X25519 key pairs, the self-mask seed, received
shares) and the encoded inputs. In securefed's long-lived ClientApp process
(:mod:`securefed.flower.worker`, the local deployment's default) the session stays a live
object in that process's memory (:class:`~securefed.flower.messages.NodeMemory`). Where Flower
runs a ``ClientApp`` in a fresh process per message (its ``subprocess`` isolation) or lets
virtual nodes share worker processes (the simulation engine), it is kept in the node's
``Context.state``, which Flower holds in the SuperNode's memory (never on disk), as the bytes
of :meth:`NodeSession.freeze`. This module imports no model code, so the three
SecAgg stages start fast.
"""

from __future__ import annotations

import io
import pickle
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from protocols.secagg import ClientAborted, SecAggClient
from protocols.secagg.identity import ClientIdentity, IdentityDirectory
from protocols.secagg.primitives import MaskExpander
from securefed.errors import IntegrityError, ProtocolError
from securefed.flower.messages import join_messages, split_messages


def _x25519(raw: bytes) -> X25519PrivateKey:
    return X25519PrivateKey.from_private_bytes(raw)


def _identity(client_id: int, raw: bytes) -> ClientIdentity:
    return ClientIdentity(client_id, Ed25519PrivateKey.from_private_bytes(raw))


def _directory(keys: dict[int, bytes]) -> IdentityDirectory:
    return IdentityDirectory(keys)


def _expander(dim: int, dtype: str) -> MaskExpander:
    return MaskExpander(dim, np.dtype(dtype))


class _Pickler(pickle.Pickler):
    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, X25519PrivateKey):
            return _x25519, (obj.private_bytes_raw(),)
        if isinstance(obj, ClientIdentity):  # malicious mode: the user's signing key
            return _identity, (obj.client_id, obj._sk.private_bytes_raw())
        if isinstance(obj, IdentityDirectory):
            return _directory, (dict(obj.public_keys),)
        if isinstance(obj, MaskExpander):  # a scratch buffer: rebuilt, never stored
            return _expander, (obj.dim, obj.dtype.str)
        return NotImplemented


_ALLOWED = {
    ("securefed.flower.session", "_x25519"),
    ("securefed.flower.session", "_identity"),
    ("securefed.flower.session", "_directory"),
    ("securefed.flower.session", "_expander"),
    ("securefed.flower.session", "NodeSession"),
    ("protocols.secagg.client", "SecAggClient"),
    ("protocols.secagg.client", "Stage"),
    ("protocols.secagg.config", "SecAggConfig"),
    ("protocols.secagg.wire", "Envelope"),
    ("protocols.secagg.wire", "ShareKind"),
    ("numpy", "dtype"),
    ("numpy._core.numeric", "_frombuffer"),
    ("numpy.core.numeric", "_frombuffer"),
}


class _Unpickler(pickle.Unpickler):
    """Loads only the classes a session holds (the blob comes back from the node's own
    SuperNode, but a restricted loader keeps a corrupted store from running code)."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _ALLOWED and not module.startswith("numpy.dtypes"):
            raise IntegrityError()
        return super().find_class(module, name)


@dataclass
class NodeSession:
    """One round's secrets on one node: stage machines and encoded inputs, per secagg id."""

    round_index: int
    clients: dict[int, SecAggClient] = field(default_factory=dict)
    inputs: dict[int, np.ndarray] = field(default_factory=dict)
    #: What the round's keys were advertised for (keys ahead: cohort, public seed, round
    #: parameters); the train message must name the same round (``task_digest``).
    task: str = ""

    def freeze(self) -> bytes:
        buf = io.BytesIO()
        _Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(self)
        return buf.getvalue()

    @staticmethod
    def thaw(blob: bytes) -> NodeSession:
        try:
            session = _Unpickler(io.BytesIO(blob)).load()
        except IntegrityError:
            raise
        except Exception:
            raise IntegrityError() from None
        if not isinstance(session, NodeSession):
            raise IntegrityError()
        return session

    def step(self, stage: str, inbox: dict[int, bytes], *, eager: bool = False) -> dict[int, bytes]:
        """Run one SecAgg stage for every addressed user; a refusing client stays silent.

        With ``eager`` (eager masking, :mod:`securefed.flower.messages`) a ``share`` reply
        joins the user's shares and masked input, and an ``unmask`` message joins the
        FORWARD and the request; the encoded input is kept after an eager share reply in
        case the server falls back to the ``masked`` stage.

        Raises:
            IntegrityError: a message for a user this node does not hold in this round.
        """
        out: dict[int, bytes] = {}
        for sid, msg in sorted(inbox.items()):
            client = self.clients.get(sid)
            if client is None:
                raise IntegrityError()
            try:
                if stage == "share":
                    out[sid] = client.share_keys(msg, eager=eager)
                    if eager:
                        masked = client.eager_masked_input(self.inputs[sid])
                        out[sid] = join_messages(out[sid], masked)
                elif stage == "masked":
                    out[sid] = client.masked_input(msg, self.inputs.pop(sid))
                elif stage == "consistency":
                    out[sid] = client.consistency(msg)
                elif stage == "unmask":
                    self.inputs.pop(sid, None)
                    if eager:
                        forward, request = split_messages(msg)
                        out[sid] = client.unmask(request, forward)
                    else:
                        out[sid] = client.unmask(msg)
                else:
                    raise ProtocolError(f"unknown secure-aggregation stage {stage!r}")
            except (ClientAborted, IntegrityError):
                # To the server an aborting client is a dropout (docs/secagg.md).
                self.clients.pop(sid, None)
                self.inputs.pop(sid, None)
        return out
