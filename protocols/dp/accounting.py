"""Privacy accounting as pure functions over Opacus's accountants plus RDP bounds for the
distributed discrete Gaussian.

Continuous Gaussian noise (central, or distributed float shares) is accounted exactly as the
Poisson-subsampled Gaussian mechanism with Opacus's PRV accountant (Gopi et al. 2021,
default) or RDP accountant (Mironov et al. 2019). The distributed discrete Gaussian has no
PRV; it is accounted only through its Renyi-DP bound (Kairouz, Liu and Steinke, ICML 2021,
Theorem 1 and Proposition 14), amplified by Poisson subsampling with the general bound of
Zhu and Wang (ICML 2019, Theorem 6), and converted to (epsilon, delta) with Balle et al.
(AISTATS 2020, Theorem 21) as in Opacus.
"""

from __future__ import annotations

import functools
import math
import numbers
import warnings
from collections.abc import Callable, Sequence
from typing import Literal, cast

import numpy as np
from opacus.accountants import RDPAccountant, create_accountant
from opacus.accountants.analysis import rdp as opacus_rdp

from protocols.errors import ConfigError

Accountant = Literal["prv", "rdp"]
#: Calibration stops once the spent epsilon is within this of the target (as Opacus).
_CALIBRATION_TOLERANCE = 0.01
ACCOUNTANTS: tuple[str, ...] = ("prv", "rdp")
#: PRV is only asked when the RDP bound is at most this and every sigma at least
#: ``PRV_MIN_SIGMA``; outside that the RDP bound is returned (see :func:`gaussian_epsilon`).
PRV_MAX_EPSILON = 100.0
PRV_MIN_SIGMA = 0.5
#: PRV is only asked when its grid has at most this many points. Opacus's PRV discretises
#: the privacy-loss distribution on ``2 L / mesh`` points with ``L >= epsilon + 3`` and
#: ``mesh = eps_error / sqrt(steps * log(12 / delta_error) / 2)`` (Gopi et al. 2021; Opacus
#: ``PRVAccountant._get_domain``, eps_error 0.01, delta_error delta / 1000), so the grid grows
#: with ``sqrt(steps)``: 1e6 rounds took over 30 s per epsilon (a calibration asks ~20),
#: 1e12 steps asked for a 55 GiB array. 2**20 points take about a second and ~50 MB; the
#: grid of 1000 rounds at sample rate 0.1 and sigma 1 has 0.8e6, of 1e6 rounds at least 1.9e6.
PRV_MAX_POINTS = 1 << 20
_PRV_EPS_ERROR = 0.01
#: The smallest noise multiplier accepted (``2**-500``, about ``3.1e-151``; the bound of
#: ``securefed.config.MIN_NOISE_MULTIPLIER``). Opacus divides by ``sigma**2``, which stops
#: being a normal float64 below about ``1.5e-154``: ``1e-200`` raised ``ZeroDivisionError``
#: at sample rate 1, and its fractional-order series at sample rate 0.5 never ended for
#: ``1e-160`` (it meets ``inf - inf`` even just above ``1.5e-154``). Any sigma below about
#: 0.3 promises nothing anyway (epsilon is above 1e301 here); the bound turns a crash or a
#: hang into a clear error.
MIN_NOISE_MULTIPLIER = 2.0**-500
#: Calibration gives up when even this noise multiplier does not reach the target.
MAX_NOISE_MULTIPLIER = 1e6

#: Integer RDP orders used whenever a discrete-Gaussian event is in the composition (the
#: subsampling bound of Zhu and Wang is stated for integer orders).
INTEGER_ORDERS: tuple[int, ...] = tuple(range(2, 129)) + (160, 192, 256, 384, 512)
#: Orders used when no subsampled discrete event needs integer orders: Opacus's default
#: grid (fractional orders near 1 matter for large epsilon) merged with the integer grid.
ALL_ORDERS: tuple[float, ...] = tuple(
    sorted({1.0 + x / 10.0 for x in range(1, 100)} | {float(a) for a in INTEGER_ORDERS})
)


def rdp_orders(*, integer_only: bool) -> tuple[float, ...]:
    """The RDP order grid: integer orders if a subsampled discrete event is present."""
    return tuple(float(a) for a in INTEGER_ORDERS) if integer_only else ALL_ORDERS


