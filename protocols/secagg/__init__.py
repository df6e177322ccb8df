"""Pairwise-mask secure aggregation (Bonawitz et al., CCS 2017) on the SecAgg+ graph (Bell et
al., CCS 2020), with a wrap-free fixed-point ring encoding.

Typical use in a training round::

    codec = FixedPointCodec.for_sum(n_clients=n, clip=c, scale_bits=16)
    config = SecAggConfig(n_clients=n, dropout_tolerance=0.05, corrupt_fraction=0.05,
                          modulus_bits=codec.modulus_bits)
    try:
        result = secure_sum(codec.encode(updates, rng=rng), config=config,
                            round_index=r, public_seed=seed)
    except RoundAborted:
        ...  # keep the global model, continue with the next round
    mean = codec.decode_sum(result.sum) / len(result.survivors)

Against an actively malicious server use ``SecAggConfig(mode="malicious")`` with enrolled
identities (:func:`enroll`, :class:`ClientIdentity`, :class:`IdentityDirectory`) on the stage
machines or ``secure_sum(..., engine="objects")``.

See ``docs/secagg.md`` for the threat model and performance.
"""

from protocols.secagg.batched import RingBlocks
from protocols.secagg.client import SecAggClient, Stage
from protocols.secagg.config import (
    GraphGuarantee,
    SecAggConfig,
    choose_graph_parameters,
    neighbour_table,
)
from protocols.secagg.errors import ClientAborted, RoundAborted, ShareVerificationFailed
from protocols.secagg.fixedpoint import FixedPointCodec, LimbCodec
from protocols.secagg.identity import ClientIdentity, IdentityDirectory, enroll
from protocols.secagg.server import EagerOutcome, SecAggServer
from protocols.secagg.simulation import DropoutSchedule, SecureSumResult, secure_sum

__all__ = [
    "ClientAborted",
    "ClientIdentity",
    "DropoutSchedule",
    "EagerOutcome",
    "FixedPointCodec",
    "GraphGuarantee",
    "IdentityDirectory",
    "LimbCodec",
    "RingBlocks",
    "RoundAborted",
    "SecAggClient",
    "SecAggConfig",
    "SecAggServer",
    "SecureSumResult",
    "ShareVerificationFailed",
    "Stage",
    "choose_graph_parameters",
    "enroll",
    "neighbour_table",
    "secure_sum",
]
