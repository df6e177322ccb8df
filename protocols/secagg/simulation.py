"""Run one whole round in-process.

:func:`secure_sum` is what the training loop calls. It has two engines that give the same
result for the same keys (tests/test_secagg_engines.py):

* ``"batched"`` (the default, :mod:`protocols.secagg.batched`): all clients at once, the work
  the two clients of a pair both do (their X25519 agreements, keys and the AES-CTR mask one
  adds and the other subtracts) done once per pair, the wire messages counted but not built.
  Every other piece of cryptography of every client and of the server is performed.
* ``"objects"``: every client and the server as real stage machines
  (:class:`SecAggClient`, :class:`SecAggServer`) exchanging encoded wire messages, the same
  bytes a networked deployment would carry; each client does all of its own work.

Both consume masked inputs as a stream, so memory stays ``O(dim * k + n * k)``.

``mode="malicious"`` runs on the objects engine only (the batched engine is semi-honest: it
has no signatures and no consistency round) and ``secure_sum`` refuses it on the batched
engine rather than run a weaker protocol. The simulation enrolls the clients itself
(:func:`~protocols.secagg.identity.enroll`, fresh long-term keys) unless given an enrollment,
and a client listed under the ``unmask`` dropout stage goes silent from the consistency round
on (it signs nothing and reveals nothing).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from protocols.errors import ConfigError
from protocols.secagg.batched import RingBlocks, batched_round, default_workers
from protocols.secagg.client import SecAggClient, require_modulus
from protocols.secagg.config import SecAggConfig
from protocols.secagg.errors import ClientAborted
from protocols.secagg.identity import ClientIdentity, IdentityDirectory, enroll
from protocols.secagg.primitives import MaskExpander
from protocols.secagg.server import SecAggServer
from protocols.secagg.wire import ring_dtype

STAGES = ("advertise", "share", "masked_input", "unmask")
Engine = Literal["batched", "objects"]


def _ids(values: Iterable[int]) -> frozenset[int]:
    return frozenset(int(v) for v in values)


@dataclass(frozen=True, kw_only=True)
class DropoutSchedule:
    """Which clients go silent at which stage (for simulation and tests).

    A client listed under a stage sends every message before that stage and none from it on:
    ``advertise`` never joins; ``share`` advertised keys but sends no shares; ``masked_input``
    sent shares but no masked input (the server reconstructs its mask key); ``unmask`` sent its
    masked input (it is in the sum) but reveals no shares. The sets must be disjoint.
    """

    advertise: frozenset[int] = field(default_factory=frozenset)
    share: frozenset[int] = field(default_factory=frozenset)
    masked_input: frozenset[int] = field(default_factory=frozenset)
    unmask: frozenset[int] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        seen: set[int] = set()
        for name in STAGES:
            ids = _ids(getattr(self, name))
            object.__setattr__(self, name, ids)
            if ids & seen:
                raise ConfigError(f"a client is listed under more than one stage (at {name!r})")
            seen |= ids

    @classmethod
    def random(cls, n_clients: int, *, rate: float, rng: np.random.Generator) -> DropoutSchedule:
        """Each client drops with probability ``rate``, at a uniformly random stage."""
        if not 0.0 <= rate <= 1.0:
            raise ConfigError(f"rate must be in [0, 1], got {rate!r}")
        drops = rng.random(n_clients) < rate
        stage = rng.integers(0, len(STAGES), size=n_clients)
        return cls(
            **{
                name: frozenset(np.flatnonzero(drops & (stage == s)).tolist())
                for s, name in enumerate(STAGES)
            }
        )

    def stage_of(self, client: int) -> str | None:
        """The stage at which ``client`` goes silent, or ``None``."""
        return next((name for name in STAGES if client in getattr(self, name)), None)

    def all(self) -> frozenset[int]:
        """Every client that drops at some stage."""
        return self.advertise | self.share | self.masked_input | self.unmask


@dataclass(frozen=True, kw_only=True)
class SecureSumResult:
    """Outcome of one secure-aggregation round.

    Attributes:
        sum: uint64 ``[dim]``, the sum of the survivors' ring inputs mod ``2**modulus_bits``.
        survivors: Sorted ids whose input is in the sum (``U3``).
        dropped: Sorted ids masked with but missing from the sum (``U2 - U3``); their mask
            keys were reconstructed.
        excluded: Sorted ids that left before the masked-input stage (not in any mask).
        neighbours: Degree ``k`` used; threshold: ``t`` used; modulus_bits: ring size.
        bytes_per_stage: Bytes on the wire per stage (both directions, headers included).
        seconds_per_stage: Wall time per stage (all clients and the server).
        seconds: Total wall time.
    """

    sum: np.ndarray
    survivors: np.ndarray
    dropped: np.ndarray
    excluded: np.ndarray
    neighbours: int
    threshold: int
    modulus_bits: int
    bytes_per_stage: dict[str, int]
    seconds_per_stage: dict[str, float]
    seconds: float


def secure_sum(
    ring_inputs: np.ndarray | RingBlocks,
    *,
    config: SecAggConfig,
    round_index: int,
    public_seed: bytes,
    dropouts: DropoutSchedule | None = None,
    engine: Engine = "batched",
    workers: int | None = None,
    enrollment: tuple[Sequence[ClientIdentity], IdentityDirectory] | None = None,
) -> SecureSumResult:
    """Securely sum ``ring_inputs`` over one simulated round of SecAgg / SecAgg+.

    Args:
        ring_inputs: uint64 ``[n_clients, dim]``, each value ``< 2**config.modulus_bits``
            (from :meth:`FixedPointCodec.encode`, plus :meth:`FixedPointCodec.to_ring` noise),
            or a :class:`~protocols.secagg.batched.RingBlocks` that produces them a block of
            coordinates at a time (batched engine only), for rounds whose ``[n, dim]`` does not
            fit in memory.
        config: Public parameters; ``config.modulus_bits`` must be set.
        round_index: Round number; with ``public_seed`` it fixes the graph and binds all keys
            and messages to this round.
        public_seed: Public per-round randomness (e.g. from the server's beacon).
        dropouts: Clients that go silent, and when; ``None`` for none.
        engine: ``"batched"`` (each pair's work once) or ``"objects"`` (per-client stage
            machines and wire messages); see the module docstring.
        workers: Threads expanding masks in the batched engine (``None``: the cores available,
            at most ``batched.MAX_WORKERS``); the result does not depend on it.
        enrollment: Malicious mode: the clients' identities (index = client id) and the
            directory, e.g. from :func:`~protocols.secagg.identity.enroll`; ``None`` enrolls
            fresh ones. Ignored in semi-honest mode.

    Returns:
        The sum of the survivors' inputs and the transcript statistics.

    Raises:
        RoundAborted: fewer than ``t`` clients (or shares) survived; nothing is revealed.
        ConfigError: malformed inputs or configuration.
    """
    bits = require_modulus(config)
    x: np.ndarray | RingBlocks
    if isinstance(ring_inputs, RingBlocks) and not isinstance(ring_inputs, np.ndarray):
        x = ring_inputs
        shape = tuple(x.shape)
        if len(shape) != 2 or shape[0] != config.n_clients or shape[1] < 1:
            raise ConfigError(
                f"ring_inputs.shape must be ({config.n_clients}, dim >= 1), got {shape}"
            )
        if engine != "batched":
            raise ConfigError(
                "streamed ring inputs (RingBlocks) run on engine='batched' only; pass the "
                "[n_clients, dim] array to the objects engine"
            )
    else:
        x = np.asarray(ring_inputs)
        if x.dtype != np.uint64 or x.ndim != 2 or x.shape[0] != config.n_clients or x.shape[1] < 1:
            raise ConfigError(
                f"ring_inputs must be uint64 of shape [{config.n_clients}, dim >= 1], got "
                f"{x.dtype} {x.shape}"
            )
        if bits < 64 and x.size and int(x.max()) >> bits:
            raise ConfigError(f"ring_inputs must be reduced modulo 2**{bits}")
    if not isinstance(public_seed, bytes) or len(public_seed) < 16:
        raise ConfigError("public_seed must be at least 16 bytes")
    sched = dropouts or DropoutSchedule()
    if any(not 0 <= c < config.n_clients for c in sched.all()):
        raise ConfigError(f"dropout ids must be in [0, {config.n_clients})")

    if engine not in ("batched", "objects"):
        raise ConfigError(f"engine must be 'batched' or 'objects', got {engine!r}")
    if config.malicious and engine != "objects":
        raise ConfigError(
            "mode='malicious' runs on engine='objects' only (the batched engine has no "
            "signatures or consistency round); pass engine='objects'"
        )
    n, dim = x.shape
    start = time.perf_counter()
    if engine == "batched":
        out = batched_round(
            x,
            config=config,
            bits=bits,
            round_index=round_index,
            public_seed=public_seed,
            silent={name: getattr(sched, name) for name in STAGES},
            workers=default_workers() if workers is None else workers,
        )
        return SecureSumResult(
            sum=out.sum,
            survivors=out.survivors,
            dropped=out.dropped,
            excluded=out.excluded,
            neighbours=config.k,
            threshold=config.t,
            modulus_bits=bits,
            bytes_per_stage=out.bytes_per_stage,
            seconds_per_stage=out.seconds_per_stage,
            seconds=time.perf_counter() - start,
        )
    assert isinstance(x, np.ndarray)  # streamed inputs were refused above
    expander = MaskExpander(dim, ring_dtype(bits))
    kw = {"config": config, "round_index": round_index, "public_seed": public_seed, "dim": dim}
    if config.malicious:
        identities, directory = enrollment if enrollment is not None else enroll(n)
        if len(identities) != n:
            raise ConfigError(f"enrollment must hold {n} identities, got {len(identities)}")
        clients = [
            SecAggClient(i, expander=expander, identity=identities[i], directory=directory, **kw)
            for i in range(n)
        ]
        server = SecAggServer(expander=expander, directory=directory, **kw)
    else:
        clients = [SecAggClient(i, expander=expander, **kw) for i in range(n)]
        server = SecAggServer(expander=expander, **kw)
    stages = (*STAGES[:3], "consistency", STAGES[3]) if config.malicious else STAGES
    traffic = dict.fromkeys(stages, 0)
    timing = dict.fromkeys(stages, 0.0)

    def run(stage: str, inbox: dict[int, bytes | None], step, receive, finish):
        t0 = time.perf_counter()
        for i, msg in inbox.items():
            traffic[stage] += len(msg) if msg is not None else 0  # sent even if i is gone
            if i in getattr(sched, "unmask" if stage == "consistency" else stage):
                continue
            try:
                reply = step(clients[i], msg)
            except ClientAborted:
                continue  # an aborting client is indistinguishable from a dropout
            traffic[stage] += len(reply)
            receive(i, reply)
        out = finish()
        timing[stage] = time.perf_counter() - t0
        return out

    keys = run(
        "advertise",
        dict.fromkeys(range(n)),
        lambda c, _m: c.advertise(),
        server.receive_advertise,
        server.finish_advertise,
    )
    forward = run(
        "share",
        keys,
        lambda c, m: c.share_keys(m),
        server.receive_shares,
        server.finish_shares,
    )
    requests = run(
        "masked_input",
        forward,
        lambda c, m: c.masked_input(m, x[c.id]),
        server.receive_masked_input,
        server.finish_masked_input,
    )
    if config.malicious:
        requests = run(
            "consistency",
            requests,
            lambda c, m: c.consistency(m),
            server.receive_consistency,
            server.finish_consistency,
        )
    total = run(
        "unmask",
        requests,
        lambda c, m: c.unmask(m),
        server.receive_unmask_shares,
        server.finish_unmask,
    )
    everyone = frozenset(range(n))
    return SecureSumResult(
        sum=total,
        survivors=np.array(sorted(server.u3), dtype=np.int64),
        dropped=np.array(sorted(server.dropped), dtype=np.int64),
        excluded=np.array(sorted(everyone - server.u2), dtype=np.int64),
        neighbours=config.k,
        threshold=config.t,
        modulus_bits=bits,
        bytes_per_stage=traffic,
        seconds_per_stage=timing,
        seconds=time.perf_counter() - start,
    )