# ---------------------------------------------------------------------------- validation
def check_epsilon(epsilon: float, name: str = "epsilon") -> float:
    """Return ``epsilon`` as float if it is finite and > 0, else raise ConfigError."""
    if isinstance(epsilon, bool) or not isinstance(epsilon, numbers.Real):
        raise ConfigError(f"{name} must be a number > 0, got {epsilon!r}")
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ConfigError(f"{name} must be a finite number > 0, got {epsilon!r}")
    return float(epsilon)


def check_delta(delta: float, *, n_users: int | None = None) -> float:
    """Validate delta, and refuse ``delta >= 1 / n_users`` when ``n_users`` is known.

    A delta of ``1/n`` or more admits the mechanism that publishes one random user's data
    in the clear, so it is no meaningful guarantee for a population of ``n`` users.
    """
    if isinstance(delta, bool) or not isinstance(delta, numbers.Real):
        raise ConfigError(f"delta must be in (0, 1), got {delta!r}")
    if not (0.0 < delta < 1.0):
        raise ConfigError(f"delta must be in (0, 1), got {delta!r}")
    if n_users is not None:
        if isinstance(n_users, bool) or not isinstance(n_users, int) or n_users < 1:
            raise ConfigError(f"n_users must be a positive integer, got {n_users!r}")
        if delta >= 1.0 / n_users:
            raise ConfigError(
                f"delta must be below 1/n_users = {1.0 / n_users:.3g} for {n_users} users, "
                f"got {delta!r}; a delta this large allows publishing one user's data in the "
                f"clear; choose delta <= {0.1 / n_users:.1g}"
            )
    return float(delta)


def check_sample_rate(sample_rate: float) -> float:
    """Return the sample rate as float if it is in (0, 1], else raise ConfigError."""
    if isinstance(sample_rate, bool) or not isinstance(sample_rate, numbers.Real):
        raise ConfigError(f"sample rate must be in (0, 1], got {sample_rate!r}")
    if not (0.0 < sample_rate <= 1.0):
        raise ConfigError(f"sample rate must be in (0, 1], got {sample_rate!r}")
    return float(sample_rate)


def check_steps(steps: int) -> int:
    """Return ``steps`` if it is an integer >= 1, else raise ConfigError."""
    if isinstance(steps, bool) or not isinstance(steps, int | np.integer) or steps < 1:
        raise ConfigError(f"steps must be an integer >= 1, got {steps!r}")
    return int(steps)


def check_noise_multiplier(noise_multiplier: float) -> float:
    """Return the noise multiplier as float if it is finite and at least
    ``MIN_NOISE_MULTIPLIER`` (``2**-500``), else raise ConfigError."""
    if isinstance(noise_multiplier, bool) or not isinstance(noise_multiplier, numbers.Real):
        raise ConfigError(f"noise multiplier must be a number > 0, got {noise_multiplier!r}")
    if not (math.isfinite(noise_multiplier) and noise_multiplier > 0):
        raise ConfigError(f"noise multiplier must be a finite number > 0, got {noise_multiplier!r}")
    if noise_multiplier < MIN_NOISE_MULTIPLIER:
        raise ConfigError(
            f"noise multiplier must be >= 2**-500 (a smaller one underflows in the "
            f"accountant; below ~0.3 it promises nothing anyway), got {noise_multiplier!r}"
        )
    return float(noise_multiplier)


def check_accountant(accountant: str) -> Accountant:
    """Return ``accountant`` if it names a supported accountant, else raise ConfigError."""
    if accountant in ACCOUNTANTS:
        return cast(Accountant, accountant)
    raise ConfigError(f"accountant must be one of {ACCOUNTANTS}, got {accountant!r}")


