"""Statistical tests of the noise samplers, each with a stated false-failure rate."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
import torch
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
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
        monkeypatch.setattr(noise, "SECURE_CHUNK", chunk)
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


# -- secure mode: OS randomness, four hardened samples (tests that catch broken sampling) -----


class _CountingUrandom:
    """Stands in for ``os.urandom``: counts the bytes asked for; optionally deterministic."""

    def __init__(self, seed: int | None = None) -> None:
        self.bytes = 0
        self.stream: list[bytes] = []
        self._rng = None if seed is None else np.random.default_rng(seed)
        self._real = os.urandom

    def __call__(self, n: int) -> bytes:
        self.bytes += n
        data = self._real(n) if self._rng is None else self._rng.bytes(n)
        self.stream.append(data)
        return data


def _reference_uniforms(key: bytes, n: int) -> np.ndarray:
    """The ``n`` 53-bit grid uniforms in (0, 1] that ``os_uniform`` makes of the OS ``key``:
    AES-256-CTR's keystream (zero nonce), 64-bit little-endian words, top 53 bits plus one."""
    assert len(key) == noise.OS_KEY_BYTES == 32
    stream = Cipher(algorithms.AES(key), modes.CTR(bytes(16))).encryptor().update(bytes(8 * n))
    raw = np.frombuffer(stream, dtype="<u8")
    return ((raw >> np.uint64(11)) + np.uint64(1)).astype(np.float64) * 2.0**-53


