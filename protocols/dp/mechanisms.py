"""Noise mechanisms for the sum of clipped participant updates, central and distributed.

Unit of privacy: one participant (user-level DP-FedAvg, McMahan et al. ICLR 2018). Each
participant's flat update is clipped to L2 norm C (:func:`~protocols.dp.clip_rows`), so adding
or removing one participant moves the sum by at most C; each mechanism adds noise of std
``noise_multiplier * C`` (or the discrete equivalent) to that sum and emits the
:class:`~protocols.dp.ledger.PrivacyEvent` the ledger accounts for.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np
import torch

from protocols.dp.accounting import (
    MAX_NOISE_MULTIPLIER,
    check_delta,
    check_epsilon,
    check_noise_multiplier,
    check_sample_rate,
    check_steps,
    ddg_rdp,
    poisson_subsampled_rdp,
    rdp_orders,
    rdp_to_epsilon,
)
from protocols.dp.clipping import _check_clip
from protocols.dp.ledger import (
    DISTRIBUTED_DISCRETE_GAUSSIAN,
    DISTRIBUTED_GAUSSIAN,
    GAUSSIAN,
    PrivacyEvent,
)
from protocols.dp.noise import CHUNK, _check_source, below, discrete_gaussian, gaussian_noise
from protocols.errors import ConfigError, DataError, ProtocolError

#: Default conditional-rounding parameter of Kairouz et al. (2021), Sec. 4.1: e^{-1/2}.
DEFAULT_ROUNDING_BETA = math.exp(-0.5)


def _positive_int(value: int, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")
    return int(value)


@dataclass(frozen=True, kw_only=True)
class CentralGaussian:
    """A trusted server adds N(0, sigma^2 C^2) to the sum of clipped updates.

    Gaussian mechanism with L2 sensitivity C for user-level DP (McMahan et al. 2018, Sec. 2).
    """

    clip: float
    noise_multiplier: float

    def __post_init__(self) -> None:
        _check_clip(self.clip)
        check_noise_multiplier(self.noise_multiplier)

    @property
    def std(self) -> float:
        """Noise std on the sum: ``noise_multiplier * clip``."""
        return float(self.noise_multiplier) * float(self.clip)

    def noise_for_sum(
        self,
        dim: int,
        *,
        generator: torch.Generator | None,
        secure: bool = False,
        dtype: torch.dtype = torch.float32,
    ) -> torch.Tensor:
        """Noise of std ``sigma * C`` for a sum vector of length ``dim``."""
        return gaussian_noise(
            (_positive_int(dim, "dim"),), self.std, generator=generator, secure=secure, dtype=dtype
        )

    def event(self, round: int, *, sample_rate: float) -> PrivacyEvent:
        """The ledger event of one release in ``round``."""
        return PrivacyEvent(
            round=round,
            mechanism=GAUSSIAN,
            noise_multiplier=self.noise_multiplier,
            sample_rate=sample_rate,
            clip=self.clip,
            noise_contributors=1,
            min_survivors=1,
            placement="central",
        )


@dataclass(frozen=True, kw_only=True)
class DistributedGaussian:
    """Each client adds continuous N(0, sigma^2 C^2 / t) so that any t survivors carry sigma*C.

    For float aggregation without a trusted server (e.g. simulation of the distributed
    placement without the integer ring). With ``n >= t`` surviving shares the sum's noise
    is exactly Gaussian with multiplier ``sigma * sqrt(n / t) >= sigma``; the event records
    ``n`` and the accountant uses that effective multiplier. Assumes the t surviving clients
    keep their shares secret from the server (no client-server collusion).
    """

    clip: float
    noise_multiplier: float
    min_survivors: int

    def __post_init__(self) -> None:
        _check_clip(self.clip)
        check_noise_multiplier(self.noise_multiplier)
        _positive_int(self.min_survivors, "min_survivors")

    @property
    def share_std(self) -> float:
        """Each client's share std: ``sigma * C / sqrt(t)``."""
        return float(self.noise_multiplier) * float(self.clip) / math.sqrt(self.min_survivors)

    def client_share(
        self,
        shape: int | tuple[int, ...],
        *,
        generator: torch.Generator | None,
        secure: bool = False,
        dtype: torch.dtype = torch.float32,
    ) -> torch.Tensor:
        """One client's (or, with shape ``(m, d)``, m clients') noise share."""
        return gaussian_noise(
            shape, self.share_std, generator=generator, secure=secure, dtype=dtype
        )

    def event(self, round: int, *, sample_rate: float, noise_contributors: int) -> PrivacyEvent:
        """The ledger event of a release whose sum holds ``noise_contributors`` shares."""
        return PrivacyEvent(
            round=round,
            mechanism=DISTRIBUTED_GAUSSIAN,
            noise_multiplier=self.noise_multiplier,
            sample_rate=sample_rate,
            clip=self.clip,
            noise_contributors=noise_contributors,
            min_survivors=self.min_survivors,
            placement="distributed",
        )