# ------------------------------------------------------------------- Gaussian (Opacus)
def gaussian_epsilon(
    history: Sequence[tuple[float, float, int]], *, delta: float, accountant: str
) -> float:
    """Epsilon of a composition of Poisson-subsampled Gaussian mechanisms.

    Args:
        history: ``(noise_multiplier, sample_rate, steps)`` triples, composed in any order.
        delta: Target delta.
        accountant: ``"prv"`` or ``"rdp"`` (Opacus's implementations).

    Returns:
        An upper bound on epsilon (PRV returns its certified upper bound). With PRV, when
        the RDP bound exceeds ``PRV_MAX_EPSILON``, some sigma is below ``PRV_MIN_SIGMA`` or
        PRV's grid would exceed ``PRV_MAX_POINTS`` (very many steps) the RDP bound is
        returned: PRV's domain would not fit in memory or time there; so it is where delta
        is below PRV's floating-point resolution (about 1e-13).
    """
    if not history:
        return 0.0
    accountant = check_accountant(accountant)
    if accountant == "prv" and not _prv_fits(
        history, delta=delta, epsilon=_integer_rdp_bound(history, delta=delta)
    ):
        # The integer orders' bound is at least the full grid's (a subset of Opacus's
        # orders; fractional ones near 1 are slow at large sample rates): where PRV fits
        # with it, it fits with the full bound too; otherwise the full bound decides.
        rdp_bound = gaussian_epsilon(history, delta=delta, accountant="rdp")
        if not _prv_fits(history, delta=delta, epsilon=rdp_bound):
            # Opacus's PRV discretises the privacy-loss distribution on a domain whose size
            # grows as sigma shrinks: sigma 0.05 would need a 2.6 TiB array, sigma 0.2 takes
            # ~30 s and returns inf. Here the RDP bound is returned instead: it is also an
            # upper bound, PRV would tighten it by under 10 %, and a budget this large
            # promises nothing anyway.
            return rdp_bound
    acc = create_accountant(mechanism=accountant)
    acc.history = [(float(z), float(q), int(n)) for z, q, n in history]
    with warnings.catch_warnings(), np.errstate(divide="ignore", invalid="ignore"):
        # q = 1 makes Opacus's PRV evaluate log(1 - q) = -inf harmlessly; RDP warns when
        # the optimal order is at the edge of its grid. Neither affects the bound.
        warnings.simplefilter("ignore")
        try:
            return float(acc.get_epsilon(delta=delta))
        except ValueError as exc:
            # PRV refuses a delta below its grid's floating-point resolution (about 1e-13 at
            # typical domains: "Floating point errors will dominate"); RDP, also an upper
            # bound, answers there.
            if accountant != "prv" or "Floating point errors" not in str(exc):
                raise
            return gaussian_epsilon(history, delta=delta, accountant="rdp")


#: The integer orders of Opacus's RDP accountant's grid (``RDPAccountant.DEFAULT_ALPHAS``:
#: 1.1 to 10.9 in steps of 0.1, then 12 to 63; 11 is not in it), read off it so the subset
#: stays a subset.
_OPACUS_INTEGER_ORDERS: tuple[float, ...] = tuple(
    float(a) for a in RDPAccountant.DEFAULT_ALPHAS if float(a).is_integer()
)


def _integer_rdp_bound(history: Sequence[tuple[float, float, int]], *, delta: float) -> float:
    """The RDP bound of ``history`` over the integer orders of Opacus's default grid: at
    least the bound over the whole grid (the min over a subset), at a fraction of its cost
    where the sample rate is large."""
    orders = list(_OPACUS_INTEGER_ORDERS)
    total = np.zeros(len(orders))
    with warnings.catch_warnings(), np.errstate(divide="ignore", invalid="ignore"):
        warnings.simplefilter("ignore")
        for z, q, n in history:
            total += np.asarray(
                opacus_rdp.compute_rdp(
                    q=float(q), noise_multiplier=float(z), steps=int(n), orders=orders
                )
            )
        eps, _ = opacus_rdp.get_privacy_spent(orders=orders, rdp=total, delta=delta)
    return float(eps)


def _prv_fits(history: Sequence[tuple[float, float, int]], *, delta: float, epsilon: float) -> bool:
    """Whether Opacus's PRV is asked about ``history`` whose RDP bound is ``epsilon``
    (:func:`gaussian_epsilon`: the bound at most ``PRV_MAX_EPSILON``, every sigma at least
    ``PRV_MIN_SIGMA``, the grid at most ``PRV_MAX_POINTS``); monotone in ``epsilon``."""
    return not (
        epsilon > PRV_MAX_EPSILON
        or min(float(z) for z, _, _ in history) < PRV_MIN_SIGMA
        or prv_grid_points(history, delta=delta, epsilon=epsilon) > PRV_MAX_POINTS
    )


