"""A single masked input looks uniform and is unrelated to the input."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from protocols.secagg import SecAggClient, SecAggConfig, SecAggServer, wire
from protocols.secagg.primitives import session_id

ALPHA = 1e-6  # false-failure rate of each statistical check
N, D, BITS = 4, 1 << 15, 16


def _masked_input_of_client0(x: np.ndarray) -> np.ndarray:
    kw = {
        "config": SecAggConfig(n_clients=N, neighbours=N - 1, threshold=2, modulus_bits=BITS),
        "round_index": 7,
        "public_seed": b"stat-test-seed-0",
        "dim": D,
    }
    clients = [SecAggClient(i, **kw) for i in range(N)]
    server = SecAggServer(**kw)
    for i, c in enumerate(clients):
        server.receive_advertise(i, c.advertise())
    for i, m in server.finish_advertise().items():
        server.receive_shares(i, clients[i].share_keys(m))
    fwd = server.finish_shares()
    msg = clients[0].masked_input(fwd[0], x)
    env = wire.Envelope(session=session_id(b"stat-test-seed-0", 7), round_index=7)
    return wire.decode_masked_input(env, msg, sender=0, bits=BITS, dim=D).astype(np.uint64)


def _chi2_bytes_pvalue(values: np.ndarray) -> float:
    counts = np.bincount(values.astype("<u2").view(np.uint8), minlength=256)
    return stats.chisquare(counts).pvalue


def _inputs() -> list[np.ndarray]:
    return [
        np.zeros(D, np.uint64),
        np.full(D, (1 << BITS) - 1, np.uint64),
        np.arange(D, dtype=np.uint64) % (1 << BITS),
    ]


@pytest.mark.statistical
@pytest.mark.parametrize("which", range(3))
def test_masked_input_bytes_are_uniform(which):
    y = _masked_input_of_client0(_inputs()[which])
    assert _chi2_bytes_pvalue(y) > ALPHA
    # Bit balance per bit position: binomial two-sided test at the same rate.
    for bit in range(BITS):
        ones = int(((y >> np.uint64(bit)) & np.uint64(1)).sum())
        assert stats.binomtest(ones, D, 0.5).pvalue > ALPHA / BITS


@pytest.mark.statistical
def test_masked_input_is_unrelated_to_the_input():
    x = np.arange(D, dtype=np.uint64) % (1 << BITS)
    y = _masked_input_of_client0(x)
    r, p = stats.pearsonr(x.astype(float), y.astype(float))
    assert p > ALPHA
    # Power check: the same tests flag a weak "mask" (low 8 bits only) and the raw input.
    weak = x ^ (np.random.default_rng(0).integers(0, 256, D).astype(np.uint64))
    assert stats.pearsonr(x.astype(float), weak.astype(float))[1] < ALPHA
    assert _chi2_bytes_pvalue(x) < ALPHA
