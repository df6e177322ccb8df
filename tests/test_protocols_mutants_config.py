"""Tests written for surviving mutants of the third mutation run over ``protocols/``
(docs/mutation.md, "Third run"): each pins a behaviour that a mutant changed without failing
any earlier test.

DP configuration (:mod:`protocols.dp.config`): the defaults, every validation message, the
resolution of the noise multiplier and the privacy summary. Secure-aggregation configuration
(:mod:`protocols.secagg.config`), the ledger, the mechanisms, the wire format and the seeding
follow below.
"""

from __future__ import annotations

import hashlib
import math
import re

import numpy as np
import pytest
import torch
from scipy.stats import hypergeom

from protocols.dp.accounting import calibrate_noise_multiplier
from protocols.dp.config import DPConfig, interaction_sample_rate, privacy_summary
from protocols.dp.ledger import PrivacyEvent, PrivacyLedger
from protocols.dp.mechanisms import CentralGaussian
from protocols.errors import ConfigError, IntegrityError
from protocols.secagg import wire
from protocols.secagg.config import (
    SecAggConfig,
    _hyp_tail_ge,
    choose_graph_parameters,
    neighbour_table,
)
from protocols.seeding import derive_seed, numpy_generator, torch_generator


def _exact(message: str) -> str:
    """A ``pytest.raises(match=...)`` pattern for exactly ``message``."""
    return "^" + re.escape(message) + "$"


# --- protocols/dp/config.py -------------------------------------------------------------


def test_dp_config_defaults_and_to_dict() -> None:
    cfg = DPConfig(epsilon=3.0, clip=0.7)
    assert cfg.to_dict() == {
        "epsilon": 3.0,
        "delta": 1e-5,
        "noise_multiplier": None,
        "clip": 0.7,
        "accountant": "prv",
        "placement": "central",
        "privacy_unit": "user",
        "secure": False,
    }
    full = DPConfig(
        epsilon=None,
        delta=1e-6,
        noise_multiplier=1.5,
        clip=2.0,
        accountant="rdp",
        placement="distributed",
        privacy_unit="interaction",
        secure=True,
    )
    assert full.to_dict() == {
        "epsilon": None,
        "delta": 1e-6,
        "noise_multiplier": 1.5,
        "clip": 2.0,
        "accountant": "rdp",
        "placement": "distributed",
        "privacy_unit": "interaction",
        "secure": True,
    }


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"clip": 1.0},
            "give epsilon (to calibrate the noise) or noise_multiplier (to fix it), got neither",
        ),
        ({"epsilon": -1.0, "clip": 1.0}, "epsilon must be a finite number > 0, got -1.0"),
        (
            {"epsilon": 1.0, "noise_multiplier": -2.0, "clip": 1.0},
            "noise multiplier must be a finite number > 0, got -2.0",
        ),
        ({"epsilon": 1.0, "delta": 0.0, "clip": 1.0}, "delta must be in (0, 1), got 0.0"),
        ({"epsilon": 1.0, "clip": 0.0}, "clip must be a finite number > 0, got 0.0"),
        (
            {"epsilon": 1.0, "clip": 1.0, "accountant": "gdp"},
            "accountant must be one of ('prv', 'rdp'), got 'gdp'",
        ),
        (
            {"epsilon": 1.0, "clip": 1.0, "placement": "local"},
            "placement must be one of ('central', 'distributed'), got 'local'",
        ),
        (
            {"epsilon": 1.0, "clip": 1.0, "privacy_unit": "item"},
            "privacy_unit must be one of ('user', 'interaction'), got 'item'",
        ),
        (
            {"epsilon": 1.0, "clip": 1.0, "secure": 1},
            "secure must be True or False, got 1",
        ),
        (
            {"epsilon": 1.0, "clip": 1.0, "secure": "yes"},
            "secure must be True or False, got 'yes'",
        ),
        (
            {"epsilon": 1.0, "clip": 1.0, "placement": "distributed"},
            "placement='distributed' adds discrete Gaussian noise whose guarantee is an RDP "
            "bound (Kairouz et al. 2021), which the PRV accountant cannot take; set "
            "accountant='rdp'",
        ),
    ],
)
def test_dp_config_messages_are_exact(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=_exact(message)):
        DPConfig(**kwargs)


def test_dp_config_accepts_each_valid_choice() -> None:
    """Every listed accountant, placement and unit passes (only distributed needs rdp)."""
    for accountant in ("prv", "rdp"):
        for unit in ("user", "interaction"):
            DPConfig(epsilon=1.0, clip=1.0, accountant=accountant, privacy_unit=unit)
    DPConfig(epsilon=1.0, clip=1.0, accountant="rdp", placement="distributed")
    DPConfig(noise_multiplier=1.0, clip=1.0, accountant="rdp", placement="distributed")
    DPConfig(noise_multiplier=1.0, clip=1.0)  # epsilon None is fine with a fixed sigma