def prv_grid_points(
    history: Sequence[tuple[float, float, int]], *, delta: float, epsilon: float
) -> float:
    """A lower bound on the number of grid points Opacus's PRV accountant would allocate.

    ``2 L / mesh`` with ``L = epsilon + 3`` (Opacus takes ``L >= `` the RDP epsilon at
    ``delta_error / 4``, which is at least the RDP ``epsilon`` at ``delta``) and
    ``mesh = eps_error / sqrt(steps * log(12 / delta_error) / 2)``.
    """
    steps = sum(int(n) for _, _, n in history)
    delta_error = delta / 1000.0
    mesh = _PRV_EPS_ERROR / math.sqrt(steps * math.log(12.0 / delta_error) / 2.0)
    return 2.0 * (max(epsilon, _PRV_EPS_ERROR) + 3.0) / mesh


def compute_epsilon(
    *,
    noise_multiplier: float,
    sample_rate: float,
    steps: int,
    delta: float,
    accountant: Accountant = "prv",
) -> float:
    """Epsilon after ``steps`` rounds of the Poisson-subsampled Gaussian mechanism.

    Unit of privacy: whatever one clipped row stands for (a user for DP-FedAvg); the L2
    sensitivity is the clip C and the noise std is ``noise_multiplier * C``. Use
    ``sample_rate=1`` for fixed-size cohorts (no amplification is claimed for them).

    Args:
        noise_multiplier: sigma, the noise std divided by the L2 sensitivity.
        sample_rate: Poisson sampling probability q in (0, 1].
        steps: Number of rounds.
        delta: Target delta.
        accountant: ``"prv"`` (Gopi et al. NeurIPS 2021) or ``"rdp"`` (Mironov et al. 2019).

    Returns:
        The accountant's upper bound on epsilon.
    """
    z = check_noise_multiplier(noise_multiplier)
    q = check_sample_rate(sample_rate)
    n = check_steps(steps)
    d = check_delta(delta)
    return gaussian_epsilon([(z, q, n)], delta=d, accountant=accountant)


def calibrate_noise_multiplier(
    *,
    epsilon: float,
    delta: float,
    sample_rate: float,
    steps: int,
    accountant: Accountant = "prv",
    n_users: int | None = None,
) -> float:
    """The noise multiplier that reaches at most ``epsilon`` after ``steps`` rounds.

    Bisects like Opacus's ``get_noise_multiplier`` (from [0, 10], doubling the upper end
    until it is private enough; stops within 0.01 of the target epsilon) but through
    :func:`gaussian_epsilon`, so PRV is never asked about a sigma it cannot handle. The
    returned sigma never overshoots: ``compute_epsilon`` with it is ``<= epsilon``. Same
    unit of privacy and sensitivity as :func:`compute_epsilon`.

    Args:
        epsilon: Target epsilon > 0.
        delta: Target delta in (0, 1); below ``1/n_users`` when ``n_users`` is given.
        sample_rate: Poisson sampling probability q in (0, 1].
        steps: Number of rounds.
        accountant: ``"prv"`` or ``"rdp"``.
        n_users: Population size, to refuse ``delta >= 1/n_users``.

    Returns:
        sigma such that the composition is (epsilon', delta)-DP with epsilon' <= epsilon.

    Raises:
        ConfigError: On invalid input or if no sigma up to ``MAX_NOISE_MULTIPLIER`` (1e6)
            reaches the target.
    """
    return _calibrated(
        check_epsilon(epsilon),
        check_delta(delta, n_users=n_users),
        check_sample_rate(sample_rate),
        check_steps(steps),
        check_accountant(accountant),
    )


