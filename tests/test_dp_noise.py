"""Statistical tests of the noise samplers, each with a stated false-failure rate."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats

from protocols.dp import (
    CentralGaussian,
    DistributedGaussian,
    discrete_gaussian,
    gaussian_noise,
    noise,
)
from protocols.errors import ConfigError
from protocols.seeding import torch_generator

#: Probability that a correct sampler fails any one statistical test below.
FALSE_FAILURE = 1e-6


def variance_matches(samples: torch.Tensor, expected_var: float) -> bool:
    """Two-sided chi-square test of a known-mean-zero sample's variance.

    With n i.i.d. N(0, v) samples, sum(x^2) / v ~ chi2(n). The acceptance interval has
    probability 1 - FALSE_FAILURE under the null.
    """
    x = samples.to(torch.float64).flatten()
    n = x.numel()
    stat = float((x * x).sum()) / expected_var
    lo = stats.chi2.ppf(FALSE_FAILURE / 2, n)
    hi = stats.chi2.isf(FALSE_FAILURE / 2, n)
    return bool(lo <= stat <= hi)


def variance_at_least(samples: torch.Tensor, min_var: float) -> bool:
    """One-sided chi-square test that the variance is not below ``min_var``."""
    x = samples.to(torch.float64).flatten()
    stat = float((x * x).sum()) / min_var
    return bool(stat >= stats.chi2.ppf(FALSE_FAILURE, x.numel()))


@pytest.mark.statistical
def test_central_noise_variance_and_power() -> None:
    mech = CentralGaussian(clip=0.7, noise_multiplier=1.3)
    g = torch_generator(0, "test", "central")
    noise = torch.stack([mech.noise_for_sum(1000, generator=g) for _ in range(400)])
    assert variance_matches(noise, (1.3 * 0.7) ** 2)
    # Power: the same test rejects a sampler whose sigma is 10% off either way.
    assert not variance_matches(noise, (1.1 * 1.3 * 0.7) ** 2)
    assert not variance_matches(noise, (0.9 * 1.3 * 0.7) ** 2)


@pytest.mark.statistical
def test_secure_noise_variance_and_power() -> None:
    noise = gaussian_noise((200_000,), 2.5, generator=None, secure=True, dtype=torch.float64)
    assert variance_matches(noise, 2.5**2)
    assert not variance_matches(noise, (1.1 * 2.5) ** 2)
    assert not variance_matches(noise, (0.9 * 2.5) ** 2)
    # Symmetric around 0: mean within a 1e-6 two-sided z-bound.
    z = stats.norm.isf(FALSE_FAILURE / 2)
    assert abs(float(noise.mean())) <= z * 2.5 / math.sqrt(noise.numel())


@pytest.mark.statistical
def test_distributed_shares_carry_calibrated_variance_at_min_survivors() -> None:
    t = 8
    mech = DistributedGaussian(clip=1.5, noise_multiplier=0.9, min_survivors=t)
    g = torch_generator(1, "test", "shares")
    sums = torch.stack([mech.client_share((t, 2000), generator=g).sum(dim=0) for _ in range(100)])
    target = (0.9 * 1.5) ** 2
    assert variance_matches(sums, target)
    assert not variance_matches(sums, 1.1 * 1.1 * target)
    # With one fewer survivor than assumed, the noise is below target: detected.
    short = torch.stack(
        [mech.client_share((t - 2, 2000), generator=g).sum(dim=0) for _ in range(100)]
    )
    assert not variance_at_least(short, target)


def discrete_gaussian_pmf(sigma: float, support: np.ndarray) -> np.ndarray:
    k = np.arange(-200 - int(20 * sigma), 201 + int(20 * sigma))
    norm = np.exp(-(k**2) / (2 * sigma**2)).sum()
    return np.exp(-(support**2) / (2 * sigma**2)) / norm


def chi_square_pvalue(samples: torch.Tensor, sigma: float) -> float:
    """Pearson chi-square of samples against N_Z(0, sigma^2), tails pooled to expected >= 20."""
    x = samples.numpy()
    n = x.size
    half = 0
    while n * discrete_gaussian_pmf(sigma, np.array([half + 1]))[0] >= 20:
        half += 1
    support = np.arange(-half, half + 1)
    probs = discrete_gaussian_pmf(sigma, support)
    tail = (1.0 - probs.sum()) / 2
    observed = np.array(
        [np.sum(x < -half)] + [np.sum(x == k) for k in support] + [np.sum(x > half)]
    )
    expected = n * np.concatenate([[tail], probs, [tail]])
    keep = expected > 0
    if tail * n < 5:  # pool the tails into the end bins
        observed[1] += observed[0]
        observed[-2] += observed[-1]
        expected[1] += expected[0]
        expected[-2] += expected[-1]
        keep[[0, -1]] = False
    obs, exp = observed[keep], expected[keep]
    stat = float(((obs - exp) ** 2 / exp).sum())
    return float(stats.chi2.sf(stat, obs.size - 1))


@pytest.mark.statistical
@pytest.mark.parametrize("sigma", [0.5, 1.0, 3.0])
@pytest.mark.parametrize("secure", [False, True])
@pytest.mark.parametrize("chunk", [None, 997])
def test_discrete_gaussian_exact_distribution(
    sigma: float, secure: bool, chunk: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    if chunk is not None:  # many chunks, the last one partial: every element must be drawn
        monkeypatch.setattr(noise, "CHUNK", chunk)
    g = None if secure else torch_generator(2, "test", "dgauss", str(sigma))
    x = discrete_gaussian((200_000,), sigma, generator=g, secure=secure)
    assert x.dtype == torch.int64
    assert chi_square_pvalue(x, sigma) > FALSE_FAILURE


@pytest.mark.statistical
def test_discrete_gaussian_chi_square_has_power() -> None:
    g = torch_generator(3, "test", "dgauss-power")
    x = discrete_gaussian((200_000,), 1.0, generator=g)
    assert chi_square_pvalue(x, 1.0) > FALSE_FAILURE
    assert chi_square_pvalue(x, 1.1) < FALSE_FAILURE
    assert chi_square_pvalue(x, 0.9) < FALSE_FAILURE


def test_generators_are_reproducible() -> None:
    a = gaussian_noise((50,), 1.0, generator=torch_generator(4, "x"))
    b = gaussian_noise((50,), 1.0, generator=torch_generator(4, "x"))
    assert torch.equal(a, b)
    c = discrete_gaussian((50,), 2.0, generator=torch_generator(4, "y"))
    d = discrete_gaussian((50,), 2.0, generator=torch_generator(4, "y"))
    assert torch.equal(c, d)


def test_secure_mode_refuses_generator_and_plain_mode_requires_one() -> None:
    g = torch.Generator().manual_seed(0)
    with pytest.raises(ConfigError, match="refuses a generator"):
        gaussian_noise((3,), 1.0, generator=g, secure=True)
    with pytest.raises(ConfigError, match="refuses a generator"):
        discrete_gaussian((3,), 1.0, generator=g, secure=True)
    with pytest.raises(ConfigError, match="explicit torch.Generator"):
        gaussian_noise((3,), 1.0, generator=None)
    with pytest.raises(ConfigError, match="explicit torch.Generator"):
        discrete_gaussian((3,), 1.0, generator=None)


def test_bad_noise_parameters() -> None:
    g = torch.Generator().manual_seed(0)
    with pytest.raises(ConfigError, match="std must be"):
        gaussian_noise((3,), -1.0, generator=g)
    with pytest.raises(ConfigError, match="sigma must be"):
        discrete_gaussian((3,), 0.0, generator=g)
    with pytest.raises(ConfigError, match="shape"):
        gaussian_noise((-1,), 1.0, generator=g)
    assert torch.equal(gaussian_noise((3,), 0.0, generator=g), torch.zeros(3))
