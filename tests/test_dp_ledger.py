"""Privacy ledger, budget checks, config validation and the privacy summary."""

from __future__ import annotations

import dataclasses
import json

import pytest

from protocols.dp import (
    CentralGaussian,
    DistributedGaussian,
    DPConfig,
    PrivacyEvent,
    PrivacyLedger,
    compute_epsilon,
    distributed_noise_plan,
    privacy_summary,
)
from protocols.errors import ConfigError, PrivacyBudgetError


def _ledger(rounds: int, sigma: float = 1.0, q: float = 0.1) -> PrivacyLedger:
    mech = CentralGaussian(clip=1.0, noise_multiplier=sigma)
    ledger = PrivacyLedger()
    for r in range(rounds):
        ledger.record(mech.event(r, sample_rate=q))
    return ledger


def test_ledger_epsilon_matches_direct_accounting() -> None:
    ledger = _ledger(50)
    for acc in ("prv", "rdp"):
        assert ledger.epsilon(1e-5, acc) == pytest.approx(
            compute_epsilon(
                noise_multiplier=1.0, sample_rate=0.1, steps=50, delta=1e-5, accountant=acc
            ),
            rel=1e-9,
        )
    assert PrivacyLedger().epsilon(1e-5) == 0.0


def test_ledger_json_round_trip_with_every_mechanism() -> None:
    plan = distributed_noise_plan(
        clip=1.0, noise_multiplier=1.0, scale=256.0, dim=50, min_survivors=5, cohort_size=8
    )
    ledger = _ledger(3)
    ledger.record(
        DistributedGaussian(clip=1.0, noise_multiplier=1.0, min_survivors=5).event(
            3, sample_rate=1.0, noise_contributors=6
        )
    )
    ledger.record(plan.event(4, sample_rate=1.0, noise_contributors=7))
    text = json.dumps(ledger.to_dicts())
    back = PrivacyLedger.from_dicts(json.loads(text))
    assert back.events == ledger.events
    assert back.epsilon(1e-5, "rdp") == ledger.epsilon(1e-5, "rdp")