@functools.lru_cache(maxsize=256)
def _calibrated(eps: float, d: float, q: float, n: int, acc: Accountant) -> float:
    """:func:`calibrate_noise_multiplier` on checked arguments, remembered: a run asks the
    same question more than once (a model's rules and its aggregator), and each answer
    costs a few dozen accountant calls."""

    def spent(sigma: float) -> float:
        # gaussian_epsilon, not Opacus's get_noise_multiplier: the bisection probes small
        # sigmas on its way, and only gaussian_epsilon keeps PRV away from those (below
        # PRV_MIN_SIGMA or above PRV_MAX_EPSILON it answers with the RDP bound).
        return gaussian_epsilon([(sigma, q, n)], delta=d, accountant=acc)

    low, high = 0.0, 10.0
    eps_high = spent(high)
    while eps_high > eps:
        if high >= MAX_NOISE_MULTIPLIER:
            raise ConfigError(
                f"cannot reach epsilon={eps!r} at delta={d!r} with {n} rounds at sample rate "
                f"{q!r}: the required noise multiplier exceeds 1e6; raise epsilon or lower rounds"
            )
        # The last step is cut to the bound, so that 1e6 itself is tried.
        low, high = high, min(2.0 * high, MAX_NOISE_MULTIPLIER)
        eps_high = spent(high)
    # Invariant: spent(high) <= eps < spent(low), so high never overshoots.
    while eps - eps_high > _CALIBRATION_TOLERANCE and high - low > 1e-9 * high:
        mid = 0.5 * (low + high)
        eps_mid = spent(mid)
        if eps_mid > eps:
            low = mid
        else:
            high, eps_high = mid, eps_mid
    return high


# ---------------------------------------------------------------- discrete Gaussian RDP
def ddg_tau(share_sigma: float, n_contributors: int) -> float:
    """Kairouz-Liu-Steinke (ICML 2021) Theorem 1 inflation term tau.

    ``tau = 10 * sum_{k=1}^{n-1} exp(-2 pi^2 sigma^2 k / (k + 1))`` for ``n`` i.i.d.
    N_Z(0, sigma^2) shares; it measures how far their sum is from a discrete Gaussian.
    """
    if n_contributors <= 1:
        return 0.0
    k = np.arange(1, n_contributors, dtype=np.float64)
    return float(10.0 * np.exp(-2.0 * math.pi**2 * share_sigma**2 * k / (k + 1.0)).sum())


def ddg_rdp(
    orders: Sequence[float] | np.ndarray,
    *,
    share_sigma: float,
    l2_sensitivity: float,
    l1_sensitivity: float,
    dim: int,
    n_contributors: int,
) -> np.ndarray:
    """RDP of one release of a sum of integer vectors plus ``n`` discrete Gaussian shares.

    Kairouz, Liu and Steinke, "The Distributed Discrete Gaussian Mechanism for Federated
    Learning with Secure Aggregation" (ICML 2021), Theorem 1 / Proposition 14: with ``n``
    i.i.d. N_Z(0, s^2)^d shares (s >= 1/2), for any integer difference vector of L2 norm
    <= D2 and L1 norm <= D1, the Renyi divergence of order alpha is at most
    ``min(alpha/2 * a^2 + tau*d, alpha/2 * (a^2 + 2*b*tau + tau^2*d),
    alpha/2 * (a + sqrt(d)*tau)^2)`` with ``a = D2/(sqrt(n) s)``, ``b = D1/(sqrt(n) s)``
    and tau from :func:`ddg_tau`. For ``n = 1`` (tau = 0) this is the discrete Gaussian's
    exact bound ``alpha D2^2 / (2 s^2)`` (Canonne-Kamath-Steinke 2020, Thm. 4).

    Unit of privacy: one participant, whose rounded integer update is the difference vector.

    Args:
        orders: RDP orders alpha > 1.
        share_sigma: Each share's discrete-Gaussian scale s, in integer units.
        l2_sensitivity: D2, in integer units (after rounding).
        l1_sensitivity: D1, in integer units (after rounding).
        dim: Number of coordinates d.
        n_contributors: Number of shares n actually in the sum.

    Returns:
        The RDP values at ``orders`` (float64 array).
    """
    if share_sigma < 0.5:
        raise ConfigError(
            f"discrete Gaussian share sigma must be >= 0.5 integer units for the "
            f"Kairouz et al. bound, got {share_sigma!r}; increase the fixed-point scale"
        )
    alpha = np.asarray(orders, dtype=np.float64)
    root = math.sqrt(n_contributors) * share_sigma
    a = l2_sensitivity / root
    b = l1_sensitivity / root
    tau = ddg_tau(share_sigma, n_contributors)
    t1 = alpha / 2.0 * a * a + tau * dim
    t2 = alpha / 2.0 * (a * a + 2.0 * b * tau + tau * tau * dim)
    t3 = alpha / 2.0 * (a + math.sqrt(dim) * tau) ** 2
    return np.minimum(np.minimum(t1, t2), t3)