def test_resolve_noise_multiplier_fixed_distributed_and_calibrated() -> None:
    fixed = DPConfig(epsilon=1.0, noise_multiplier=2, clip=1.0)
    sigma = fixed.resolve_noise_multiplier(sample_rate=0.1, steps=10, n_users=None)
    assert sigma == 2.0 and type(sigma) is float
    with pytest.raises(
        ConfigError, match="^delta must be below 1/n_users = 1e-05 for 100000 users"
    ):
        fixed.resolve_noise_multiplier(sample_rate=0.1, steps=10, n_users=100_000)
    dist = DPConfig(epsilon=1.0, clip=1.0, accountant="rdp", placement="distributed")
    with pytest.raises(
        ConfigError,
        match=_exact(
            "placement='distributed' is calibrated with calibrate_distributed_noise_multiplier "
            "(it needs the fixed-point scale and dim)"
        ),
    ):
        dist.resolve_noise_multiplier(sample_rate=0.1, steps=10, n_users=None)
    # The calibrated sigma is the accounting module's, with every argument passed through
    # (fixed cohorts, so the calibrations stay fast; PRV would give 3.03 here, RDP 3.28).
    cfg = DPConfig(epsilon=2.0, delta=1e-4, clip=1.0, accountant="rdp")
    got = cfg.resolve_noise_multiplier(sample_rate=1.0, steps=3, n_users=500)
    want = calibrate_noise_multiplier(
        epsilon=2.0, delta=1e-4, sample_rate=1.0, steps=3, accountant="rdp", n_users=500
    )
    assert got == want == pytest.approx(3.28125)
    assert cfg.resolve_noise_multiplier(sample_rate=1.0, steps=4, n_users=500) > got


def test_privacy_summary_before_any_round_and_with_mixed_events() -> None:
    cfg = DPConfig(epsilon=4.0, noise_multiplier=1.1, clip=0.5, accountant="rdp")
    empty = privacy_summary(cfg, PrivacyLedger([]))
    assert empty == {
        "epsilon": 0.0,
        "delta": 1e-5,
        "noise_multiplier": 1.1,
        "clip": 0.5,
        "accountant": "rdp",
        "privacy_unit": "user",
        "placement": "central",
        "rounds": 0,
        "target_epsilon": 4.0,
        "sample_rate": None,
    }
    events = [
        CentralGaussian(clip=0.5, noise_multiplier=s).event(r, sample_rate=q)
        for r, (s, q) in enumerate([(1.3, 0.2), (0.9, 0.1), (1.3, 0.2)])
    ]
    ledger = PrivacyLedger(events)
    mixed = privacy_summary(cfg, ledger)
    assert mixed["noise_multiplier"] == [0.9, 1.3]
    assert mixed["sample_rate"] == [0.1, 0.2]
    assert mixed["rounds"] == 3
    assert mixed["epsilon"] == ledger.epsilon(1e-5, "rdp")
    # A round released again after a resume is one round (the ledger file's "rounds" counted
    # events: 15 for a 12-round run resumed once, found in a walkthrough).
    again = privacy_summary(cfg, PrivacyLedger([*events, events[-1]]))
    assert again["rounds"] == 3 and again["epsilon"] > mixed["epsilon"]
    one = privacy_summary(cfg, PrivacyLedger(events[:1]))
    assert one["noise_multiplier"] == 1.3 and one["sample_rate"] == 0.2
    assert one["epsilon"] == PrivacyLedger(events[:1]).epsilon(1e-5, "rdp")


class _UnboundedLedger(PrivacyLedger):
    """A ledger whose accountant answers infinity (no noise multiplier accepted by
    ``check_noise_multiplier``, 2**-500 and up, gets there in one event)."""

    def epsilon(self, delta: float, accountant: str = "prv") -> float:
        return math.inf


def test_privacy_summary_reports_an_infinite_epsilon_as_none() -> None:
    cfg = DPConfig(noise_multiplier=2.0**-500, clip=1.0, accountant="rdp")
    ledger = _UnboundedLedger(
        [CentralGaussian(clip=1.0, noise_multiplier=2.0**-500).event(0, sample_rate=1.0)]
    )
    assert privacy_summary(cfg, ledger)["epsilon"] is None
    assert math.isfinite(PrivacyLedger(ledger.events).epsilon(1e-5, "rdp"))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"batch_size": 0, "n_interactions": 5}, "batch_size must be an integer >= 1, got 0"),
        ({"batch_size": True, "n_interactions": 5}, "batch_size must be an integer >= 1, got True"),
        ({"batch_size": 2.0, "n_interactions": 5}, "batch_size must be an integer >= 1, got 2.0"),
        (
            {"batch_size": 2, "n_interactions": 0},
            "n_interactions must be an integer >= 1, got 0",
        ),
        (
            {"batch_size": 6, "n_interactions": 5},
            "batch_size 6 exceeds the number of interactions 5",
        ),
    ],
)
def test_interaction_sample_rate_messages(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=_exact(message)):
        interaction_sample_rate(**kwargs)


