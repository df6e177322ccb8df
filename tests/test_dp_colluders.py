"""Distributed noise against the server's colluders: only honest survivors' shares count.

Secure aggregation's threat model lets ``ceil(g m)`` of a round's ``m`` clients collude with
the server (``secagg_corrupt`` ``g``); they know their own noise shares, so the sum's noise
against that coalition is the other survivors' shares (docs/privacy.md, "Colluders' noise
shares are not noise")."""

from __future__ import annotations

import math

import pytest

from protocols.dp.mechanisms import distributed_epsilon
from securefed.config import PrivacyConfig, TrainConfig
from securefed.errors import ConfigError
from securefed.flower.pipeline import commit_before_unmask
from securefed.privacy import PrivateAggregator

SMALL = dict(model="fedrap", synthetic_users=60, synthetic_items=400, checkpoint_every=1)
DIM = 4096


def _aggregator(split, rounds: int = 20, **privacy) -> PrivateAggregator:
    cfg = TrainConfig(rounds=rounds, privacy=PrivacyConfig(secagg=True, **privacy), **SMALL)
    return PrivateAggregator(cfg, split, dim=DIM)


def _coalition_epsilon(agg: PrivateAggregator, m: int) -> float:
    """Epsilon of every round at the survivor floor, counting only the honest shares."""
    ddg = agg.discrete_noise(m)
    assert ddg is not None
    honest = ddg.plan.min_survivors - math.ceil(agg.p.secagg_corrupt * m)
    return distributed_epsilon(
        ddg.plan,
        sample_rate=agg.sample_rate,
        steps=agg.rounds,
        delta=agg.p.delta,
        noise_contributors=honest,
    )


def test_the_printed_epsilon_holds_against_the_colluding_clients(small_split):
    """Calibrated at epsilon 8 over 20 rounds of all 40 users, the rounds at the survivor
    floor cost at most 8 with the colluders' ceil(0.05 m) shares removed (8.2 with the shares
    sized for all survivors, as before the fix)."""
    agg = _aggregator(small_split, epsilon=8.0)
    m = small_split.n_users
    assert _coalition_epsilon(agg, m) <= 8.0 * (1 + 1e-3)
    # With no colluders the floor is every survivor's, as before.
    alone = _aggregator(small_split, epsilon=8.0, secagg_corrupt=0.0)
    assert alone.min_survivors(m) == math.ceil(0.95 * m)
    assert _coalition_epsilon(alone, m) <= 8.0 * (1 + 1e-3)


def test_events_count_survivors_less_colluders(small_split):
    """The in-process event, a Flower node's worst-case charge and the Flower server's
    commit before unmasking all count the survivors less ceil(g m)."""
    agg = _aggregator(small_split, noise_multiplier=2.0, secagg_corrupt=0.1)
    m = 30
    floor = agg.min_survivors(m)
    (worst,) = agg.worst_round_events(0, m)
    assert worst.noise_contributors == floor - 3
    assert agg.secure_event(1, 29, m).noise_contributors == 26
    committed = commit_before_unmask(agg, round_index=2, survivors=28, participants=m)
    assert committed.noise_contributors == 25
    assert agg.ledger.events[-1].noise_contributors == 25


def test_survivor_floor_leaves_the_honest_shares_the_noise_is_sized_for(small_split):
    """For every cohort size a round can have, the honest shares among the fewest survivors
    carry at least the calibrated variance sigma^2 D2^2, and a round everyone survives
    carries sigma^2 D2^2 / (1 - f - g) whatever m is (so the noise's size says nothing of
    m). Below the smallest secure round the floor would exceed the cohort: no plan."""
    for dropout, corrupt in ((0.05, 0.05), (0.4, 0.05), (0.1, 0.2)):
        agg = _aggregator(
            small_split, noise_multiplier=1.5, secagg_dropout=dropout, secagg_corrupt=corrupt
        )
        lowest = agg.secure_minimum()
        for m in range(lowest, 400):
            ddg = agg.discrete_noise(m)
            assert ddg is not None
            plan = ddg.plan
            honest = plan.min_survivors - math.ceil(corrupt * m)
            assert plan.min_survivors <= m
            assert plan.min_survivors >= math.ceil((1 - dropout) * m)
            calibrated = (plan.noise_multiplier * plan.l2_sensitivity_after_rounding) ** 2
            assert honest * plan.share_sigma**2 >= calibrated * (1 - 1e-9)
            assert m * plan.share_sigma**2 == pytest.approx(
                calibrated / (1 - dropout - corrupt), rel=1e-8
            )
        if (dropout, corrupt) == (0.05, 0.05):
            assert lowest == 10  # 9 clients: ceil(0.90 * 9) + 1 = 10 survivors
            with pytest.raises(ConfigError, match="9 participants, fewer than the 10"):
                agg.discrete_noise(9)
        if (dropout, corrupt) == (0.1, 0.2):
            # 4 and 5 fit, 6 does not (ceil(4.2) + ceil(1.2) = 7): the minimum is past it.
            assert lowest == 7 and agg.min_survivors(5) == 5


