"""Keyed uniforms: a row's draw depends on the seed, the path and its own keys only."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from protocols.seeding import keyed_uniforms


def test_keyed_uniforms_are_per_row_uniform_and_independent_of_other_rows() -> None:
    users = np.repeat(np.arange(2_000), 25)
    items = np.tile(np.arange(25), 2_000)
    u = keyed_uniforms(7, "split", "order", keys=(users, items))
    assert u.dtype == np.float64 and ((u >= 0) & (u < 1)).all()
    # Uniform: Kolmogorov-Smirnov at a false-failure rate of 1e-6.
    assert stats.kstest(u, "uniform").pvalue > 1e-6
    # Removing rows, or reordering them, changes no other row's value.
    keep = np.arange(len(users)) % 3 != 0
    assert np.array_equal(
        keyed_uniforms(7, "split", "order", keys=(users[keep], items[keep])), u[keep]
    )
    order = np.random.default_rng(0).permutation(len(users))
    assert np.array_equal(
        keyed_uniforms(7, "split", "order", keys=(users[order], items[order])), u[order]
    )
    # The seed, the path and each key column matter.
    assert (keyed_uniforms(8, "split", "order", keys=(users, items)) != u).mean() > 0.99
    assert (keyed_uniforms(7, "split", "other", keys=(users, items)) != u).mean() > 0.99
    assert (keyed_uniforms(7, "split", "order", keys=(items, users)) != u).mean() > 0.99
    with pytest.raises(ValueError):
        keyed_uniforms(7, keys=(users, items[:-1]))
