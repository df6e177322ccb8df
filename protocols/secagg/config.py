"""Round configuration and the choice of neighbours ``k`` and threshold ``t`` (SecAgg+).

Bell et al. (CCS 2020, "Secure Single-Server Aggregation with (Poly)Logarithmic Overhead")
replace Bonawitz et al.'s complete graph by a sparse graph of degree ``k = O(log n)``: a client
exchanges keys, shares and masks only with its ``k`` neighbours. We use their Harary-graph
instantiation: the circulant graph ``H(n, k)`` (each node linked to the ``k/2`` nearest nodes on
either side of a cycle) on a uniformly random relabelling of the clients drawn from a public
per-round seed, so every client's neighbourhood is a uniformly random ``k``-subset.

The conditions below follow the structure of Bell et al.'s analysis; the bounds are our own
union bounds with exact hypergeometric tails. ``n`` clients, at most ``C = ceil(gamma n)``
corrupt (colluding with the server) and at most ``D = ceil(delta n)`` dropping, both fixed
before the graph is drawn:

* correctness (failure <= 2**-eta): every client keeps at least ``t`` surviving neighbours,
  ``n * P[Hyp(n-1, D, k) > k - t] <= 2**-eta``;
* secrecy of shares (failure <= 2**-sigma): no honest client has ``t`` corrupt neighbours,
  ``n * P[Hyp(n-1, C, k) >= t] <= 2**-sigma``;
* no partial sums (failure <= 2**-sigma): honest survivors stay connected. On ``H(n, k)`` the
  remaining nodes are disconnected only if two disjoint runs of ``k/2`` consecutive cycle
  positions are all corrupt-or-dropped: ``n**2 * P[k specific positions all removed]``.

The threshold is always above a majority of each neighbourhood, ``2 t > k``. The clients'
unmask checks promise that a server which lies about who dropped cannot unmask an input: it
could otherwise tell some of ``u``'s neighbours that ``u`` survived (collecting shares of the
self-mask seed ``b_u``) and the others that ``u`` dropped (collecting shares of the mask key
``s_u``), and with ``t`` of each it removes both masks from ``y_u``. One honest client reveals
one share of ``u``, of one kind, so the two requests need ``2 t`` distinct neighbours, which
``k < 2 t`` rules out. The resolved threshold is ``t = max(t_secure, k // 2 + 1)``, and it must
also be correct (``t <= t_correct``). Without an explicit ``neighbours`` the chooser takes the
smallest even ``k`` for which that holds (more neighbours tolerate more dropouts at a majority
threshold); with an explicit ``neighbours`` whose neighbourhood cannot keep a correct majority
under ``dropout_tolerance`` the config refuses, naming the smallest ``k`` that can. An explicit
``threshold`` must satisfy ``k // 2 + 1 <= t <= k``. Colluding clients weaken the bound:
with ``c`` corrupt neighbours of ``u`` the lying server needs only ``2 (t - c)`` honest ones
(``t > (k + c) / 2`` is Bell et al.'s malicious-server condition).

``mode="malicious"`` enforces that stronger condition. ``c`` is the number of corrupt
neighbours any client can have except with probability ``2**-sigma``
(:func:`corrupt_neighbour_bound`: the smallest ``c`` with
``n * P[Hyp(n-1, C, k) > c] <= 2**-sigma``, i.e. ``t_secure - 1``), and the threshold floor is
``(k + c) // 2 + 1`` instead of ``k // 2 + 1``; the chooser, an explicit ``neighbours`` and an
explicit ``threshold`` are checked against it exactly as against the majority in semi-honest
mode. The signatures and the consistency round of that mode live in
:mod:`protocols.secagg.identity`, :mod:`protocols.secagg.client` and
:mod:`protocols.secagg.server` (see docs/secagg.md, "Malicious mode").
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Literal

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from protocols.errors import ConfigError
from protocols.secagg.primitives import hkdf_sha256, info

Mode = Literal["semi-honest", "malicious"]
MAX_CLIENTS = 1 << 31


@dataclass(frozen=True, kw_only=True)
class GraphGuarantee:
    """log2 failure probabilities (union bounds) of one ``(n, k, t)`` choice.

    ``-inf`` means the event is impossible under the stated fractions.
    """

    correctness_log2: float
    share_secrecy_log2: float
    connectivity_log2: float


@dataclass(frozen=True, kw_only=True)
class SecAggConfig:
    """Public parameters of one secure-aggregation round.

    Args:
        n_clients: Number of clients in the cohort (ids ``0 .. n-1``).
        neighbours: Degree ``k`` of the SecAgg+ graph; ``None`` chooses it from ``n`` and the
            fractions below (``n - 1`` or more means the complete graph of SecAgg).
        threshold: Shamir threshold ``t``; ``None`` chooses it.
        dropout_tolerance: Fraction of clients that may drop while the round still succeeds.
        corrupt_fraction: Fraction of clients that may collude with the server.
        modulus_bits: Ring size ``2**modulus_bits`` (<= 64); take it from
            :attr:`FixedPointCodec.modulus_bits`. Required by :func:`secure_sum`.
        mode: ``"semi-honest"`` (honest-but-curious server; threshold ``2 t > k``) or
            ``"malicious"`` (active server: Ed25519-signed key advertisements, the signed
            consistency round, and Bell et al.'s threshold ``2 t > k + c``; clients and server
            need the enrollment's :class:`~protocols.secagg.identity.IdentityDirectory`).
        security_bits: ``sigma``; secrecy fails with probability at most ``2**-sigma``.
        correctness_bits: ``eta``; an honest round aborts with probability at most ``2**-eta``.
        survivors: The fewest clients whose inputs a round may unmask, resolved into
            :attr:`min_survivors` (``None``: ``n - ceil(dropout_tolerance n)``, the dropouts
            the graph is designed for). In malicious mode a client refuses a smaller survivor
            set at the consistency round: ``t`` bounds each neighbourhood only, so without it
            a server could unmask a sum of far fewer inputs than the round was sized for (e.g.
            fewer distributed noise shares than the DP accounting assumes).
    """

    n_clients: int
    neighbours: int | None = None
    threshold: int | None = None
    dropout_tolerance: float = 0.05
    corrupt_fraction: float = 0.05
    modulus_bits: int | None = None
    mode: Mode = "semi-honest"
    security_bits: int = 40
    correctness_bits: int = 20
    survivors: int | None = None
    k: int = field(init=False)  # resolved neighbours
    t: int = field(init=False)  # resolved threshold
    min_survivors: int = field(init=False)  # resolved survivors

    def __post_init__(self) -> None:
        n = self.n_clients
        if not isinstance(n, int) or not 2 <= n < MAX_CLIENTS:
            raise ConfigError(f"n_clients must be an int in [2, 2**31), got {n!r}")
        for name in ("dropout_tolerance", "corrupt_fraction"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                raise ConfigError(f"{name} must be in [0, 1), got {value!r}")
        if self.mode not in ("semi-honest", "malicious"):
            raise ConfigError(f"mode must be 'semi-honest' or 'malicious', got {self.mode!r}")
        if self.modulus_bits is not None and not 1 <= self.modulus_bits <= 64:
            raise ConfigError(f"modulus_bits must be in [1, 64], got {self.modulus_bits!r}")
        if self.security_bits < 1 or self.correctness_bits < 1:
            raise ConfigError(
                f"security_bits and correctness_bits must be >= 1, got "
                f"{self.security_bits!r} and {self.correctness_bits!r}"
            )
        k, t = _resolve(self)
        object.__setattr__(self, "k", k)
        object.__setattr__(self, "t", t)
        floor = self.survivors
        if floor is None:
            floor = n - _counts(n, self.dropout_tolerance, self.corrupt_fraction)[0]
        elif isinstance(floor, bool) or not isinstance(floor, int) or not 1 <= floor <= n:
            raise ConfigError(f"survivors must be an int in [1, n_clients={n}], got {floor!r}")
        object.__setattr__(self, "min_survivors", floor)

    @property
    def complete_graph(self) -> bool:
        """True when every client is paired with every other one (original SecAgg)."""
        return self.k >= self.n_clients - 1

    @property
    def malicious(self) -> bool:
        """True in ``mode="malicious"`` (signed advertisements and the consistency round)."""
        return self.mode == "malicious"

    def corrupt_neighbour_bound(self) -> int:
        """``c``: the most corrupt neighbours any client has, except with prob. ``2**-sigma``."""
        _, corrupt = _counts(self.n_clients, self.dropout_tolerance, self.corrupt_fraction)
        return corrupt_neighbour_bound(self.n_clients, self.k, corrupt, self.security_bits)

    def guarantee(self) -> GraphGuarantee:
        """The failure bounds of the resolved ``(k, t)`` under the configured fractions."""
        return _guarantee(
            self.n_clients, self.k, self.t, self.dropout_tolerance, self.corrupt_fraction
        )


def majority(k: int) -> int:
    """The smallest threshold ``t`` with ``2 t > k``: a majority of ``k`` neighbours."""
    return k // 2 + 1


def corrupt_neighbour_bound(n: int, k: int, corrupt: int, sigma: int) -> int:
    """Smallest ``c`` with ``n * P[Hyp(n-1, corrupt, k) > c] <= 2**-sigma``.

    With ``corrupt`` clients fixed before the (random) graph is drawn, no client has more than
    ``c`` corrupt neighbours except with probability ``2**-sigma`` (union bound over clients).
    """
    return next(
        c
        for c in range(min(k, corrupt) + 1)
        if n * _hyp_tail_ge(n - 1, corrupt, k, c + 1) <= 2.0**-sigma
    )


def threshold_floor(n: int, k: int, corrupt: int, sigma: int, mode: Mode) -> int:
    """The least threshold the mode accepts: ``k // 2 + 1``, or ``(k + c) // 2 + 1`` if malicious.

    Semi-honest: a majority, so a server lying about one client's dropout cannot collect ``t``
    shares of both its secrets from ``k`` honest neighbours. Malicious (Bell et al. CCS 2020):
    the ``c`` corrupt neighbours of :func:`corrupt_neighbour_bound` hand over both shares, so
    ``2 t > k + c``.
    """
    if mode == "malicious":
        return (k + corrupt_neighbour_bound(n, k, corrupt, sigma)) // 2 + 1
    return majority(k)


def _resolve(cfg: SecAggConfig) -> tuple[int, int]:
    n = cfg.n_clients
    if cfg.neighbours is not None:
        k = cfg.neighbours
        if isinstance(k, bool) or not isinstance(k, int) or k < 2:
            raise ConfigError(f"neighbours must be an int >= 2, got {k!r}")
        k = min(k, n - 1)
        if k < n - 1 and k % 2:
            k += 1  # Harary graphs H(n, k) need an even degree below n - 1
            k = min(k, n - 1)
        if cfg.threshold is None:
            return k, _explicit_k_threshold(cfg, k)
    else:
        k, t = choose_graph_parameters(
            n,
            dropout_tolerance=cfg.dropout_tolerance,
            corrupt_fraction=cfg.corrupt_fraction,
            security_bits=cfg.security_bits,
            correctness_bits=cfg.correctness_bits,
            mode=cfg.mode,
        )
        if cfg.threshold is None:
            return k, t
    t = cfg.threshold
    if isinstance(t, bool) or not isinstance(t, int) or not 1 <= t <= k:
        raise ConfigError(f"threshold must be an int in [1, k={k}], got {t!r}")
    if 2 * t <= k:
        raise ConfigError(
            f"threshold t={t} is not above a majority of k={k} neighbours (2t > k); a server "
            f"lying about dropouts could unmask an input; use threshold >= {majority(k)} or "
            "leave it None"
        )
    if cfg.malicious:
        _, corrupt = _counts(n, cfg.dropout_tolerance, cfg.corrupt_fraction)
        c = corrupt_neighbour_bound(n, k, corrupt, cfg.security_bits)
        if 2 * t <= k + c:
            raise ConfigError(
                f"threshold t={t} does not satisfy 2t > k + c (k={k} neighbours, c={c} corrupt "
                f"neighbours at corrupt_fraction={cfg.corrupt_fraction!r}) required by "
                f"mode='malicious'; a malicious server with c colluding neighbours could unmask "
                f"an input; use threshold >= {(k + c) // 2 + 1} or leave it None"
            )
    return k, t


def _explicit_k_threshold(cfg: SecAggConfig, k: int) -> int:
    """The threshold for a user-given degree ``k``: a correct majority, or a ConfigError."""
    n = cfg.n_clients
    dropped, corrupt = _counts(n, cfg.dropout_tolerance, cfg.corrupt_fraction)
    eta = cfg.correctness_bits
    if cfg.malicious:
        return _explicit_k_malicious(cfg, k, dropped, corrupt)
    if not _correct(n, k, dropped, majority(k), eta):
        k_min = next(
            (
                kk
                for kk in [*range(k + 2, n - 1, 2), n - 1]
                if _correct(n, kk, dropped, majority(kk), eta)
            ),
            None,
        )
        fix = (
            f"use neighbours >= {k_min} (or leave neighbours None to choose it) or lower "
            "dropout_tolerance"
            if k_min is not None
            else "lower dropout_tolerance (even the complete graph cannot keep a majority)"
        )
        raise ConfigError(
            f"neighbours={k} cannot keep a majority threshold t >= {majority(k)} (2t > k) with "
            f"dropout_tolerance={cfg.dropout_tolerance!r} ({dropped} of {n} clients dropping): "
            f"rounds would abort with probability above 2**-{eta}; {fix}"
        )
    t = _t_secure_from(n, k, corrupt, cfg.security_bits, majority(k))
    if t is not None and _correct(n, k, dropped, t, eta):
        return t
    return majority(k)  # share secrecy not met at this k: guarantee() reports it


def _explicit_k_malicious(cfg: SecAggConfig, k: int, dropped: int, corrupt: int) -> int:
    """The malicious-mode threshold ``(k + c) // 2 + 1`` for a user-given ``k``, if correct."""
    n, sigma, eta = cfg.n_clients, cfg.security_bits, cfg.correctness_bits

    def ok(kk: int) -> bool:
        return _correct(n, kk, dropped, threshold_floor(n, kk, corrupt, sigma, "malicious"), eta)

    t = threshold_floor(n, k, corrupt, sigma, "malicious")
    if ok(k):
        return t
    k_min = next((kk for kk in [*range(k + 2, n - 1, 2), n - 1] if ok(kk)), None)
    fix = (
        f"use neighbours >= {k_min} (or leave neighbours None to choose it) or lower "
        "dropout_tolerance or corrupt_fraction"
        if k_min is not None
        else "lower dropout_tolerance or corrupt_fraction (even the complete graph fails)"
    )
    raise ConfigError(
        f"neighbours={k} cannot keep the malicious-mode threshold t >= {t} (2t > k + c) with "
        f"dropout_tolerance={cfg.dropout_tolerance!r} ({dropped} of {n} clients dropping): "
        f"rounds would abort with probability above 2**-{eta}; {fix}"
    )


def _hyp_tail_ge(pop: int, marked: int, draws: int, at_least: int) -> float:
    """P[X >= at_least] for X ~ Hypergeometric(population, marked, draws)."""
    marked = min(marked, pop)
    if at_least <= 0:
        return 1.0
    hi = min(marked, draws)
    if at_least > hi:
        return 0.0
    total = math.comb(pop, draws)
    num = sum(
        math.comb(marked, i) * math.comb(pop - marked, draws - i) for i in range(at_least, hi + 1)
    )
    return num / total


def _log2(p: float) -> float:
    return -math.inf if p <= 0.0 else math.log2(p)


def _counts(n: int, delta: float, gamma: float) -> tuple[int, int]:
    return math.ceil(delta * n), math.ceil(gamma * n)


def _guarantee(n: int, k: int, t: int, delta: float, gamma: float) -> GraphGuarantee:
    dropped, corrupt = _counts(n, delta, gamma)
    correct = min(1.0, n * _hyp_tail_ge(n - 1, dropped, k, k - t + 1))
    secret = min(1.0, n * _hyp_tail_ge(n - 1, corrupt, k, t))
    if k >= n - 1:
        connect = 0.0
    else:
        removed = min(n, dropped + corrupt)
        run = 1.0
        for i in range(k):
            run *= max(0, removed - i) / (n - i)
        connect = min(1.0, n * n * run)
    return GraphGuarantee(
        correctness_log2=_log2(correct),
        share_secrecy_log2=_log2(secret),
        connectivity_log2=_log2(connect),
    )


def _secure(n: int, k: int, corrupt: int, t: int, sigma: int) -> bool:
    """No honest client has ``t`` corrupt neighbours, except with probability ``2**-sigma``."""
    return n * _hyp_tail_ge(n - 1, corrupt, k, t) <= 2.0**-sigma


def _correct(n: int, k: int, dropped: int, t: int, eta: int) -> bool:
    """Every client keeps ``t`` surviving neighbours, except with probability ``2**-eta``."""
    return n * _hyp_tail_ge(n - 1, dropped, k, k - t + 1) <= 2.0**-eta


def _t_secure_from(n: int, k: int, corrupt: int, sigma: int, start: int) -> int | None:
    """Smallest ``t >= start`` (and ``>= 2``) meeting :func:`_secure`, or None."""
    return next((t for t in range(max(2, start), k + 1) if _secure(n, k, corrupt, t, sigma)), None)


def _threshold_for(
    n: int, k: int, delta: float, gamma: float, sigma: int, eta: int, mode: Mode = "semi-honest"
) -> int | None:
    """``max(t_secure, threshold_floor(k))`` if it is also correct, else None.

    Both bounds are monotone in ``t`` (secrecy improves and correctness worsens as ``t``
    grows), so the smallest secure ``t`` at or above the majority is the best candidate and
    one correctness check decides.
    """
    dropped, corrupt = _counts(n, delta, gamma)
    t = _t_secure_from(n, k, corrupt, sigma, threshold_floor(n, k, corrupt, sigma, mode))
    if t is None or not _correct(n, k, dropped, t, eta):
        return None
    return t


@lru_cache(maxsize=256)
def choose_graph_parameters(
    n_clients: int,
    *,
    dropout_tolerance: float,
    corrupt_fraction: float,
    security_bits: int = 40,
    correctness_bits: int = 20,
    mode: Mode = "semi-honest",
) -> tuple[int, int]:
    """Smallest even degree ``k`` (or the complete graph) and its threshold ``t``.

    Returns:
        ``(k, t)`` meeting the three bounds of the module docstring, with ``2 t > k``
        (``2 t > k + c`` in ``mode="malicious"``, see :func:`threshold_floor`).

    Raises:
        ConfigError: when even the complete graph cannot meet them (too many dropouts or
            corrupt clients for ``n``; a majority threshold needs dropout_tolerance below 1/2).
    """
    n = n_clients
    for k in range(2, n - 1, 2):
        g = _guarantee(n, k, k, dropout_tolerance, corrupt_fraction)
        if g.connectivity_log2 > -security_bits:
            continue
        t = _threshold_for(
            n, k, dropout_tolerance, corrupt_fraction, security_bits, correctness_bits, mode
        )
        if t is not None:
            return k, t
    t = _threshold_for(
        n, n - 1, dropout_tolerance, corrupt_fraction, security_bits, correctness_bits, mode
    )
    if t is None:
        raise ConfigError(
            f"no (neighbours, threshold) meets 2**-{security_bits} security and "
            f"2**-{correctness_bits} correctness for n_clients={n}, "
            f"dropout_tolerance={dropout_tolerance!r} ({math.ceil(dropout_tolerance * n)} of {n} "
            f"clients dropping), corrupt_fraction={corrupt_fraction!r} with a majority threshold "
            "(2t > k); lower the fractions or the security/correctness bits, or add clients"
        )
    return n - 1, t


@lru_cache(maxsize=8)
def neighbour_table(session: bytes, n: int, k: int) -> np.ndarray:
    """The public SecAgg+ graph of a round: row ``i`` lists client ``i``'s neighbours, sorted.

    A random relabelling of the Harary graph ``H(n, k)`` (``k`` even) from an AES-CTR stream
    keyed by HKDF of the round's public session id; the complete graph when ``k >= n - 1``.
    Every party computes the same table; the result is read-only and cached.
    """
    if k >= n - 1:
        full = np.broadcast_to(np.arange(n, dtype=np.int64), (n, n))
        table = full[~np.eye(n, dtype=bool)].reshape(n, n - 1)
    else:
        key = hkdf_sha256(session, salt=session, info=info(b"graph", 0, n, k), length=16)
        enc = Cipher(algorithms.AES(key), modes.CTR(bytes(16))).encryptor()
        sort_keys = np.frombuffer(enc.update(bytes(8 * n)), dtype=np.uint64)
        perm = np.argsort(sort_keys, kind="stable")
        pos = np.empty(n, dtype=np.int64)
        pos[perm] = np.arange(n)
        half = k // 2
        offsets = np.concatenate([np.arange(-half, 0), np.arange(1, half + 1)])
        table = perm[(pos[:, None] + offsets[None, :]) % n]
        table = np.sort(table, axis=1)
    table = np.ascontiguousarray(table, dtype=np.int64)
    table.setflags(write=False)
    return table