def test_events_are_immutable_and_ledger_is_append_only() -> None:
    ledger = _ledger(2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        ledger.events[0].noise_multiplier = 100.0  # type: ignore[misc]
    assert isinstance(ledger.events, tuple)
    with pytest.raises(ConfigError, match="round order"):
        ledger.record(CentralGaussian(clip=1.0, noise_multiplier=1.0).event(0, sample_rate=0.1))


@pytest.mark.slow
def test_would_exceed_and_spend_stop_before_the_budget() -> None:
    mech = CentralGaussian(clip=1.0, noise_multiplier=1.0)
    ledger = PrivacyLedger()
    target = compute_epsilon(
        noise_multiplier=1.0, sample_rate=0.1, steps=20, delta=1e-5, accountant="rdp"
    )
    r = 0
    budget = {"target_epsilon": target + 1e-9, "delta": 1e-5, "accountant": "rdp"}
    while not ledger.would_exceed(mech.event(r, sample_rate=0.1), **budget):
        ledger.spend(mech.event(r, sample_rate=0.1), **budget)
        r += 1
    assert len(ledger) == 20
    with pytest.raises(PrivacyBudgetError, match="above the target"):
        ledger.spend(mech.event(r, sample_rate=0.1), **budget)
    assert len(ledger) == 20  # nothing was recorded


def test_distributed_events_account_with_actual_survivors() -> None:
    mech = DistributedGaussian(clip=1.0, noise_multiplier=1.0, min_survivors=10)
    exact = PrivacyLedger([mech.event(r, sample_rate=1.0, noise_contributors=10) for r in range(5)])
    more = PrivacyLedger([mech.event(r, sample_rate=1.0, noise_contributors=40) for r in range(5)])
    fewer = PrivacyLedger([mech.event(r, sample_rate=1.0, noise_contributors=5) for r in range(5)])
    central = _ledger(5, sigma=1.0, q=1.0)
    assert exact.epsilon(1e-5) == pytest.approx(central.epsilon(1e-5), rel=1e-9)
    assert more.epsilon(1e-5) == pytest.approx(
        compute_epsilon(noise_multiplier=2.0, sample_rate=1.0, steps=5, delta=1e-5), rel=1e-9
    )
    assert fewer.epsilon(1e-5) > exact.epsilon(1e-5)


def test_discrete_events_refuse_prv_and_account_with_rdp() -> None:
    plan = distributed_noise_plan(
        clip=1.0, noise_multiplier=2.0, scale=1024.0, dim=100, min_survivors=4
    )
    ledger = PrivacyLedger(
        [plan.event(r, sample_rate=1.0, noise_contributors=4) for r in range(10)]
    )
    with pytest.raises(ConfigError, match="accountant='rdp'"):
        ledger.epsilon(1e-5, "prv")
    eps = ledger.epsilon(1e-5, "rdp")
    gauss = compute_epsilon(
        noise_multiplier=2.0, sample_rate=1.0, steps=10, delta=1e-5, accountant="rdp"
    )
    assert gauss <= eps <= gauss * 1.01  # large shares: tau ~ 0, same as the Gaussian


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"epsilon": 0.0, "clip": 1.0}, "epsilon must be a finite number > 0, got 0.0"),
        ({"epsilon": -1.0, "clip": 1.0}, "epsilon must be a finite number > 0"),
        ({"epsilon": 2.0, "clip": -1.0}, "clip must be a finite number > 0, got -1.0"),
        ({"epsilon": 2.0, "clip": 1.0, "delta": 1.0}, r"delta must be in \(0, 1\), got 1.0"),
        ({"clip": 1.0}, "give epsilon"),
        ({"epsilon": 2.0, "clip": 1.0, "accountant": "gdp"}, "accountant must be one of"),
        ({"epsilon": 2.0, "clip": 1.0, "privacy_unit": "item"}, "privacy_unit must be one of"),
        ({"epsilon": 2.0, "clip": 1.0, "placement": "distributed"}, "accountant='rdp'"),
        ({"noise_multiplier": 0.0, "clip": 1.0}, "noise multiplier must be"),
    ],
)
def test_config_validation(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        DPConfig(**kwargs)


def test_config_refuses_delta_at_or_above_one_over_n() -> None:
    cfg = DPConfig(epsilon=2.0, delta=1e-3, clip=1.0)
    with pytest.raises(ConfigError, match=r"delta must be below 1/n_users = 0.001"):
        cfg.check_population(1000)
    with pytest.raises(ConfigError, match="delta must be below"):
        cfg.resolve_noise_multiplier(sample_rate=1.0, steps=10, n_users=2000)
    cfg.check_population(500)  # 1e-3 < 1/500: accepted


def test_event_validation() -> None:
    good = CentralGaussian(clip=1.0, noise_multiplier=1.0).event(0, sample_rate=0.5).to_dict()
    for field, value, message in [
        ("sample_rate", 0.0, "sample rate must be in"),
        ("clip", -1.0, "clip must be"),
        ("round", -1, "round must be"),
        ("mechanism", "laplace", "mechanism must be one of"),
        ("noise_contributors", 3, "exactly one contributor"),
    ]:
        with pytest.raises(ConfigError, match=message):
            PrivacyEvent.from_dict({**good, field: value})
    with pytest.raises(ConfigError, match="unknown privacy event fields"):
        PrivacyEvent.from_dict({**good, "extra": 1})


def test_privacy_summary_is_pure_and_complete() -> None:
    cfg = DPConfig(epsilon=5.0, clip=0.5, accountant="rdp")
    ledger = PrivacyLedger(
        [
            CentralGaussian(clip=0.5, noise_multiplier=1.2).event(r, sample_rate=0.2)
            for r in range(4)
        ]
    )
    summary = privacy_summary(cfg, ledger)
    assert len(ledger) == 4
    assert summary["epsilon"] == pytest.approx(ledger.epsilon(1e-5, "rdp"))
    assert {k: summary[k] for k in ("delta", "noise_multiplier", "clip", "accountant")} == {
        "delta": 1e-5,
        "noise_multiplier": 1.2,
        "clip": 0.5,
        "accountant": "rdp",
    }
    assert summary["privacy_unit"] == "user"
    json.dumps(summary)
    sigma = DPConfig(epsilon=2.0, clip=1.0).resolve_noise_multiplier(
        sample_rate=1.0, steps=100, n_users=10**4
    )
    assert sigma == pytest.approx(20.0, rel=0.03)