def test_interaction_sample_rate_values_and_boundaries() -> None:
    assert interaction_sample_rate(batch_size=3, n_interactions=8) == 3 / 8
    assert interaction_sample_rate(batch_size=5, n_interactions=5) == 1.0
    assert interaction_sample_rate(batch_size=1, n_interactions=1) == 1.0


# --- protocols/secagg/config.py ---------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"n_clients": 1}, "n_clients must be an int in [2, 2**31), got 1"),
        ({"n_clients": 2**31}, "n_clients must be an int in [2, 2**31), got 2147483648"),
        ({"n_clients": 10.0}, "n_clients must be an int in [2, 2**31), got 10.0"),
        (
            {"n_clients": 10, "dropout_tolerance": -0.1},
            "dropout_tolerance must be in [0, 1), got -0.1",
        ),
        (
            {"n_clients": 10, "dropout_tolerance": 1.0},
            "dropout_tolerance must be in [0, 1), got 1.0",
        ),
        ({"n_clients": 10, "corrupt_fraction": 1.0}, "corrupt_fraction must be in [0, 1), got 1.0"),
        (
            {"n_clients": 10, "mode": "honest"},
            "mode must be 'semi-honest' or 'malicious', got 'honest'",
        ),
        ({"n_clients": 10, "modulus_bits": 0}, "modulus_bits must be in [1, 64], got 0"),
        ({"n_clients": 10, "modulus_bits": 65}, "modulus_bits must be in [1, 64], got 65"),
        (
            {"n_clients": 10, "security_bits": 0},
            "security_bits and correctness_bits must be >= 1, got 0 and 20",
        ),
        (
            {"n_clients": 10, "correctness_bits": 0},
            "security_bits and correctness_bits must be >= 1, got 40 and 0",
        ),
        ({"n_clients": 10, "neighbours": 1}, "neighbours must be an int >= 2, got 1"),
        ({"n_clients": 10, "neighbours": True}, "neighbours must be an int >= 2, got True"),
        ({"n_clients": 10, "neighbours": 4.0}, "neighbours must be an int >= 2, got 4.0"),
        (
            {"n_clients": 10, "neighbours": 4, "threshold": True, "dropout_tolerance": 0.0},
            "threshold must be an int in [1, k=4], got True",
        ),
        (
            {"n_clients": 10, "neighbours": 4, "threshold": 5, "dropout_tolerance": 0.0},
            "threshold must be an int in [1, k=4], got 5",
        ),
        (
            {"n_clients": 10, "neighbours": 4, "threshold": 2, "dropout_tolerance": 0.0},
            "threshold t=2 is not above a majority of k=4 neighbours (2t > k); a server lying "
            "about dropouts could unmask an input; use threshold >= 3 or leave it None",
        ),
        (
            # the smallest even degree that keeps a correct majority is k + 4: the search
            # steps by two from k + 2 (an odd degree is never offered)
            {"n_clients": 9, "neighbours": 2, "dropout_tolerance": 0.15},
            "neighbours=2 cannot keep a majority threshold t >= 2 (2t > k) with "
            "dropout_tolerance=0.15 (2 of 9 clients dropping): rounds would abort with "
            "probability above 2**-20; use neighbours >= 6 (or leave neighbours None to "
            "choose it) or lower dropout_tolerance",
        ),
        (
            # k_min = n - 2, the last even degree below the complete graph
            {"n_clients": 6, "neighbours": 2, "dropout_tolerance": 0.05},
            "neighbours=2 cannot keep a majority threshold t >= 2 (2t > k) with "
            "dropout_tolerance=0.05 (1 of 6 clients dropping): rounds would abort with "
            "probability above 2**-20; use neighbours >= 4 (or leave neighbours None to "
            "choose it) or lower dropout_tolerance",
        ),
        (
            # only the complete graph (k = n - 1 = 5) keeps a correct majority
            {"n_clients": 6, "neighbours": 2, "dropout_tolerance": 0.2},
            "neighbours=2 cannot keep a majority threshold t >= 2 (2t > k) with "
            "dropout_tolerance=0.2 (2 of 6 clients dropping): rounds would abort with "
            "probability above 2**-20; use neighbours >= 5 (or leave neighbours None to "
            "choose it) or lower dropout_tolerance",
        ),
        (
            {"n_clients": 50, "neighbours": 10, "dropout_tolerance": 0.5},
            "neighbours=10 cannot keep a majority threshold t >= 6 (2t > k) with "
            "dropout_tolerance=0.5 (25 of 50 clients dropping): rounds would abort with "
            "probability above 2**-20; lower dropout_tolerance (even the complete graph "
            "cannot keep a majority)",
        ),
        (
            {"n_clients": 3},
            "no (neighbours, threshold) meets 2**-40 security and 2**-20 correctness for "
            "n_clients=3, dropout_tolerance=0.05 (1 of 3 clients dropping), "
            "corrupt_fraction=0.05 with a majority threshold (2t > k); lower the fractions or "
            "the security/correctness bits, or add clients",
        ),
    ],
)
def test_secagg_config_messages_are_exact(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=_exact(message)):
        SecAggConfig(**kwargs)