def _reference_box_muller(key: bytes, n: int) -> np.ndarray:
    u = _reference_uniforms(key, 2 * ((n + 1) // 2)).reshape(2, -1)
    r = np.sqrt(-2.0 * np.log(u[0]))
    theta = 2.0 * np.pi * u[1]
    return np.concatenate([r * np.cos(theta), r * np.sin(theta)])[:n]


@pytest.mark.parametrize("n", [1, 6, 7])
def test_secure_gaussian_is_the_mean_of_four_box_muller_normals_from_os_bytes(monkeypatch, n):
    """Known answer with a fake, deterministic OS source: the output is exactly
    (sum of 4 independent Box-Muller normals) * std / 2, each normal from its own OS key
    expanded by AES-256-CTR. Catches one sample instead of four, a wrong scale, a reused key
    and any other source of randomness."""
    fake = _CountingUrandom(seed=n)
    monkeypatch.setattr(os, "urandom", fake)
    std = 1.7
    got = gaussian_noise((n,), std, generator=None, secure=True, dtype=torch.float64)
    assert len(fake.stream) == 4
    expected = sum(_reference_box_muller(chunk, n) for chunk in fake.stream) * (0.5 * std)
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-12, atol=0)


def test_secure_gaussian_draws_a_fresh_os_key_for_each_of_its_four_normals(monkeypatch):
    """Each of the four normals takes its own 256-bit key from the OS (one sample instead of
    four would take one), and the keys differ."""
    counter = _CountingUrandom()
    monkeypatch.setattr(os, "urandom", counter)
    gaussian_noise((1000,), 1.0, generator=None, secure=True)
    assert counter.bytes == 4 * 32
    assert len(set(counter.stream)) == 4


def test_os_uniform_is_the_keystream_of_a_fresh_os_key_on_the_53_bit_grid(monkeypatch):
    """Known answer: the uniforms are AES-256-CTR's keystream under the 32 OS bytes, on the
    grid k 2**-53 (k = 1..2**53); two calls take two keys. An all-ones and an all-zeros word
    map to the ends of (0, 1]."""
    fake = _CountingUrandom(seed=3)
    monkeypatch.setattr(os, "urandom", fake)
    a, b = noise.os_uniform(1000), noise.os_uniform(1000)
    assert [len(k) for k in fake.stream] == [32, 32]
    np.testing.assert_array_equal(a.numpy(), _reference_uniforms(fake.stream[0], 1000))
    np.testing.assert_array_equal(b.numpy(), _reference_uniforms(fake.stream[1], 1000))
    assert not torch.equal(a, b)
    k = a.numpy() * 2.0**53
    assert np.array_equal(k, np.round(k)) and k.min() >= 1 and k.max() <= 2**53

    class Ends:  # a keystream of one all-ones word, then zeros
        def update_into(self, data: bytes, buf: bytearray) -> int:
            buf[: len(data)] = b"\xff" * 8 + bytes(len(data) - 8)
            return len(data)

    monkeypatch.setattr(noise, "os_cipher", Ends)
    assert noise.os_uniform(2).tolist() == [1.0, 2.0**-53]


def test_os_uniform_continues_one_keystream_across_its_pieces(monkeypatch):
    """Known answer past :data:`UNIFORM_PIECE`: the pieces are consecutive words of one key's
    keystream (a piece that restarted the stream or took a new key would repeat or differ),
    written into ``out`` when one is given."""
    fake = _CountingUrandom(seed=5)
    monkeypatch.setattr(os, "urandom", fake)
    n = 2 * noise.UNIFORM_PIECE + 3
    out = torch.empty(n, dtype=torch.float64)
    assert noise.os_uniform(n, out=out) is out
    assert len(fake.stream) == 1
    np.testing.assert_array_equal(out.numpy(), _reference_uniforms(fake.stream[0], n))
    with pytest.raises(ConfigError, match="contiguous float64"):
        noise.os_uniform(n, out=torch.empty(n, dtype=torch.float32))


@pytest.mark.parametrize(
    "draw",
    [
        lambda: gaussian_noise((64,), 1.0, generator=None, secure=True),
        lambda: discrete_gaussian((64,), 3.0, generator=None, secure=True),
        lambda: noise.below(torch.full((64,), 0.5, dtype=torch.float64), None, True),
    ],
    ids=["gaussian", "discrete", "bernoulli"],
)
def test_secure_mode_never_uses_torch_global_rng(draw, monkeypatch):
    """Secure noise must not be reproducible from torch's global seed (which a user, a
    library or a checkpoint may set): the same global seed gives different draws, the global
    RNG state is untouched, and the draws consume OS bytes."""
    counter = _CountingUrandom()
    monkeypatch.setattr(os, "urandom", counter)
    torch.manual_seed(1234)
    state = torch.get_rng_state()
    a = draw()
    assert torch.equal(torch.get_rng_state(), state)
    torch.manual_seed(1234)
    b = draw()
    assert not torch.equal(a, b)
    assert counter.bytes >= noise.OS_KEY_BYTES


def test_secure_discrete_gaussian_is_a_function_of_os_bytes_only(monkeypatch):
    """Same fake OS bytes, same samples; other bytes, other samples (no other source)."""
    draws = []
    for seed in (5, 5, 6):
        monkeypatch.setattr(os, "urandom", _CountingUrandom(seed=seed))
        torch.manual_seed(seed * 7)  # varying the global seed must not matter
        draws.append(discrete_gaussian((256,), 4.0, generator=None, secure=True))
    assert torch.equal(draws[0], draws[1])
    assert not torch.equal(draws[0], draws[2])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
@pytest.mark.parametrize("secure", [False, True])
@pytest.mark.parametrize("std", [0.0, 1.5])
def test_noise_has_the_requested_dtype_and_shape(dtype, secure, std):
    g = None if secure else torch.Generator().manual_seed(0)
    x = gaussian_noise((3, 5), std, generator=g, secure=secure, dtype=dtype)
    assert x.dtype == dtype and x.shape == (3, 5)
    assert bool((x == 0).all()) == (std == 0.0)


def test_too_large_std_message_says_what_to_do():
    with pytest.raises(ConfigError) as err:
        gaussian_noise((2,), 1e300, generator=torch.Generator().manual_seed(0))
    msg = str(err.value)
    assert "for torch.float32" in msg and "got 1e+300" in msg
    assert msg.endswith("lower the noise multiplier or the clip, or use dtype=torch.float64")


def test_secure_discrete_gaussian_fills_every_chunk_on_several_threads(monkeypatch) -> None:
    """OS-random draws of several chunks run on a thread pool: every chunk is filled with
    its own N_Z(0, sigma^2) samples (per-chunk variance within 14 standard errors of
    sigma^2: a false failure is far below 1e-9) and the chunks are not copies of each other;
    a generator's draws (replay) stay on the calling thread, in order."""
    from concurrent.futures import ThreadPoolExecutor

    from protocols.dp import noise

    pools: list[int] = []

    class CountingPool(ThreadPoolExecutor):
        def __init__(self, max_workers: int) -> None:
            pools.append(max_workers)
            super().__init__(max_workers=max_workers)

    monkeypatch.setattr(noise, "CHUNK", 1 << 16)
    monkeypatch.setattr(noise, "SECURE_CHUNK", 1 << 16)
    monkeypatch.setattr(noise, "SECURE_WORKERS", 2)
    monkeypatch.setattr(noise, "ThreadPoolExecutor", CountingPool)
    sigma, chunk = 5.0, 1 << 16
    x = noise.discrete_gaussian((3 * chunk + 11,), sigma, generator=None, secure=True)
    assert pools == [2]
    for lo in range(0, x.numel() - 11, chunk):
        part = x[lo : lo + chunk].double()
        se = sigma**2 * math.sqrt(2 / part.numel())
        assert abs(float(part.var()) - sigma**2) < 14 * se
    assert not torch.equal(x[:chunk], x[chunk : 2 * chunk])
    assert x[-11:].abs().max() < 20 * sigma  # the short last chunk is filled too
    a = noise.discrete_gaussian((2 * chunk,), sigma, generator=torch_generator(1, "t"))
    b = noise.discrete_gaussian((2 * chunk,), sigma, generator=torch_generator(1, "t"))
    assert pools == [2] and torch.equal(a, b)