def rounded_l2_bound(scaled_clip: float, dim: int, beta: float) -> float:
    """L2 bound of a stochastically rounded vector (Kairouz et al. 2021, Sec. 4.1, Prop. 22).

    A vector of norm <= ``c`` rounded coordinate-wise to a neighbouring integer always has
    norm < ``c + sqrt(d)``. Conditional randomized rounding (re-round until the norm is
    within the bound) can use the tighter
    ``sqrt(c^2 + d/4 + sqrt(2 log(1/beta)) * (c + sqrt(d)/2))``, exceeded by one rounding
    with probability at most ``beta``. ``beta = 0`` means unconditional rounding.
    """
    if not (0.0 <= beta < 1.0):
        raise ConfigError(f"rounding beta must be in [0, 1), got {beta!r}")
    always = scaled_clip + math.sqrt(dim)
    if beta == 0.0:
        return always
    squared = (
        scaled_clip**2
        + dim / 4.0
        + math.sqrt(2.0 * math.log(1.0 / beta)) * (scaled_clip + math.sqrt(dim) / 2.0)
    )
    return min(always, math.sqrt(squared))


def conditional_randomized_round(
    x: torch.Tensor,
    *,
    scale: float,
    l2_bound: float,
    generator: torch.Generator | None,
    secure: bool = False,
    max_tries: int = 1000,
) -> torch.Tensor:
    """Scale rows by ``scale`` and round each coordinate to a neighbouring integer unbiasedly,
    re-rounding any row whose L2 norm exceeds ``l2_bound`` (Kairouz et al. 2021, Sec. 4.1).

    This makes the integer L2 sensitivity deterministically ``l2_bound`` while each
    coordinate's rounding stays independent of other participants' data. Batched over rows;
    only rows that exceed the bound are redrawn.

    Args:
        x: Clipped float updates ``[m, d]`` (each row's norm <= C).
        scale: Integer units per float unit.
        l2_bound: The bound to enforce (see :func:`rounded_l2_bound`).
        generator: Randomness source (``None`` with ``secure=True``).
        secure: Use OS randomness.
        max_tries: Give up after this many re-roundings of a row.

    Returns:
        An int64 tensor ``[m, d]``, every row of L2 norm <= ``l2_bound``.

    Raises:
        ProtocolError: If a row still exceeds the bound after ``max_tries`` (its input was
            not clipped to the norm the bound was computed for).
    """
    _check_source(generator, secure)
    if x.ndim != 2 or not x.is_floating_point():
        raise DataError(f"updates must be a 2-D floating tensor, got shape {tuple(x.shape)}")
    m, d = x.shape
    out = torch.empty((m, d), dtype=torch.int64)
    rows = max(1, CHUNK // max(d, 1))  # rounded in cache-sized blocks of whole rows
    failed = 0
    for lo in range(0, m, rows):
        failed += _round_rows_into(
            out[lo : lo + rows],
            x[lo : lo + rows],
            float(scale),
            l2_bound,
            generator,
            secure,
            max_tries,
        )
    if failed == 0:
        return out
    raise ProtocolError(
        f"{failed} update(s) exceeded the rounded L2 bound {l2_bound:.6g} after "
        f"{max_tries} tries; clip updates to the configured norm before rounding"
    )


def _round_rows_into(
    out: torch.Tensor,
    x: torch.Tensor,
    scale: float,
    l2_bound: float,
    generator: torch.Generator | None,
    secure: bool,
    max_tries: int,
) -> int:
    """Conditionally round the block ``x`` into ``out``; returns how many rows failed."""
    # In-place passes where the values allow (the same floats as ``x.double() * scale``, ``low
    # + up``): a FedRAP round on MovieLens 100K rounds 50.7 M coordinates, 13.5 ns each with
    # a fresh tensor per step here and 8.9 ns so (docs/benchmarks.md).
    y = x.to(torch.float64, copy=True).mul_(scale)  # never the caller's float64 x
    low = torch.floor(y)
    frac = y.sub_(low)
    index: torch.Tensor | None = None  # None: every row of the block is pending
    for _ in range(max_tries):
        cand = torch.empty_like(low).copy_(below(frac, generator, secure)).add_(low)
        ok = torch.linalg.vector_norm(cand, dim=1) <= l2_bound
        if bool(ok.all()):
            if index is None:
                out.copy_(cand)
            else:
                out[index] = cand.to(torch.int64)
            return 0
        if index is None:
            index = torch.arange(x.shape[0])
        out[index[ok]] = cand[ok].to(torch.int64)
        retry = ~ok
        index, low, frac = index[retry], low[retry], frac[retry]
    assert index is not None
    return int(index.numel())


@dataclass(frozen=True, kw_only=True)
class DistributedNoisePlan:
    """Parameters of the distributed discrete Gaussian for one secure-aggregation setup.

    Attributes:
        clip: L2 clip C of each update, float units.
        noise_multiplier: Calibrated sigma relative to the rounded sensitivity.
        scale: Integer units per float unit of the fixed-point codec.
        dim: Number of coordinates d.
        min_survivors: Minimum number t of clients whose shares reach the sum.
        cohort_size: Maximum number of clients whose values can be summed (ring sizing).
        failure_prob: Probability that some coordinate of the noisy sum exceeds
            ``per_coordinate_bound`` (union bound over all d coordinates).
        rounding_beta: Conditional randomized rounding parameter beta.
        l2_sensitivity_after_rounding: D2, L2 bound of a rounded update, integer units.
        l1_sensitivity_after_rounding: D1 = D2 * min(sqrt(d), D2), integer units.
        share_sigma: Each client's discrete Gaussian scale: ``sigma * D2 / sqrt(t)``, or
            over the square root of a smaller real ``share_divisor`` (see
            :func:`distributed_noise_plan`).
        noise_bound: Per-coordinate bound on |sum of cohort_size shares| at failure_prob.
        per_coordinate_bound: Bound on |sum of rounded updates + shares| per coordinate:
            ``cohort_size * floor(D2) + noise_bound``.
        min_ring_bits: Smallest k with ``2**k > 2 * per_coordinate_bound`` (centered lift).
    """

    clip: float
    noise_multiplier: float
    scale: float
    dim: int
    min_survivors: int
    cohort_size: int
    failure_prob: float
    rounding_beta: float
    l2_sensitivity_after_rounding: float
    l1_sensitivity_after_rounding: float
    share_sigma: float
    noise_bound: int
    per_coordinate_bound: int
    min_ring_bits: int

    def noise_sum_bound(self, n_clients: int, failure_prob: float | None = None) -> int:
        """Bound on |sum of n shares| holding for all d coordinates w.p. >= 1 - failure_prob.

        N_Z(0, s^2) is s^2-subgaussian (Canonne et al. 2020, Cor. 9), so a sum of n shares
        is n s^2-subgaussian and ``P[|S_j| >= T] <= 2 exp(-T^2 / (2 n s^2))``.
        """
        p = self.failure_prob if failure_prob is None else failure_prob
        if not (0.0 < p < 1.0):
            raise ConfigError(f"failure probability must be in (0, 1), got {p!r}")
        n = _positive_int(n_clients, "n_clients")
        t = math.sqrt(2.0 * n * self.share_sigma**2 * math.log(2.0 * self.dim / p))
        return math.ceil(t)

    def rdp(self, orders, *, sample_rate: float, noise_contributors: int) -> np.ndarray:
        """Per-round RDP at ``orders`` (integers if subsampled), n shares in the sum."""
        n = _positive_int(noise_contributors, "noise_contributors")

        def base(alpha: np.ndarray) -> np.ndarray:
            return ddg_rdp(
                alpha,
                share_sigma=self.share_sigma,
                l2_sensitivity=self.l2_sensitivity_after_rounding,
                l1_sensitivity=self.l1_sensitivity_after_rounding,
                dim=self.dim,
                n_contributors=n,
            )

        return poisson_subsampled_rdp(base, orders, check_sample_rate(sample_rate))

    def effective_noise_multiplier(self, noise_contributors: int) -> float:
        """A Gaussian multiplier whose RDP curve dominates this round's (non-subsampled) RDP.

        From the third term of Kairouz et al. Prop. 14: the round is RDP-dominated by a
        Gaussian of multiplier ``1 / (D2/(sqrt(n) s) + sqrt(d) tau)``. Reporting only; the
        ledger accounts with the full RDP bound.
        """
        from protocols.dp.accounting import ddg_tau

        n = _positive_int(noise_contributors, "noise_contributors")
        a = self.l2_sensitivity_after_rounding / (math.sqrt(n) * self.share_sigma)
        return 1.0 / (a + math.sqrt(self.dim) * ddg_tau(self.share_sigma, n))

    def event(self, round: int, *, sample_rate: float, noise_contributors: int) -> PrivacyEvent:
        """The ledger event of a release whose sum holds ``noise_contributors`` shares."""
        return PrivacyEvent(
            round=round,
            mechanism=DISTRIBUTED_DISCRETE_GAUSSIAN,
            noise_multiplier=self.noise_multiplier,
            sample_rate=sample_rate,
            clip=self.clip,
            noise_contributors=noise_contributors,
            min_survivors=self.min_survivors,
            placement="distributed",
            share_sigma=self.share_sigma,
            l2_sensitivity=self.l2_sensitivity_after_rounding,
            l1_sensitivity=self.l1_sensitivity_after_rounding,
            dim=self.dim,
        )


def distributed_noise_plan(
    *,
    clip: float,
    noise_multiplier: float,
    scale: float,
    dim: int,
    min_survivors: int,
    cohort_size: int | None = None,
    share_divisor: float | None = None,
    failure_prob: float = 2.0**-40,
    rounding_beta: float = DEFAULT_ROUNDING_BETA,
) -> DistributedNoisePlan:
    """Size the distributed discrete Gaussian for a fixed-point ring (Kairouz et al. 2021).

    Unit of privacy: one participant. The clipped update (norm <= C) is scaled by ``scale``
    and rounded with :func:`conditional_randomized_round` so its integer L2 norm is at most
    ``D2 = rounded_l2_bound(C * scale, d, beta)``. Each client adds N_Z(0, s^2)^d with
    ``s = sigma * D2 / sqrt(t)``, so any t surviving shares carry variance ~ sigma^2 D2^2
    per coordinate. Modular reduction in the ring is post-processing of the noisy sum and
    costs no privacy; the ring bounds only keep it from wrapping (utility).

    Args:
        clip: L2 clip C (float units).
        noise_multiplier: sigma, relative to the rounded sensitivity D2.
        scale: Fixed-point scale (integer units per float unit), > 0.
        dim: Number of coordinates d.
        min_survivors: t, the fewest clients whose shares can reach the sum (the secure
            aggregation threshold).
        cohort_size: The most clients that can be summed, for ring sizing; defaults to
            ``min_survivors`` (pass the real cohort size when it is larger).
        share_divisor: ``s = sigma * D2 / sqrt(share_divisor)``, a real number in
            ``(0, t]`` (default ``t``): any t surviving shares still carry at least
            ``sigma^2 D2^2``. Sizing the shares of a cohort of ``m`` for ``(1 - f) m``
            rather than ``ceil((1 - f) m)`` keeps the noise of a round everyone survives at
            ``sigma^2 D2^2 / (1 - f)`` whatever ``m`` is, so the noise's size (measurable
            over many coordinates) says nothing about the cohort's size.
        failure_prob: Ring-overflow probability budget over all coordinates.
        rounding_beta: Conditional rounding beta in [0, 1); 0 for unconditional rounding.

    Returns:
        The :class:`DistributedNoisePlan`.
    """
    c = _check_clip(clip)
    z = check_noise_multiplier(noise_multiplier)
    if not (
        isinstance(scale, numbers.Real)
        and not isinstance(scale, bool)
        and math.isfinite(scale)
        and scale > 0
    ):
        raise ConfigError(f"fixed-point scale must be a finite number > 0, got {scale!r}")
    d = _positive_int(dim, "dim")
    t = _positive_int(min_survivors, "min_survivors")
    n_max = t if cohort_size is None else _positive_int(cohort_size, "cohort_size")
    if n_max < t:
        raise ConfigError(f"cohort_size {n_max} is below min_survivors {t}")
    divisor = float(t) if share_divisor is None else share_divisor
    if not (
        isinstance(divisor, numbers.Real)
        and not isinstance(divisor, bool)
        and math.isfinite(divisor)
        and 0 < divisor <= t
    ):
        raise ConfigError(
            f"share_divisor must be a number in (0, min_survivors={t}], got {share_divisor!r}"
        )
    if not (0.0 < failure_prob < 1.0):
        raise ConfigError(f"failure probability must be in (0, 1), got {failure_prob!r}")
    d2 = rounded_l2_bound(c * float(scale), d, rounding_beta)
    d1 = d2 * min(math.sqrt(d), d2)
    share_sigma = z * d2 / math.sqrt(float(divisor))
    if share_sigma < 0.5:
        raise ConfigError(
            f"discrete noise share sigma {share_sigma!r} is below 0.5 integer units; "
            "increase the fixed-point scale or the noise multiplier"
        )
    plan = DistributedNoisePlan(
        clip=c,
        noise_multiplier=z,
        scale=float(scale),
        dim=d,
        min_survivors=t,
        cohort_size=n_max,
        failure_prob=float(failure_prob),
        rounding_beta=float(rounding_beta),
        l2_sensitivity_after_rounding=d2,
        l1_sensitivity_after_rounding=d1,
        share_sigma=share_sigma,
        noise_bound=0,
        per_coordinate_bound=0,
        min_ring_bits=0,
    )
    noise = plan.noise_sum_bound(n_max)
    total = n_max * math.floor(d2) + noise
    bits = (2 * total + 1 - 1).bit_length()  # smallest k with 2**k >= 2*total + 1
    return DistributedNoisePlan(
        **{
            **plan.__dict__,
            "noise_bound": noise,
            "per_coordinate_bound": total,
            "min_ring_bits": bits,
        }
    )


@dataclass(frozen=True, kw_only=True)
class DistributedDiscreteGaussian:
    """Client-side distributed discrete Gaussian mechanism for the secure-aggregation ring.

    Each client rounds its clipped, scaled update with :meth:`round_update` and adds
    :meth:`client_share`; the server only sees the modular sum. Account each round with
    :meth:`event` and the number of clients whose masked input (and so share) survived.
    """

    plan: DistributedNoisePlan

    def round_update(
        self, x: torch.Tensor, *, generator: torch.Generator | None, secure: bool = False
    ) -> torch.Tensor:
        """Conditional randomized rounding of clipped float updates ``[m, d]`` to int64."""
        if x.shape[-1] != self.plan.dim:
            raise DataError(f"update dimension {x.shape[-1]} != planned dim {self.plan.dim}")
        return conditional_randomized_round(
            x,
            scale=self.plan.scale,
            l2_bound=self.plan.l2_sensitivity_after_rounding,
            generator=generator,
            secure=secure,
        )

    def client_share(
        self, n_clients: int = 1, *, generator: torch.Generator | None, secure: bool = False
    ) -> torch.Tensor:
        """Noise shares for ``n_clients`` clients as int64 ``[n_clients, d]``."""
        n = _positive_int(n_clients, "n_clients")
        return discrete_gaussian(
            (n, self.plan.dim), self.plan.share_sigma, generator=generator, secure=secure
        )

    def event(self, round: int, *, sample_rate: float, noise_contributors: int) -> PrivacyEvent:
        """The ledger event of a release whose sum holds ``noise_contributors`` shares."""
        return self.plan.event(
            round, sample_rate=sample_rate, noise_contributors=noise_contributors
        )


def distributed_epsilon(
    plan: DistributedNoisePlan,
    *,
    sample_rate: float,
    steps: int,
    delta: float,
    noise_contributors: int | None = None,
) -> float:
    """Epsilon of ``steps`` rounds of ``plan`` with ``noise_contributors`` shares each
    (default: the minimum survivors t, the worst case the plan allows)."""
    n = plan.min_survivors if noise_contributors is None else noise_contributors
    q = check_sample_rate(sample_rate)
    orders = rdp_orders(integer_only=q < 1.0)
    rdp = plan.rdp(orders, sample_rate=q, noise_contributors=n)
    return rdp_to_epsilon(orders, check_steps(steps) * rdp, check_delta(delta))


def calibrate_distributed_noise_multiplier(
    *,
    epsilon: float,
    delta: float,
    sample_rate: float,
    steps: int,
    clip: float,
    scale: float,
    dim: int,
    min_survivors: int,
    rounding_beta: float = DEFAULT_ROUNDING_BETA,
    n_users: int | None = None,
    rel_tol: float = 1e-3,
) -> float:
    """The smallest-found sigma whose distributed discrete plan stays within ``epsilon``.

    Bisects on the RDP accounting of :func:`distributed_epsilon` at ``t`` survivors every
    round (the worst case the protocol admits); the result never overshoots.

    Raises:
        ConfigError: On invalid input or if no sigma up to ``MAX_NOISE_MULTIPLIER`` (1e6)
            reaches the target.
    """
    eps = check_epsilon(epsilon)
    d = check_delta(delta, n_users=n_users)
    q = check_sample_rate(sample_rate)
    n = check_steps(steps)

    def eps_at(z: float) -> float:
        plan = distributed_noise_plan(
            clip=clip,
            noise_multiplier=z,
            scale=scale,
            dim=dim,
            min_survivors=min_survivors,
            rounding_beta=rounding_beta,
        )
        return distributed_epsilon(plan, sample_rate=q, steps=n, delta=d)

    # share sigma must be >= 0.5: start the search there.
    d2 = rounded_l2_bound(
        _check_clip(clip) * float(scale), _positive_int(dim, "dim"), rounding_beta
    )
    lo = 0.5 * math.sqrt(_positive_int(min_survivors, "min_survivors")) / d2
    # lo * d2 / sqrt(t) can round to just below 0.5 (for ~7 % of t), which the plan refuses.
    while lo * d2 / math.sqrt(min_survivors) < 0.5:
        lo = math.nextafter(lo, math.inf)
    if eps_at(lo) <= eps:
        return lo
    hi = max(2.0 * lo, 1.0)
    while eps_at(hi) > eps:
        if hi >= MAX_NOISE_MULTIPLIER:
            raise ConfigError(
                f"cannot reach epsilon={eps!r} at delta={d!r} with {n} rounds: the required "
                "noise multiplier exceeds 1e6 (or discretisation dominates: raise the scale)"
            )
        hi = min(2.0 * hi, MAX_NOISE_MULTIPLIER)  # the last step tries 1e6 itself
    while hi - lo > rel_tol * hi:
        mid = 0.5 * (lo + hi)
        if eps_at(mid) > eps:
            lo = mid
        else:
            hi = mid
    return hi