def test_secagg_config_boundaries_are_accepted() -> None:
    pair = SecAggConfig(n_clients=2, neighbours=2, dropout_tolerance=0.0)
    assert (pair.k, pair.t, pair.complete_graph) == (1, 1, True)  # the smallest cohort
    big = SecAggConfig(n_clients=2**31 - 1, neighbours=2, threshold=2)
    assert (big.k, big.t, big.complete_graph) == (2, 2, False)
    for bits in (1, 64):
        assert SecAggConfig(n_clients=10, dropout_tolerance=0.0, modulus_bits=bits).modulus_bits
    tiny = SecAggConfig(
        n_clients=40,
        dropout_tolerance=0.0,
        corrupt_fraction=0.0,
        security_bits=1,
        correctness_bits=1,
    )
    assert (tiny.k, tiny.t) == (2, 2)
    # the smallest explicit threshold that is a majority, and t = k
    assert SecAggConfig(n_clients=10, neighbours=4, threshold=3, dropout_tolerance=0.0).t == 3
    assert SecAggConfig(n_clients=10, neighbours=4, threshold=4, dropout_tolerance=0.0).t == 4
    # the smallest degree, and dropout_tolerance 0 (no dropping client)
    two = SecAggConfig(n_clients=10, neighbours=2, threshold=2, dropout_tolerance=0.0)
    assert (two.k, two.t) == (2, 2)


def test_secagg_config_degree_is_made_even_and_capped_at_the_complete_graph() -> None:
    def kt(neighbours: int) -> tuple[int, int, bool]:
        cfg = SecAggConfig(n_clients=10, neighbours=neighbours, dropout_tolerance=0.0)
        return cfg.k, cfg.t, cfg.complete_graph

    assert kt(3) == (4, 3, False)  # odd below n - 1: one more, for the Harary graph
    assert kt(8) == (8, 5, False)  # n - 2: not complete
    assert kt(9) == (9, 5, True)  # n - 1 (odd) is the complete graph, kept as is
    assert kt(30) == (9, 5, True)  # capped at n - 1
    # n - 2 odd (n = 11): one more is the complete graph, never an odd Harary degree
    odd = SecAggConfig(n_clients=11, neighbours=9, dropout_tolerance=0.0)
    assert (odd.k, odd.complete_graph) == (10, True)


def test_explicit_degree_threshold_is_the_secure_majority_when_it_is_correct() -> None:
    """t = max(t_secure, majority(k)) if correct, else the majority (guarantee() reports it)."""
    # 13 clients, 3 corrupt: t_secure = 4 > majority(4) = 3, and t = 4 is correct
    cfg = SecAggConfig(n_clients=13, neighbours=4, dropout_tolerance=0.0, corrupt_fraction=0.2)
    assert (cfg.k, cfg.t) == (4, 4)
    # one dropping client: t = 4 would not be correct, so the majority 3
    cfg = SecAggConfig(n_clients=13, neighbours=4, dropout_tolerance=0.05, corrupt_fraction=0.2)
    assert (cfg.k, cfg.t) == (4, 3)
    assert cfg.guarantee().share_secrecy_log2 > -cfg.security_bits
    # 16 clients, 4 corrupt: no t <= k is secure, so the majority
    cfg = SecAggConfig(n_clients=16, neighbours=4, dropout_tolerance=0.0, corrupt_fraction=0.2)
    assert (cfg.k, cfg.t) == (4, 3)


def _tail(pop: int, marked: int, draws: int, at_least: int) -> float:
    """P[Hypergeometric(pop, marked, draws) >= at_least], from scipy."""
    return float(hypergeom.sf(at_least - 1, pop, min(marked, pop), draws))


def _log2_or_inf(p: float) -> float:
    return -math.inf if p == 0 else math.log2(p)


@pytest.mark.parametrize(
    ("n", "k", "t", "delta", "gamma"),
    [
        (200, 10, 6, 0.05, 0.05),  # all three bounds strictly between 0 and 1
        (60, 8, 5, 0.1, 0.1),
        (20, 6, 4, 0.3, 0.3),  # clamped at 1
        (40, 6, 4, 0.05, 0.0),  # 2 removed < k: no partial sum possible
        (12, 10, 6, 0.1, 0.1),  # k = n - 2: the connectivity bound still applies
        (12, 11, 6, 0.1, 0.1),  # the complete graph is always connected
        (12, 11, 6, 0.5, 0.5),  # ... even when every client is removed
        (12, 10, 6, 0.5, 0.4),  # k = n - 2 with 11 removed: clamped at 1
        (20, 6, 4, 0.3, 0.6),  # share secrecy clamped at 1
    ],
)
def test_guarantee_matches_hypergeometric_tails(
    n: int, k: int, t: int, delta: float, gamma: float
) -> None:
    """The three union bounds of the module docstring, recomputed with scipy and comb."""
    cfg = SecAggConfig(
        n_clients=n, neighbours=k, threshold=t, dropout_tolerance=delta, corrupt_fraction=gamma
    )
    dropped, corrupt = math.ceil(delta * n), math.ceil(gamma * n)
    correct = min(1.0, n * _tail(n - 1, dropped, k, k - t + 1))
    secret = min(1.0, n * _tail(n - 1, corrupt, k, t))
    removed = min(n, dropped + corrupt)
    connect = 0.0 if k >= n - 1 else min(1.0, n * n * math.comb(removed, k) / math.comb(n, k))
    g = cfg.guarantee()
    assert g.correctness_log2 == pytest.approx(_log2_or_inf(correct), rel=1e-9, abs=1e-12)
    assert g.share_secrecy_log2 == pytest.approx(_log2_or_inf(secret), rel=1e-9, abs=1e-12)
    assert g.connectivity_log2 == pytest.approx(_log2_or_inf(connect), rel=1e-9, abs=1e-12)