def poisson_subsampled_rdp(
    rdp_fn: Callable[[np.ndarray], np.ndarray],
    orders: Sequence[float] | np.ndarray,
    sample_rate: float,
) -> np.ndarray:
    """General RDP amplification by Poisson subsampling (Zhu and Wang, ICML 2019, Thm. 6).

    For a mechanism with RDP ``eps(l)`` (add/remove neighbours) and integer order
    ``alpha >= 2``, the mechanism run on a Poisson sample with rate q satisfies RDP at most
    ``1/(alpha-1) * log((1-q)^(alpha-1) (alpha q - q + 1) + C(alpha,2) q^2 (1-q)^(alpha-2)
    e^{eps(2)} + 3 sum_{l=3}^{alpha} C(alpha,l) (1-q)^(alpha-l) q^l e^{(l-1) eps(l)})``,
    and never more than ``eps(alpha)`` itself. Valid for any mechanism, not only Gaussians.

    Args:
        rdp_fn: Maps an array of integer orders to the mechanism's RDP at those orders.
        orders: Integer orders >= 2 (any orders > 1 when ``sample_rate == 1``).
        sample_rate: q in (0, 1].

    Returns:
        The amplified RDP at ``orders``.
    """
    q = float(sample_rate)
    if q >= 1.0:  # no subsampling: any order > 1
        return np.asarray(rdp_fn(np.asarray(orders, dtype=np.float64)), dtype=np.float64)
    alphas = [int(a) for a in orders]
    if any(a < 2 or a != o for a, o in zip(alphas, orders, strict=True)):
        raise ConfigError(f"subsampled RDP needs integer orders >= 2, got {list(orders)!r}")
    max_order = max(alphas)
    ls = np.arange(0, max_order + 1, dtype=np.float64)
    eps_l = np.zeros(max_order + 1)
    eps_l[2:] = rdp_fn(ls[2:])
    plain = rdp_fn(np.asarray(alphas, dtype=np.float64))
    log_q, log_1q = math.log(q), math.log1p(-q)
    out = np.empty(len(alphas))
    for i, a in enumerate(alphas):
        terms = [(a - 1) * log_1q + math.log(a * q - q + 1.0)]
        ls_a = np.arange(2, a + 1)
        log_comb = np.array(
            [math.lgamma(a + 1) - math.lgamma(j + 1) - math.lgamma(a - j + 1) for j in ls_a]
        )
        body = log_comb + (a - ls_a) * log_1q + ls_a * log_q + (ls_a - 1) * eps_l[2 : a + 1]
        body[1:] += math.log(3.0)  # l >= 3 carries the factor 3
        all_terms = np.concatenate([np.array(terms), body])
        m = float(all_terms.max())
        lse = m + math.log(float(np.exp(all_terms - m).sum()))
        out[i] = min(lse / (a - 1), float(plain[i]))
    return out


def rdp_to_epsilon(orders: Sequence[float], rdp: np.ndarray, delta: float) -> float:
    """Convert composed RDP to epsilon at ``delta`` (Balle et al. 2020, Thm. 21, via Opacus)."""
    with warnings.catch_warnings(), np.errstate(invalid="ignore", over="ignore"):
        warnings.simplefilter("ignore")
        eps, _ = opacus_rdp.get_privacy_spent(
            orders=list(orders), rdp=np.asarray(rdp, dtype=np.float64), delta=delta
        )
    return float(eps)


def gaussian_rdp(orders: Sequence[float], *, noise_multiplier: float, sample_rate: float):
    """RDP of one Poisson-subsampled Gaussian step at ``orders`` (Mironov et al. 2019)."""
    return np.asarray(
        opacus_rdp.compute_rdp(
            q=sample_rate, noise_multiplier=noise_multiplier, steps=1, orders=list(orders)
        ),
        dtype=np.float64,
    )
