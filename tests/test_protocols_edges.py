"""Numeric edges of the protocol functions: each is rejected by the function itself with one
clear ConfigError (a ValueError in the SecureFedError hierarchy), or computed correctly."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from opacus.accountants import PRVAccountant
from opacus.accountants.analysis.prv import PoissonSubsampledGaussianPRV

from protocols.dp import accounting, clip_rows, discrete_gaussian, gaussian_noise
from protocols.dp.accounting import calibrate_noise_multiplier, compute_epsilon, prv_grid_points
from protocols.dp.noise import DISCRETE_SIGMA_MAX, DISCRETE_SIGMA_MIN, check_std
from protocols.errors import ConfigError, DataError, SecureFedError
from protocols.secagg import FixedPointCodec

INT64_MIN = -(2**63)


def _one_line(err: pytest.ExceptionInfo) -> str:
    msg = str(err.value)
    assert "\n" not in msg
    assert isinstance(err.value, SecureFedError) and isinstance(err.value, ValueError)
    return msg


# -- the fixed-point ring ----------------------------------------------------------------------


@pytest.fixture
def codec() -> FixedPointCodec:
    return FixedPointCodec.for_sum(n_clients=4, clip=1.0, scale_bits=8, extra_int_bound=1000)


@pytest.mark.parametrize(
    "values",
    [
        np.array([INT64_MIN], dtype=np.int64),  # np.abs overflows back to INT64_MIN
        np.array([0, INT64_MIN + 1], dtype=np.int64),
        np.array([2**64 - 1], dtype=np.uint64),  # casts to int64 -1
        np.array([2**63], dtype=np.uint64),  # casts to INT64_MIN
        np.array([1001], dtype=np.int16),
        np.array([-1001], dtype=np.int64),
    ],
)
def test_to_ring_rejects_every_out_of_range_integer(codec, values):
    with pytest.raises(ConfigError) as err:
        codec.to_ring(values)
    msg = _one_line(err)
    assert "extra_int_bound=1000" in msg and f"got {int(values[-1])}" in msg


def test_to_ring_accepts_the_bounds_themselves(codec):
    got = codec.to_ring(np.array([-1000, 0, 1000], dtype=np.int64))
    total = codec.add(got, codec.to_ring(np.array([0, 0, 0])))
    np.testing.assert_array_equal(codec.decode_sum(total) * codec.scale, [-1000, 0, 1000])
    assert codec.to_ring(np.array([], dtype=np.int64)).size == 0


def test_encode_integers_rejects_int64_min_too(codec):
    with pytest.raises(ConfigError, match="per_client_bound"):
        codec.encode_integers(np.array([INT64_MIN]))


# -- noise samplers ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "sigma", [1e-300, 1e154, 1e200, 2.0**47 * 1.01, math.inf, math.nan, 0.0, -1.0]
)
@pytest.mark.parametrize("secure", [False, True])
def test_discrete_gaussian_rejects_sigmas_float64_cannot_sample(sigma, secure):
    g = None if secure else torch.Generator().manual_seed(0)
    with pytest.raises(ConfigError) as err:
        discrete_gaussian((4,), sigma, generator=g, secure=secure)
    msg = _one_line(err)
    assert f"got {sigma!r}" in msg and f"{DISCRETE_SIGMA_MAX:.3g}]" in msg


@pytest.mark.parametrize("sigma", [DISCRETE_SIGMA_MIN, 1e-20, 0.3, DISCRETE_SIGMA_MAX])
def test_discrete_gaussian_samples_at_the_ends_of_its_range(sigma):
    g = torch.Generator().manual_seed(1)
    x = discrete_gaussian((2000,), sigma, generator=g)
    assert x.dtype == torch.int64
    if sigma < 0.05:  # P[X != 0] ~ exp(-1 / (2 sigma^2)) < 1e-86
        assert bool((x == 0).all())
    else:
        assert float(x.double().abs().max()) <= 40 * (math.floor(sigma) + 1)
        assert float(x.double().std()) > 0
    if sigma == DISCRETE_SIGMA_MAX:  # every sample is an exact integer of the right size
        assert 0.5 * sigma < float(x.double().std()) < 2 * sigma


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("secure", [False, True])
def test_gaussian_noise_rejects_a_std_whose_draws_overflow_the_dtype(dtype, secure):
    g = None if secure else torch.Generator().manual_seed(0)
    too_big = torch.finfo(dtype).max / 32
    for std in (1e300, too_big, math.inf, -1e-9):
        with pytest.raises(ConfigError) as err:
            gaussian_noise((8,), std, generator=g, secure=secure, dtype=dtype)
        msg = _one_line(err)
        assert f"got {std!r}" in msg and str(dtype) in msg and "float64" in msg
    ok = gaussian_noise(
        (1000,), torch.finfo(dtype).max / 64, generator=g, secure=secure, dtype=dtype
    )
    assert bool(torch.isfinite(ok).all())


def test_gaussian_noise_std_1e300_is_finite_in_float64():
    for secure in (False, True):
        g = None if secure else torch.Generator().manual_seed(0)
        x = gaussian_noise((1000,), 1e300, generator=g, secure=secure, dtype=torch.float64)
        assert bool(torch.isfinite(x).all()) and float(x.abs().max()) > 1e299


def test_check_std_refuses_integer_dtypes():
    with pytest.raises(ConfigError, match="floating"):
        check_std(1.0, torch.int64)
    assert check_std(2, torch.float32) == 2.0


# -- clipping ----------------------------------------------------------------------------------


def test_clip_rows_clips_finite_rows_whose_squared_norm_overflows():
    x = torch.tensor(
        [[1e200, -1e200, 0.0], [3.0, 4.0, 0.0], [1.7e308, 1.7e308, 1.7e308], [1e-200, 0, 0]],
        dtype=torch.float64,
    )
    clipped, norms = clip_rows(x, 2.0)
    assert norms[0] == pytest.approx(math.sqrt(2) * 1e200, rel=1e-12)
    assert norms[1] == 5.0 and norms[3] == 0.0
    assert math.isinf(float(norms[2]))  # the honest value: beyond float64
    out = clipped.norm(dim=1)
    assert bool((out <= 2.0).all())
    assert out[0] == pytest.approx(2.0, rel=1e-5) and out[2] == pytest.approx(2.0, rel=1e-5)
    # Direction kept.
    np.testing.assert_allclose(clipped[0].numpy(), [math.sqrt(2), -math.sqrt(2), 0], rtol=1e-5)
    np.testing.assert_allclose(clipped[2].numpy(), [2 / math.sqrt(3)] * 3, rtol=1e-5)
    assert torch.equal(clipped[3], x[3])  # short rows untouched


def test_clip_rows_leaves_a_huge_row_alone_under_a_huger_clip():
    x = torch.tensor([[1e200, 1e200]], dtype=torch.float64)
    clipped, norms = clip_rows(x, 1e300)
    assert torch.equal(clipped, x)
    assert float(norms[0]) == pytest.approx(math.sqrt(2) * 1e200, rel=1e-12)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_clip_rows_still_refuses_non_finite_values(bad):
    x = torch.tensor(
        [[1.0, 2.0, 3.0, 4.0], [bad, 1e200, 1.0, bad], [1e300, 1.0, 1.0, 1.0], [bad, 0, 0, 0]],
        dtype=torch.float64,
    )
    with pytest.raises(DataError) as err:
        clip_rows(x, 1.0)
    assert str(err.value) == (
        "updates contain NaN or infinite values in 2 of 4 rows; they cannot be clipped; check "
        "local training for divergence (e.g. lower the learning rate)"
    )


# -- accounting --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("z", "q", "steps", "delta"),
    [(1.0, 0.1, 1000, 1e-5), (0.8, 0.01, 20_000, 1e-6), (2.0, 1.0, 50, 1e-5)],
)
def test_prv_grid_estimate_never_exceeds_opacus_domain(z, q, steps, delta):
    rdp = compute_epsilon(
        noise_multiplier=z, sample_rate=q, steps=steps, delta=delta, accountant="rdp"
    )
    estimate = prv_grid_points([(z, q, steps)], delta=delta, epsilon=rdp)
    domain = PRVAccountant()._get_domain(
        prvs=[PoissonSubsampledGaussianPRV(q, z)],
        num_self_compositions=[steps],
        eps_error=0.01,
        delta_error=delta / 1000,
    )
    assert estimate <= domain.size <= 20 * estimate


def _refuse_prv(monkeypatch):
    real = accounting.create_accountant

    def guarded(mechanism):
        assert mechanism != "prv", "PRV was asked for a grid beyond PRV_MAX_POINTS"
        return real(mechanism=mechanism)

    monkeypatch.setattr(accounting, "create_accountant", guarded)


def test_a_trillion_steps_use_the_rdp_bound_instead_of_a_55_gib_prv_grid(monkeypatch):
    _refuse_prv(monkeypatch)
    kw = {"noise_multiplier": 1.0, "sample_rate": 1e-6, "steps": 10**12, "delta": 1e-5}
    eps = compute_epsilon(**kw, accountant="prv")
    assert math.isfinite(eps) and eps > 0
    assert eps == compute_epsilon(**kw, accountant="rdp")


def test_calibration_for_a_million_rounds_never_builds_a_prv_grid(monkeypatch):
    _refuse_prv(monkeypatch)
    sigma = calibrate_noise_multiplier(epsilon=1.0, delta=1e-5, sample_rate=1.0, steps=10**6)
    spent = compute_epsilon(
        noise_multiplier=sigma, sample_rate=1.0, steps=10**6, delta=1e-5, accountant="rdp"
    )
    assert 0.98 <= spent <= 1.0


def test_small_compositions_still_get_the_tighter_prv_value():
    kw = {"noise_multiplier": 1.0, "sample_rate": 0.1, "steps": 100, "delta": 1e-5}
    assert compute_epsilon(**kw, accountant="prv") < compute_epsilon(**kw, accountant="rdp")