def test_hypergeometric_tail_matches_scipy_including_the_edges() -> None:
    for pop, marked, draws, at_least in [
        (19, 6, 6, 3),
        (59, 6, 8, 4),
        (10, 3, 4, 0),  # at_least <= 0: certain
        (10, 3, 4, -2),
        (10, 3, 4, 4),  # more than the marked: impossible
        (10, 12, 4, 4),  # more marked than the population: all of it
        (10, 10, 4, 4),
    ]:
        want = float(hypergeom.sf(at_least - 1, pop, min(marked, pop), draws))
        got = _hyp_tail_ge(pop, marked, draws, at_least)
        assert got == pytest.approx(want, rel=1e-12, abs=1e-15), (pop, marked, draws, at_least)
    assert _hyp_tail_ge(10, 3, 4, 0) == 1.0 and _hyp_tail_ge(10, 3, 4, 4) == 0.0


def test_guarantee_values_of_one_config_by_hand() -> None:
    g = SecAggConfig(
        n_clients=60, neighbours=8, threshold=5, dropout_tolerance=0.1, corrupt_fraction=0.1
    ).guarantee()
    # 6 dropping, 6 corrupt, 59 possible neighbours; k - t + 1 = 4 dropped neighbours break it
    p_correct = sum(math.comb(6, i) * math.comb(53, 8 - i) for i in range(4, 7)) / math.comb(59, 8)
    p_secret = sum(math.comb(6, i) * math.comb(53, 8 - i) for i in range(5, 7)) / math.comb(59, 8)
    assert g.correctness_log2 == pytest.approx(math.log2(60 * p_correct), rel=1e-12)
    assert g.share_secrecy_log2 == pytest.approx(math.log2(60 * p_secret), rel=1e-12)
    assert g.connectivity_log2 == pytest.approx(
        math.log2(3600 * math.comb(12, 8) / math.comb(60, 8)), rel=1e-12
    )
    assert g.connectivity_log2 < g.share_secrecy_log2 < g.correctness_log2 < 0


