"""The block-table sampler of secure discrete Gaussian shares (``protocols.dp.table_sampler``):
its tables realise their weights exactly, the distribution they realise is within 1e-15 of
N_Z(0, sigma**2) in total variation, and its draws pass goodness-of-fit tests with a stated
false-failure rate (and fail them against a sigma 3 % off)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from protocols.dp import noise, table_sampler
from protocols.dp.table_sampler import TABLE_SIGMA_MAX, block_table, fill, realized_pmf

#: Probability that a correct sampler fails any one statistical test below.
FALSE_FAILURE = 1e-6

#: Sigmas with one integer per block (0.5-127.9), with rejection inside blocks of 2, 4 and
#: 2,048 integers (128, 300, and FedRAP's MovieLens 100K shares, about 2e5).
SIGMAS = [0.5, 3.0, 30.0, 127.9, 128.0, 300.0, 198_073.0]


def exact_pmf(support: np.ndarray, sigma: float) -> np.ndarray:
    """N_Z(0, sigma**2) on ``support`` (long double), normalised over it: the table's range
    leaves out less than 1e-42 of the mass."""
    x = support.astype(np.longdouble)
    probs = np.exp(-(x * x) / (2 * np.longdouble(sigma) ** 2))
    return probs / probs.sum()


@pytest.mark.parametrize("sigma", SIGMAS + [4.0e6])
def test_alias_table_draws_each_block_with_exactly_its_weight(sigma: float) -> None:
    """From ``keep`` and ``alias`` alone, in integers: entry j is drawn from its own bucket
    with ``keep[j]`` of the bucket's ``2**(64 - b)`` words and from every bucket aliased to
    it with the rest of that bucket; the total is ``weights[j]``, and they sum to 2**64."""
    table = block_table(sigma)
    assert table is not None
    cap = 1 << (64 - table.table_bits)
    keep = [int(v) for v in table.keep]
    drawn = list(keep)
    for i, j in enumerate(table.alias.tolist()):
        drawn[j] += cap - keep[i]
    assert drawn == list(table.weights)
    assert sum(table.weights) == 1 << 64
    assert all(0 <= v <= cap for v in keep)
    assert all(w == 0 for w in table.weights[table.blocks :])  # padding is never drawn


@pytest.mark.parametrize("sigma", SIGMAS)
def test_realized_distribution_is_within_1e15_of_the_discrete_gaussian(sigma: float) -> None:
    """The exact distribution of the sampler's output (block weights, offsets, the acceptance
    test on the 53-bit grid) against N_Z(0, sigma**2), both in long double."""
    table = block_table(sigma)
    assert table is not None
    support, realized = realized_pmf(table)
    assert support[0] <= -table_sampler.TAIL_SIGMAS * sigma
    assert support[-1] + 1 >= table_sampler.TAIL_SIGMAS * sigma
    assert float(np.abs(realized - exact_pmf(support, sigma)).sum()) / 2 < 1e-15


def test_sigma_above_the_table_goes_to_the_rejection_sampler(monkeypatch) -> None:
    assert block_table(TABLE_SIGMA_MAX * 1.01) is None
    calls: list[float] = []
    real = noise._uniform

    def counting(n, generator, secure, out=None):
        calls.append(n)
        return real(n, generator, secure, out)

    monkeypatch.setattr(noise, "_uniform", counting)
    noise.discrete_gaussian((64,), 300.0, generator=None, secure=True)
    assert calls == []  # the table: no float uniforms
    x = noise.discrete_gaussian((4096,), TABLE_SIGMA_MAX * 1.01, generator=None, secure=True)
    assert calls and float(x.double().std()) > TABLE_SIGMA_MAX / 2


def binned_pvalue(samples: np.ndarray, sigma: float, bins: int = 40) -> float:
    """Pearson chi-square of samples against N_Z(0, sigma**2) over ``bins`` equal-width bins of
    [-4 sigma, 4 sigma], each tail pooled into its end bin, expected counts from the exact pmf.

    Pooled because a tail of its own expects almost nothing: beyond 5 sigma, 0.06 of 200,000
    draws, and two draws there alone made the statistic ~66; with separate tails about 0.3 %
    of exact samples fell below ``FALSE_FAILURE`` (2,000 draws of 200,000 from the exact pmf
    per sigma), not one in a million. Every bin here expects at least ~15 draws."""
    table = block_table(sigma)
    assert table is not None
    support, _ = realized_pmf(table)  # every integer of the table's range
    probs = exact_pmf(support, sigma)
    edges = np.linspace(-4 * sigma, 4 * sigma, bins + 1)

    def binned(x: np.ndarray) -> np.ndarray:  # 0 .. bins - 1, the tails in the end bins
        return np.searchsorted(edges, x, side="right").clip(1, bins) - 1

    expected = np.bincount(binned(support), weights=probs.astype(np.float64), minlength=bins)
    observed = np.bincount(binned(samples), minlength=bins)
    expected *= samples.size
    assert expected.min() >= 5, expected.min()  # where Pearson's chi-square holds
    stat = float(((observed - expected) ** 2 / expected).sum())
    return float(stats.chi2.sf(stat, bins - 1))


@pytest.mark.statistical
@pytest.mark.parametrize("sigma", [30.0, 300.0, 198_073.0])
@pytest.mark.parametrize("piece", [None, 997])
def test_table_draws_fit_the_discrete_gaussian(sigma: float, piece, monkeypatch) -> None:
    """Draws through ``discrete_gaussian`` on OS randomness (several chunks on threads);
    ``piece`` 997 makes many passes, a partial last one and redraws across passes."""
    if piece is not None:
        monkeypatch.setattr(table_sampler, "PIECE", piece)
    monkeypatch.setattr(noise, "SECURE_CHUNK", 1 << 16)
    x = noise.discrete_gaussian((200_000,), sigma, generator=None, secure=True)
    assert x.dtype == torch.int64
    pvalue = binned_pvalue(x.numpy(), sigma)
    # the value and the draws' summary, so that a failure can be told from chance
    assert pvalue > FALSE_FAILURE, (pvalue, float(x.double().std()), int(x.min()), int(x.max()))


@pytest.mark.statistical
def test_binned_fit_has_power() -> None:
    """The test above rejects draws whose sigma is 3 % off, either way."""
    for sigma in (300.0, 198_073.0):
        table = block_table(sigma)
        assert table is not None
        x = np.empty(200_000, dtype=np.int64)
        fill(x, table, noise.os_cipher())
        assert binned_pvalue(x, sigma) > FALSE_FAILURE
        assert binned_pvalue(x, sigma * 1.03) < FALSE_FAILURE
        assert binned_pvalue(x, sigma / 1.03) < FALSE_FAILURE


@pytest.mark.statistical
@pytest.mark.parametrize("sigma", [300.0, 198_073.0])
def test_offsets_inside_blocks_fit_the_discrete_gaussian(sigma: float) -> None:
    """The position inside a block (``x mod M``, below the bins' resolution above) follows the
    discrete Gaussian's residues: a chi-square over the ``M`` residues."""
    table = block_table(sigma)
    assert table is not None and table.block_bits > 0
    width = 1 << table.block_bits
    support, _ = realized_pmf(table)
    probs = exact_pmf(support, sigma)
    expected = np.bincount(support % width, weights=probs.astype(np.float64), minlength=width)
    draws = noise.discrete_gaussian((200_000,), sigma, generator=None, secure=True).numpy()
    observed = np.bincount(draws % width, minlength=width)
    expected *= draws.size
    stat = float(((observed - expected) ** 2 / expected).sum())
    assert stats.chi2.sf(stat, width - 1) > FALSE_FAILURE


@pytest.mark.statistical
@pytest.mark.parametrize("sigma", [300.0, 198_073.0])
def test_rejections_happen_at_the_tables_rate(sigma: float, monkeypatch) -> None:
    """Every proposal is accepted with the probability the tables give (``alpha``, computed
    exactly from the block weights and the acceptance test on the 53-bit grid): the number of
    rejected proposals is binomial, within its two-sided 1e-6 interval."""
    table = block_table(sigma)
    assert table is not None
    alpha = table_sampler.acceptance_rate(table)
    counts = {"proposed": 0, "rejected": 0}
    real = table_sampler._propose

    def counting(table, out, cipher):
        accepted = real(table, out, cipher)
        counts["proposed"] += out.size
        counts["rejected"] += int(out.size - accepted.sum())
        return accepted

    monkeypatch.setattr(table_sampler, "_propose", counting)
    x = np.empty(400_000, dtype=np.int64)
    fill(x, table, noise.os_cipher())
    p, r = counts["proposed"], counts["rejected"]
    assert p == x.size + r
    lo, hi = stats.binom.interval(1 - FALSE_FAILURE, p, 1 - alpha)
    assert lo <= r <= hi, (r, p * (1 - alpha))
    assert 0.99 < alpha < 1.0
