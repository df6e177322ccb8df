"""Tests written for surviving mutants of the sixth mutation run (docs/mutation.md, "Sixth
run"): ``dp/accounting.py``'s validation helpers, ``gaussian_epsilon``, ``prv_grid_points``
and ``calibrate_noise_multiplier``, and ``dp/noise.py``'s source check. Each pins a stated
behaviour that a mutant changed without failing an earlier test: the checks' exact messages
and the types they refuse, PRV's grid written out against Opacus's own domain, the
accountant switch at ``PRV_MIN_SIGMA``, the smallest accepted noise multiplier and the
calibrations' 1e6 bound.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch
from opacus.accountants import create_accountant
from opacus.accountants.analysis.prv import PoissonSubsampledGaussianPRV
from opacus.accountants.prv import PRVAccountant

from protocols.dp import noise
from protocols.dp.accounting import (
    MAX_NOISE_MULTIPLIER,
    MIN_NOISE_MULTIPLIER,
    PRV_MIN_SIGMA,
    calibrate_noise_multiplier,
    check_delta,
    check_epsilon,
    check_noise_multiplier,
    check_sample_rate,
    check_steps,
    compute_epsilon,
    gaussian_epsilon,
    prv_grid_points,
)
from protocols.dp.ledger import PrivacyLedger
from protocols.dp.mechanisms import (
    CentralGaussian,
    calibrate_distributed_noise_multiplier,
    distributed_epsilon,
    distributed_noise_plan,
)
from protocols.errors import ConfigError

DELTA = 1e-5


def _exact(message: str) -> str:
    """A ``pytest.raises(match=...)`` pattern for exactly ``message``."""
    return "^" + re.escape(message) + "$"


# ------------------------------------------------------------------------ the checks
@pytest.mark.parametrize("bad", [True, "1.0", None])
def test_check_epsilon_refuses_non_numbers_with_its_message(bad) -> None:
    with pytest.raises(ConfigError, match=_exact(f"epsilon must be a number > 0, got {bad!r}")):
        check_epsilon(bad)
    with pytest.raises(ConfigError, match=_exact(f"budget must be a number > 0, got {bad!r}")):
        check_epsilon(bad, name="budget")


@pytest.mark.parametrize("bad", ["1e-5", None, 0.0, 1.0, math.nan, True])
def test_check_delta_refuses_non_numbers_and_values_outside_zero_one(bad) -> None:
    with pytest.raises(ConfigError, match=_exact(f"delta must be in (0, 1), got {bad!r}")):
        check_delta(bad)


@pytest.mark.parametrize("bad", [True, 2.5, "10", 0, -3])
def test_check_delta_refuses_a_population_that_is_no_positive_integer(bad) -> None:
    with pytest.raises(
        ConfigError, match=_exact(f"n_users must be a positive integer, got {bad!r}")
    ):
        check_delta(1e-9, n_users=bad)


def test_check_delta_names_the_bound_and_a_delta_to_choose() -> None:
    with pytest.raises(
        ConfigError,
        match=_exact(
            "delta must be below 1/n_users = 0.001 for 1000 users, got 0.001; a delta this "
            "large allows publishing one user's data in the clear; choose delta <= 0.0001"
        ),
    ):
        check_delta(0.001, n_users=1000)
    assert check_delta(0.0001, n_users=1000) == 0.0001


@pytest.mark.parametrize("bad", [True, "0.5", None])
def test_check_sample_rate_refuses_non_numbers_with_its_message(bad) -> None:
    with pytest.raises(ConfigError, match=_exact(f"sample rate must be in (0, 1], got {bad!r}")):
        check_sample_rate(bad)


@pytest.mark.parametrize("bad", [True, "1.0", None])
def test_check_noise_multiplier_refuses_non_numbers_with_its_message(bad) -> None:
    with pytest.raises(
        ConfigError, match=_exact(f"noise multiplier must be a number > 0, got {bad!r}")
    ):
        check_noise_multiplier(bad)


@pytest.mark.parametrize("bad", [0.0, -1.0, math.inf, -math.inf, math.nan])
def test_check_noise_multiplier_refuses_what_is_not_finite_and_positive(bad) -> None:
    """Zero is refused as not positive, not as smaller than ``MIN_NOISE_MULTIPLIER``."""
    with pytest.raises(
        ConfigError, match=_exact(f"noise multiplier must be a finite number > 0, got {bad!r}")
    ):
        check_noise_multiplier(bad)


def test_check_delta_accepts_one_user_below_one() -> None:
    """``n_users = 1`` is a positive integer: only ``delta >= 1`` is refused for it."""
    assert check_delta(0.5, n_users=1) == 0.5
    assert check_delta(math.nextafter(1.0, 0.0), n_users=1) == math.nextafter(1.0, 0.0)
    with pytest.raises(ConfigError, match=re.escape("below 1/n_users = 0.5 for 2 users")):
        check_delta(0.5, n_users=2)


@pytest.mark.parametrize("bad", [True, 2.5, "3", 0, -1, None])
def test_check_steps_refuses_what_is_no_integer_at_least_one(bad) -> None:
    with pytest.raises(ConfigError, match=_exact(f"steps must be an integer >= 1, got {bad!r}")):
        check_steps(bad)
    assert check_steps(np.int64(3)) == 3 and type(check_steps(np.int64(3))) is int


# ---------------------------------------------------------------- the smallest sigma
def test_the_smallest_noise_multiplier_is_accounted_and_anything_below_it_refused() -> None:
    """``2**-500`` gives a finite (meaningless) epsilon at once, also off ``q = 1`` where
    Opacus's fractional-order series runs; below it the accountant divided by zero
    (``1e-200`` at ``q = 1``) or never returned (``1e-160`` at ``q = 0.5``)."""
    assert MIN_NOISE_MULTIPLIER == 2.0**-500
    assert check_noise_multiplier(MIN_NOISE_MULTIPLIER) == MIN_NOISE_MULTIPLIER
    for q in (1.0, 0.5):
        eps = compute_epsilon(
            noise_multiplier=MIN_NOISE_MULTIPLIER, sample_rate=q, steps=3, delta=DELTA
        )
        assert 1e300 < eps < math.inf
    for bad in (math.nextafter(MIN_NOISE_MULTIPLIER, 0.0), 1e-160, 1e-200, 5e-324):
        message = (
            "noise multiplier must be >= 2**-500 (a smaller one underflows in the "
            f"accountant; below ~0.3 it promises nothing anyway), got {bad!r}"
        )
        with pytest.raises(ConfigError, match=_exact(message)):
            check_noise_multiplier(bad)
        with pytest.raises(ConfigError, match=_exact(message)):
            compute_epsilon(noise_multiplier=bad, sample_rate=0.5, steps=1, delta=DELTA)
        with pytest.raises(ConfigError, match=_exact(message)):
            CentralGaussian(clip=1.0, noise_multiplier=bad)


# ------------------------------------------------------------------ gaussian_epsilon
@pytest.mark.parametrize("accountant", ["prv", "rdp"])
def test_an_empty_composition_spends_nothing(accountant: str) -> None:
    assert gaussian_epsilon([], delta=DELTA, accountant=accountant) == 0.0
    assert PrivacyLedger().epsilon(DELTA, accountant) == 0.0


def test_prv_is_asked_at_exactly_the_smallest_sigma_and_rdp_just_below() -> None:
    """The RDP bound replaces PRV only when some sigma is *below* ``PRV_MIN_SIGMA``."""
    history = [(PRV_MIN_SIGMA, 1.0, 1)]
    opacus_prv = create_accountant(mechanism="prv")
    opacus_prv.history = list(history)
    prv = gaussian_epsilon(history, delta=DELTA, accountant="prv")
    rdp = gaussian_epsilon(history, delta=DELTA, accountant="rdp")
    assert prv == opacus_prv.get_epsilon(delta=DELTA)
    assert prv < rdp - 0.5  # PRV is the tighter bound here (10.0 against 10.7)
    below = [(math.nextafter(PRV_MIN_SIGMA, 0.0), 1.0, 1)]
    assert gaussian_epsilon(below, delta=DELTA, accountant="prv") == gaussian_epsilon(
        below, delta=DELTA, accountant="rdp"
    )


@pytest.mark.parametrize(
    "history",
    [[(1.0, 1.0, 1)], [(3.0, 1.0, 1000)], [(0.8, 1.0, 2), (2.0, 1.0, 3)], [(5.0, 1.0, 10)]],
)
def test_prv_grid_points_is_the_docstring_formula_on_opacus_mesh(history) -> None:
    """``2 (epsilon + 3) / mesh`` with Opacus's own mesh (``PRVAccountant._get_domain`` at
    eps_error 0.01 and delta_error delta / 1000), and never more than Opacus allocates."""
    acc = PRVAccountant()
    domain = acc._get_domain(
        prvs=[PoissonSubsampledGaussianPRV(q, z) for z, q, _ in history],
        num_self_compositions=[n for _, _, n in history],
        eps_error=0.01,
        delta_error=DELTA / 1000,
    )
    eps = gaussian_epsilon(history, delta=DELTA, accountant="rdp")
    points = prv_grid_points(history, delta=DELTA, epsilon=eps)
    assert points == pytest.approx(2.0 * (eps + 3.0) / domain.dt, rel=1e-9)
    assert points <= domain.size
    # below eps_error the bound uses eps_error (Opacus's domain is never narrower)
    assert prv_grid_points(history, delta=DELTA, epsilon=0.0) == pytest.approx(
        2.0 * 3.01 / domain.dt, rel=1e-9
    )


# ------------------------------------------------------------------ the 1e6 bound
_ONE_STEP = {"delta": DELTA, "sample_rate": 1.0, "steps": 1, "accountant": "rdp"}


def _eps(sigma: float) -> float:
    return compute_epsilon(noise_multiplier=sigma, **_ONE_STEP)


def test_calibration_reaches_every_sigma_up_to_a_million_and_refuses_beyond() -> None:
    """``no sigma up to 1e6 reaches the target`` is the only reason to give up: a target
    that needs 9e5 (beyond the last doubling of 10, 655360) or exactly 1e6 is reached."""
    assert MAX_NOISE_MULTIPLIER == 1e6
    for needed in (9e5, 1e6):
        target = _eps(needed)
        sigma = calibrate_noise_multiplier(epsilon=target, **_ONE_STEP)
        assert sigma <= 1e6 and _eps(sigma) <= target
    beyond = math.nextafter(_eps(1e6), 0.0)
    with pytest.raises(
        ConfigError,
        match=_exact(
            f"cannot reach epsilon={beyond!r} at delta=1e-05 with 1 rounds at sample rate 1.0: "
            "the required noise multiplier exceeds 1e6; raise epsilon or lower rounds"
        ),
    ):
        calibrate_noise_multiplier(epsilon=beyond, **_ONE_STEP)


_DIST = {"sample_rate": 1.0, "steps": 1, "clip": 1.0, "scale": 64.0, "dim": 10}


def _dist_eps(sigma: float) -> float:
    plan = distributed_noise_plan(
        noise_multiplier=sigma, clip=1.0, scale=64.0, dim=10, min_survivors=4
    )
    return distributed_epsilon(plan, sample_rate=1.0, steps=1, delta=DELTA)


def test_distributed_calibration_reaches_every_sigma_up_to_a_million() -> None:
    """The doubling from 1 ends at 524288; 9e5 and 1e6 must still be found."""
    for needed in (9e5, 1e6):
        target = _dist_eps(needed)
        sigma = calibrate_distributed_noise_multiplier(
            epsilon=target, delta=DELTA, min_survivors=4, **_DIST
        )
        assert sigma <= 1e6 and _dist_eps(sigma) <= target
    with pytest.raises(ConfigError, match="the required noise multiplier exceeds 1e6"):
        calibrate_distributed_noise_multiplier(
            epsilon=math.nextafter(_dist_eps(1e6), 0.0), delta=DELTA, min_survivors=4, **_DIST
        )


@pytest.mark.slow
def test_calibration_ends_when_the_target_falls_in_the_prv_rdp_jump() -> None:
    """At ``PRV_MIN_SIGMA`` the spent epsilon jumps (RDP below, PRV from there on); a
    target inside the jump is never within the tolerance, so only the interval width stops
    the bisection, at a sigma just above 0.5 that does not overshoot (3 s)."""
    history = [(PRV_MIN_SIGMA, 1.0, 1)]
    jump = (
        gaussian_epsilon(history, delta=DELTA, accountant="prv"),
        gaussian_epsilon(history, delta=DELTA, accountant="rdp"),
    )
    target = sum(jump) / 2
    sigma = calibrate_noise_multiplier(epsilon=target, delta=DELTA, sample_rate=1.0, steps=1)
    assert PRV_MIN_SIGMA <= sigma <= PRV_MIN_SIGMA * (1 + 1e-8)
    assert compute_epsilon(noise_multiplier=sigma, sample_rate=1.0, steps=1, delta=DELTA) <= target


# ----------------------------------------------------------------------- noise source
def test_the_source_check_refuses_a_generator_in_secure_mode_and_none_in_plain_mode() -> None:
    g = torch.Generator().manual_seed(0)
    with pytest.raises(
        ConfigError,
        match=_exact(
            "secure=True draws DP noise from OS randomness and refuses a generator; "
            "pass generator=None"
        ),
    ):
        noise.gaussian_noise((3,), 1.0, generator=g, secure=True)
    with pytest.raises(
        ConfigError,
        match=_exact(
            "pass an explicit torch.Generator (derive it with protocols.seeding), "
            "or set secure=True to use OS randomness"
        ),
    ):
        noise.gaussian_noise((3,), 1.0, generator=None, secure=False)
    assert noise.gaussian_noise((3,), 1.0, generator=g, secure=False).shape == (3,)
    assert noise.gaussian_noise((3,), 1.0, generator=None, secure=True).shape == (3,)


def test_calibration_stops_at_a_jump_of_the_spent_epsilon_within_relative_1e9(monkeypatch):
    """Where the accountant's epsilon jumps over the target (no sigma reaches it within the
    0.01 tolerance), the bisection still stops, at the first sigma past the jump to a relative
    1e-9 (its width rule), never at one that overshoots. At a jump near 5,000 an absolute or
    inverted width rule (``1e-9 / high``) asks for a width below the float spacing there and
    never stops."""
    from protocols.dp import accounting

    jump = 5_000.0 + 1.0 / 3.0

    def step(history, *, delta, accountant):
        ((sigma, _q, _n),) = history
        return 0.5 if sigma >= jump else 10.0

    monkeypatch.setattr(accounting, "gaussian_epsilon", step)
    sigma = accounting.calibrate_noise_multiplier(epsilon=1.0, delta=1e-5, sample_rate=1.0, steps=1)
    assert jump <= sigma <= jump * (1 + 2e-9)