def test_chooser_matches_a_brute_force_search_over_degrees_and_thresholds() -> None:
    """Smallest even k (else n - 1) with a secure, correct, connected majority threshold."""
    for n, delta, gamma, sigma, eta in [
        (1000, 0.05, 0.05, 40, 20),
        (1000, 0.1, 0.01, 30, 10),
        (120, 0.1, 0.05, 20, 10),
        (30, 0.05, 0.0, 40, 20),
        (300, 0.05, 0.05, 20, 20),  # (20, 11); at the default 40 bits (22, 13)
        (300, 0.05, 0.05, 60, 20),  # (26, 16)
        # small cohorts where the population of the tails (n - 1 others) decides t or k
        (11, 0.0, 0.2, 2, 2),  # (4, 4)
        (11, 0.0, 0.2, 1, 1),  # (4, 3)
        (16, 0.2, 0.0, 1, 1),  # (10, 6)
    ]:
        want = None
        for k in [*range(2, n - 1, 2), n - 1]:
            for t in range(k // 2 + 1, k + 1):
                g = SecAggConfig(
                    n_clients=n,
                    neighbours=k,
                    threshold=t,
                    dropout_tolerance=delta,
                    corrupt_fraction=gamma,
                ).guarantee()
                if g.share_secrecy_log2 <= -sigma:
                    if g.correctness_log2 <= -eta and g.connectivity_log2 <= -sigma:
                        want = (k, t)
                    break  # the smallest secure t decides: a larger one is less correct
            if want is not None:
                break
        got = choose_graph_parameters(
            n,
            dropout_tolerance=delta,
            corrupt_fraction=gamma,
            security_bits=sigma,
            correctness_bits=eta,
        )
        assert got == want, (n, delta, gamma, sigma, eta)
        cfg = SecAggConfig(
            n_clients=n,
            dropout_tolerance=delta,
            corrupt_fraction=gamma,
            security_bits=sigma,
            correctness_bits=eta,
        )
        assert (cfg.k, cfg.t) == want


def test_neighbour_table_is_a_symmetric_harary_graph_and_read_only() -> None:
    session = b"\x07" * 32
    table = neighbour_table(session, 11, 4)
    assert table.shape == (11, 4) and table.dtype == np.int64
    assert not table.flags.writeable
    adj = np.zeros((11, 11), dtype=bool)
    for i, row in enumerate(table):
        assert list(row) == sorted(row) and i not in row and len(set(row)) == 4
        adj[i, row] = True
    assert (adj == adj.T).all()
    # a relabelled cycle with the k/2 = 2 nearest on either side: H(11, 4) has exactly 11
    # triangles (i, i+1, i+2), a random 4-regular graph on 11 nodes almost never does
    a = adj.astype(np.int64)
    assert np.trace(a @ a @ a) // 6 == 11
    assert neighbour_table(session, 11, 4) is table  # cached, identical for every party
    other = neighbour_table(b"\x08" * 32, 11, 4)
    assert not np.array_equal(other, table)
    full = neighbour_table(session, 5, 4)
    assert full.tolist() == [[1, 2, 3, 4], [0, 2, 3, 4], [0, 1, 3, 4], [0, 1, 2, 4], [0, 1, 2, 3]]
    assert not full.flags.writeable
    with pytest.raises(ValueError):
        full[0, 0] = 3


# --- protocols/seeding.py ---------------------------------------------------------------


def _sha256_seed(root: int, *path: str | int) -> int:
    """The documented derivation, written out: SHA-256 over a label, the root and the path."""
    data = b"securefed-seed-v1" + root.to_bytes(16, "little")
    for part in path:
        token = repr(part).encode()
        data += len(token).to_bytes(4, "little") + token
    return int.from_bytes(hashlib.sha256(data).digest()[:8], "little") % 2**63


def test_derive_seed_is_the_documented_sha256_derivation() -> None:
    for root, path in [
        (0, ()),
        (0, ("negatives",)),
        (7, ("noise", 3)),
        (2**64 + 5, ("negatives", 12, "client", 40)),
        (2**127 + 3, ("noise",)),  # the top bit of the 16 bytes, hashed unsigned
        (2**128 - 1, ()),
        (123, ("a" * 300,)),
    ]:
        seed = derive_seed(root, *path)
        assert seed == _sha256_seed(root, *path)
        assert 0 <= seed < 2**63 and type(seed) is int
    # the path is length-prefixed and typed: no two paths collide by concatenation
    assert derive_seed(1, "ab", "c") != derive_seed(1, "a", "bc")
    assert derive_seed(1, 3) != derive_seed(1, "3")
    assert derive_seed(1, "x") != derive_seed(2, "x")


def test_derive_seed_refuses_a_root_outside_0_to_2_pow_128() -> None:
    with pytest.raises(ValueError, match=_exact("root seed must be non-negative, got -1")):
        derive_seed(-1, "x")
    assert derive_seed(0, "x") == _sha256_seed(0, "x")
    # a root that does not fit the 16 hashed bytes was an OverflowError traceback
    with pytest.raises(ValueError, match=_exact(f"root seed must be below 2**128, got {2**128}")):
        derive_seed(2**128, "x")


def test_generators_are_seeded_by_the_derived_seed() -> None:
    want_np = np.random.default_rng(_sha256_seed(9, "plan", 2)).integers(0, 2**62, size=4)
    assert (numpy_generator(9, "plan", 2).integers(0, 2**62, size=4) == want_np).all()
    g = torch_generator(9, "plan", 2)
    assert g.initial_seed() == _sha256_seed(9, "plan", 2)
    assert g.device == torch.device("cpu")
    ref = torch.Generator().manual_seed(_sha256_seed(9, "plan", 2))
    assert torch.equal(torch.rand(5, generator=g), torch.rand(5, generator=ref))


# --- protocols/dp/ledger.py: PrivacyEvent validation --------------------------------------

_DISCRETE = {
    "round": 0,
    "mechanism": "distributed_discrete_gaussian",
    "noise_multiplier": 1.0,
    "sample_rate": 1.0,
    "clip": 1.0,
    "noise_contributors": 5,
    "min_survivors": 4,
    "placement": "distributed",
    "share_sigma": 3.0,
    "l2_sensitivity": 10.0,
    "l1_sensitivity": 30.0,
    "dim": 9,
}
_CENTRAL = {
    "round": 0,
    "mechanism": "gaussian",
    "noise_multiplier": 1.0,
    "sample_rate": 1.0,
    "clip": 1.0,
    "noise_contributors": 1,
    "min_survivors": 1,
    "placement": "central",
}


@pytest.mark.parametrize(
    ("base", "change", "message"),
    [
        (
            _DISCRETE,
            {"dim": None},
            "a distributed_discrete_gaussian event needs share_sigma, "
            "l2_sensitivity, l1_sensitivity and dim",
        ),
        (
            _DISCRETE,
            {"share_sigma": None},
            "a distributed_discrete_gaussian event needs "
            "share_sigma, l2_sensitivity, l1_sensitivity and dim",
        ),
        (_DISCRETE, {"share_sigma": 0.0}, "share_sigma must be a finite number > 0, got 0.0"),
        (_DISCRETE, {"share_sigma": math.inf}, "share_sigma must be a finite number > 0, got inf"),
        (_DISCRETE, {"share_sigma": True}, "share_sigma must be a finite number > 0, got True"),
        (
            _DISCRETE,
            {"l2_sensitivity": -1.0},
            "l2_sensitivity must be a finite number > 0, got -1.0",
        ),
        (_DISCRETE, {"l2_sensitivity": "1"}, "l2_sensitivity must be a finite number > 0, got '1'"),
        (_DISCRETE, {"l1_sensitivity": 0}, "l1_sensitivity must be a finite number > 0, got 0"),
        (
            _DISCRETE,
            {"l1_sensitivity": math.nan},
            "l1_sensitivity must be a finite number > 0, got nan",
        ),
        (_DISCRETE, {"share_sigma": 0.49}, "share_sigma must be >= 0.5 integer units, got 0.49"),
        (_DISCRETE, {"dim": 0}, "dim must be an integer >= 1, got 0"),
        (_DISCRETE, {"dim": 2.0}, "dim must be an integer >= 1, got 2.0"),
        (
            _DISCRETE,
            {"placement": "central"},
            "mechanism 'distributed_discrete_gaussian' does not match placement 'central'",
        ),
        (
            _CENTRAL,
            {"dim": 3},
            "share_sigma, l2_sensitivity, l1_sensitivity and dim belong to discrete events",
        ),
        (
            _CENTRAL,
            {"l1_sensitivity": 3.0},
            "share_sigma, l2_sensitivity, l1_sensitivity and dim belong to discrete events",
        ),
        (
            _CENTRAL,
            {"min_survivors": 2},
            "central or local noise has exactly one contributor; "
            "got noise_contributors=1, min_survivors=2",
        ),
        (
            _CENTRAL,
            {"noise_contributors": 2},
            "central or local noise has exactly one "
            "contributor; got noise_contributors=2, min_survivors=1",
        ),
        (
            _CENTRAL,
            {"placement": "distributed"},
            "mechanism 'gaussian' does not match placement 'distributed'",
        ),
        (
            _CENTRAL,
            {"placement": "local"},
            "local placement (client-side DP-SGD) goes with "
            "privacy_unit='interaction' and only with it; got placement 'local', unit 'user'",
        ),
        (
            _CENTRAL,
            {"privacy_unit": "interaction"},
            "local placement (client-side DP-SGD) goes "
            "with privacy_unit='interaction' and only with it; got placement 'central', unit "
            "'interaction'",
        ),
        (
            _CENTRAL,
            {"placement": "server"},
            "placement must be 'central', 'distributed' or 'local', got 'server'",
        ),
        (
            _CENTRAL,
            {"privacy_unit": "item"},
            "privacy_unit must be one of ('user', 'interaction'), got 'item'",
        ),
        (_CENTRAL, {"round": True}, "round must be an integer >= 0, got True"),
        (_CENTRAL, {"clip": math.inf}, "clip must be a finite number > 0, got inf"),
        (_CENTRAL, {"noise_contributors": 0}, "noise_contributors must be an integer >= 1, got 0"),
    ],
)
def test_privacy_event_messages_are_exact(base: dict, change: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=_exact(message)):
        PrivacyEvent(**{**base, **change})


def test_privacy_event_accepts_the_boundaries_and_normalises_types() -> None:
    ev = PrivacyEvent(**{**_DISCRETE, "share_sigma": 0.5, "dim": np.int64(1), "round": 0})
    assert ev.share_sigma == 0.5 and ev.dim == 1 and type(ev.dim) is int
    ev = PrivacyEvent(
        **{**_DISCRETE, "share_sigma": np.float32(2.0), "l1_sensitivity": 4, "round": np.int32(3)}
    )
    assert type(ev.share_sigma) is float and type(ev.l1_sensitivity) is float
    assert type(ev.round) is int and ev.round == 3
    local = PrivacyEvent(**{**_CENTRAL, "placement": "local", "privacy_unit": "interaction"})
    assert local.effective_noise_multiplier == 1.0


def test_ledger_order_message_names_the_last_recorded_round() -> None:
    ledger = PrivacyLedger([PrivacyEvent(**{**_CENTRAL, "round": r}) for r in (0, 3, 5)])
    with pytest.raises(
        ConfigError,
        match=_exact(
            "privacy event round 4 is before the last recorded round 5; events must be "
            "recorded in round order"
        ),
    ):
        ledger.record(PrivacyEvent(**{**_CENTRAL, "round": 4}))
    assert len(ledger) == 3
    ledger.record(PrivacyEvent(**{**_CENTRAL, "round": 5}))  # the same round again is fine
    assert [e.round for e in ledger.events] == [0, 3, 5, 5]


def test_torch_generator_is_made_on_the_requested_device() -> None:
    """A CUDA request gives a CUDA generator, or fails where CUDA is absent: never a CPU one."""
    if torch.cuda.is_available():
        assert torch_generator(3, "x", device="cuda").device.type == "cuda"
    else:
        with pytest.raises(RuntimeError):
            torch_generator(3, "x", device="cuda")


# --- protocols/secagg/wire.py -----------------------------------------------------------

_ENV = wire.Envelope(session=bytes(range(32)), round_index=4)


def test_envelope_opens_a_message_with_an_empty_body() -> None:
    msg = _ENV.pack(wire.Kind.ADVERTISE, 3, wire.SERVER, b"")
    assert len(msg) == wire.HEADER_BYTES
    body = _ENV.open(msg, wire.Kind.ADVERTISE, sender=3, receiver=wire.SERVER)
    assert len(body) == 0
    with pytest.raises(IntegrityError):
        _ENV.open(msg[:-1], wire.Kind.ADVERTISE, sender=3, receiver=wire.SERVER)


def test_a_body_too_short_for_its_count_is_an_integrity_error() -> None:
    """Two body bytes where a u32 count belongs: IntegrityError, not struct.error."""
    msg = _ENV.pack(wire.Kind.KEYS, wire.SERVER, 1, b"\x00\x00")
    with pytest.raises(IntegrityError):
        wire.decode_keys(_ENV, msg, receiver=1, n_clients=4)


def test_keys_of_every_client_are_accepted() -> None:
    """A count equal to n_clients is the largest allowed, not one too many."""
    keys = [(i, bytes([i]) * 32, bytes([i + 1]) * 32) for i in range(4)]
    msg = wire.encode_keys(_ENV, 1, keys)
    assert wire.decode_keys(_ENV, msg, receiver=1, n_clients=4) == keys
    req = wire.encode_unmask_request(_ENV, 2, 4, [0, 1, 2, 3], [])
    assert wire.decode_unmask_request(_ENV, req, receiver=2, n_clients=4) == (4, [0, 1, 2, 3], [])


def test_encode_boxes_message_for_a_wrong_ciphertext_length() -> None:
    with pytest.raises(ValueError, match=_exact("ciphertext has the wrong length")):
        wire.encode_shares(_ENV, 0, [(1, bytes(wire.CIPHERTEXT_BYTES - 1))])


def test_share_associated_data_takes_every_u64_round() -> None:
    env = wire.Envelope(session=bytes(32), round_index=2**64 - 1)
    ad = wire.share_associated_data(env, 2**31 - 1, 5)
    assert ad == b"SAGG\x03" + bytes(32) + b"\xff" * 8 + bytes([0x7F, 0xFF, 0xFF, 0xFF, 0, 0, 0, 5])


def test_share_plaintext_of_the_wrong_length_is_refused() -> None:
    good = wire.pack_share_plaintext(2, 3, 7, 9)
    assert len(good) == wire.SHARE_PLAINTEXT_BYTES
    b, sk = wire.unpack_share_plaintext(good, sender=2, receiver=3)
    assert int.from_bytes(b, "big") == 7 and int.from_bytes(sk, "big") == 9
    for bad in (good + b"\x00", good[:-1]):
        with pytest.raises(IntegrityError):
            wire.unpack_share_plaintext(bad, sender=2, receiver=3)
    eager = wire.pack_share_plaintext(2, 3, 7, 9, 11)
    assert len(eager) == wire.EAGER_SHARE_PLAINTEXT_BYTES
    b, sk, b2 = wire.unpack_eager_share_plaintext(eager, sender=2, receiver=3)
    assert [int.from_bytes(v, "big") for v in (b, sk, b2)] == [7, 9, 11]
    for bad in (eager + b"\x00", eager[:-1], good):
        with pytest.raises(IntegrityError):
            wire.unpack_eager_share_plaintext(bad, sender=2, receiver=3)
    with pytest.raises(IntegrityError):
        wire.unpack_share_plaintext(eager, sender=2, receiver=3)


def test_ring_dtype_boundaries_and_message() -> None:
    assert [wire.ring_dtype(b).itemsize for b in (1, 8, 9, 16, 17, 32, 33, 64)] == [
        1,
        1,
        2,
        2,
        4,
        4,
        8,
        8,
    ]
    with pytest.raises(ValueError, match=_exact("bits must be <= 64, got 65")):
        wire.ring_dtype(65)


def test_masked_input_with_other_bits_of_the_same_width_is_refused() -> None:
    y = np.arange(5, dtype=np.uint64)
    msg = wire.encode_masked_input(_ENV, 1, y, 20)
    assert wire.decode_masked_input(_ENV, msg, sender=1, bits=20, dim=5).tolist() == y.tolist()
    for bits in (24, 17):  # both 4-byte rings, like 20
        with pytest.raises(IntegrityError):
            wire.decode_masked_input(_ENV, msg, sender=1, bits=bits, dim=5)