def test_dropout_and_corrupt_fractions_must_leave_an_honest_share():
    with pytest.raises(ConfigError, match="no honest survivor's noise share"):
        PrivacyConfig(secagg=True, epsilon=2.0, secagg_dropout=0.5, secagg_corrupt=0.5)
    for dropout in (0.0, 5e-5):
        with pytest.raises(ConfigError, match="set secagg_dropout to at least 1e-4"):
            PrivacyConfig(secagg=True, epsilon=2.0, secagg_dropout=dropout, secagg_corrupt=0.05)
    # Without colluders no rounding is lost; central noise after the secure sum has no
    # shares, so the pair is the protocol's business there.
    PrivacyConfig(secagg=True, epsilon=2.0, secagg_dropout=0.0, secagg_corrupt=0.0)
    PrivacyConfig(secagg=True, epsilon=2.0, noise="central", secagg_dropout=0.5, secagg_corrupt=0.5)


def test_a_run_whose_largest_cohort_cannot_hold_the_noise_is_refused():
    """At the defaults a secure round with noise shares needs 10 clients; a population of
    8 users is refused before anything runs, with what to change."""
    from securefed.data.split import leave_one_out
    from securefed.data.synthetic import make_synthetic

    data = make_synthetic(n_users=8, n_items=60, seed=3, min_history=6, mean_history=14.0)
    split = leave_one_out(data, seed=3, n_eval_negatives=20)
    cfg = TrainConfig(rounds=3, privacy=PrivacyConfig(secagg=True, epsilon=4.0), **SMALL)
    with pytest.raises(ConfigError, match="largest cohort of this run is 8 clients, fewer than"):
        PrivateAggregator(cfg, split, dim=DIM)


def test_every_cohort_from_the_secure_minimum_on_fits_its_floor(small_split):
    """A small dropout tolerance leaves cohort sizes up to 1 / f whose floor exceeds them
    (found in review: at f 0.0002 the minimum stopped looking at 4,096 and a cohort of 4,101
    raised ConfigError mid-run instead of aggregating)."""
    from securefed.data.split import leave_one_out
    from securefed.data.synthetic import make_synthetic

    data = make_synthetic(n_users=5000, n_items=60, seed=3, min_history=6, mean_history=8.0)
    agg = _aggregator(
        leave_one_out(data, seed=3, n_eval_negatives=20),
        noise_multiplier=1.5,
        secagg_dropout=2e-4,
    )
    lowest = agg.secure_minimum()
    assert lowest > 4096
    assert all(agg.min_survivors(m) <= m for m in range(lowest, 25_000))
    assert agg.min_survivors(lowest - 1) > lowest - 1


def _write_old_ledger(path, agg: PrivateAggregator, m: int) -> None:
    import json

    events = agg.worst_round_events(0, m)
    path.write_text(json.dumps({"events": [e.to_dict() for e in events]}))


def test_a_ledger_that_counted_the_colluders_shares_is_refused(small_split, tmp_path):
    """A run directory or a Flower node's count written before the colluders' shares stopped
    counting as noise has no marker: resuming on it would print an epsilon that does not hold
    against them, so it is refused with what to do; the files written now carry the marker."""
    from securefed.errors import IntegrityError
    from securefed.flower.pipeline import ReleaseLedger
    from securefed.privacy import read_ledger_file

    agg = _aggregator(small_split, epsilon=8.0)
    old = tmp_path / "old.json"
    _write_old_ledger(old, agg, 40)
    with pytest.raises(IntegrityError, match="colluders' too .written before 2026-12-06"):
        read_ledger_file(old)
    with pytest.raises(IntegrityError, match="a new --state-dir"):
        ReleaseLedger(old).charge(agg, 1, 40)
    node = ReleaseLedger(tmp_path / "node.json")
    node.charge(agg, 0, 40)
    assert len(read_ledger_file(tmp_path / "node.json")) == 1
    run = tmp_path / "run"
    run.mkdir()
    agg.attach(run, resume=False)
    agg.commit(*agg.worst_round_events(0, 40))
    assert len(read_ledger_file(run / "privacy_ledger.json")) == 1


def test_without_colluders_a_tiny_dropout_tolerance_builds_at_once(small_split):
    """Without colluders the floor ceil((1 - f) m) fits every m, so nothing is scanned (found
    in review: f 1e-9 scanned a billion cohort sizes before round 1)."""
    agg = _aggregator(small_split, noise_multiplier=1.5, secagg_dropout=1e-9, secagg_corrupt=0.0)
    assert agg.secure_minimum() == 4


def test_settings_no_cohort_meets_fail_at_once(small_split):
    """Dropout 0.5 with corrupt 0.3: no graph meets secure aggregation's bounds for this run's
    40 users; the setup says so from one check instead of trying every cohort size up to
    4,096 first (minutes; found by a CLI check of the new refusals)."""
    with pytest.raises(ConfigError, match="no .neighbours, threshold. meets"):
        _aggregator(small_split, epsilon=2.0, secagg_dropout=0.5, secagg_corrupt=0.3)
