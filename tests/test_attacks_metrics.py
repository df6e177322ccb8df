"""Attack metrics and epsilon lower bounds: exact values, properties and power checks."""

from __future__ import annotations

import math

import numpy as np
import pytest

from attacks.canaries import clopper_pearson_bound, one_run_bound, plant_canaries
from attacks.metrics import binary_metrics, membership_report
from securefed.errors import ConfigError


def test_binary_metrics_exact_values() -> None:
    labels = np.array([1, 1, 0, 0, 0], dtype=bool)
    perfect = binary_metrics(np.array([5.0, 4, 3, 2, 1]), labels)
    assert perfect.auc == pytest.approx(1.0)
    assert perfect.f1 == pytest.approx(1.0)
    assert perfect.tpr_at_1 == pytest.approx(1.0)
    reverse = binary_metrics(np.array([1.0, 2, 3, 4, 5]), labels)
    assert reverse.auc == pytest.approx(0.0)
    assert reverse.f1 == pytest.approx(0.0)
    # One positive above every negative, one tied with all of them: AUC 1/2 + 1/2 * 1/2.
    tied = binary_metrics(np.array([2.0, 1, 1, 1, 1]), labels)
    assert tied.auc == pytest.approx(0.75)
    # F1 at |P| = 2: one certain hit plus one slot shared by 4 tied pairs (1 of them a hit).
    assert tied.f1 == pytest.approx((1 + 1 / 4) / 2)


def test_binary_metrics_skips_nan_candidates() -> None:
    scores = np.array([np.nan, 3.0, 1.0, np.nan])
    labels = np.array([False, True, False, True])
    m = binary_metrics(scores, labels)
    assert (m.positives, m.negatives) == (1, 1)
    assert m.auc == pytest.approx(1.0)


def test_membership_report_interval_and_null() -> None:
    rng = np.random.default_rng(0)
    labels = rng.random((80, 300)) < 0.1
    null = rng.random((80, 300))
    metrics, ci, base = membership_report(null, labels, rng=np.random.default_rng(1), n_boot=100)
    # Null scores: AUC 1/2 within 5 standard errors (sd < 0.01 here), CI covers the point.
    assert abs(metrics["auc"] - 0.5) < 0.05
    assert ci["auc"][0] <= metrics["auc"] <= ci["auc"][1]
    assert base["auc"] == 0.5
    assert base["f1"] == pytest.approx(labels.mean())
    strong = labels + rng.normal(0, 0.3, labels.shape)
    m2, ci2, _ = membership_report(strong, labels, rng=np.random.default_rng(1), n_boot=100)
    assert m2["auc"] > 0.95
    assert ci2["auc"][0] > 0.9


@pytest.mark.parametrize("noise", [0.02, 0.1, 0.3])
def test_membership_report_intervals_hold_their_point_estimates(noise) -> None:
    """Near-perfect attacks, where binning the resamples' scores once printed an AUC of 1.000
    with the interval [0.997, 0.998]: every statistic's interval holds its point."""
    rng = np.random.default_rng(2)
    labels = rng.random((200, 400)) < 0.05
    scores = labels + rng.normal(0, noise, labels.shape)
    m, ci, _ = membership_report(scores, labels, rng=np.random.default_rng(3), n_boot=100)
    for key in ("auc", "tpr@1%fpr", "tpr@0.1%fpr", "f1"):
        lo, hi = ci[key]
        assert lo - 1e-12 <= m[key] <= hi + 1e-12, (key, m[key], ci[key])
        assert 0.0 <= lo <= hi <= 1.0


def test_auc_verdict_flags_below_chance_and_reads_the_interval() -> None:
    from attacks.results import AttackResult, auc_verdict

    base = {"auc": 0.5}
    assert auc_verdict({"auc": 0.441}, {"auc": [0.41, 0.47]}, base) == "BELOW CHANCE"
    assert auc_verdict({"auc": 0.48}, {"auc": [0.44, 0.52]}, base) == "chance level"
    assert auc_verdict({"auc": 0.9}, {"auc": [0.88, 0.92]}, base) == "above chance"
    assert auc_verdict({"auc": 0.6}, {"auc": [float("nan")] * 2}, base) == "above chance"
    assert auc_verdict({}, {}, base) == ""
    row = AttackResult("union", "server", {"auc": 0.441}, {"auc": [0.41, 0.47]}, base)
    assert row.as_dict()["verdict"] == "BELOW CHANCE"


def _randomized_response(
    eps: float, m: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """An exactly eps-DP release of each canary bit (randomized response)."""
    included = rng.random(m) < 0.5
    keep = rng.random(m) < math.exp(eps) / (1 + math.exp(eps))
    out = np.where(keep, included, ~included)
    return out.astype(float) + rng.random(m) * 1e-3, included


@pytest.mark.statistical
def test_one_run_bound_valid_and_powerful() -> None:
    # Validity: each bound holds with probability >= 97.5 %; over 5 seeds the chance that
    # any exceeds the true epsilon is < 13 % per bound in the worst case; in practice the
    # bounds sit well below (fixed seeds, so this test is deterministic).
    for seed in range(5):
        rng = np.random.default_rng(seed)
        scores, included = _randomized_response(1.0, 1000, rng)
        eps, _ = one_run_bound(scores, included, delta=0.0, alpha=0.025)
        cp = clopper_pearson_bound(scores, included, delta=0.0, alpha=0.025, rng=rng)
        assert eps <= 1.0
        assert cp <= 1.0
    # Power: at epsilon 3 both bounds clearly exceed 1.
    rng = np.random.default_rng(7)
    scores, included = _randomized_response(3.0, 1000, rng)
    eps, detail = one_run_bound(scores, included, delta=0.0, alpha=0.025)
    assert eps > 1.5, detail
    assert clopper_pearson_bound(scores, included, delta=0.0, alpha=0.025, rng=rng) > 1.5
    # A score that separates the wrong way round is evidence too: the direction is chosen
    # on the pick half.
    assert clopper_pearson_bound(-scores, included, delta=0.0, alpha=0.025, rng=rng) > 1.5


def test_one_run_bound_zero_without_signal() -> None:
    rng = np.random.default_rng(3)
    included = rng.random(500) < 0.5
    eps, _ = one_run_bound(rng.random(500), included, delta=1e-5, alpha=0.025)
    assert eps < 0.5


def test_plant_canaries(small_split) -> None:
    """Zero-out canaries: every canary client is in the population whatever its bit (the
    number of users, hence every round's denominator, is the same in both worlds); the
    absent ones are the split's null users."""
    rng = np.random.default_rng(0)
    planted, can = plant_canaries(small_split, 30, rng)
    n_in = int(can.included.sum())
    assert 0 < n_in < 30
    assert planted.n_items == small_split.n_items + 30
    assert planted.n_users == small_split.n_users + 30
    other, _ = plant_canaries(small_split, 30, np.random.default_rng(1))
    assert other.n_users == planted.n_users  # independent of which bits came out
    # Real users are untouched; every canary client trains on its item; null ones upload 0.
    assert np.array_equal(planted.train_items[: small_split.n_train], small_split.train_items)
    assert np.array_equal(can.users, small_split.n_users + np.arange(30))
    assert planted.null_users is not None
    assert np.array_equal(planted.null_users, can.users[~can.included])
    for u, i in zip(can.users, can.items, strict=True):
        row = planted.user_train_items(int(u))
        assert row.size == 3 and row[-1] == i and np.all(np.diff(row) > 0)
        assert planted.val_items[u] not in row and planted.test_items[u] not in row
        assert not np.isin(planted.val_negatives[u], row).any()
    assert planted.val_negatives.shape == (planted.n_users, small_split.val_negatives.shape[1])
    assert planted.attributes["gender"][small_split.n_users :].tolist() == [-1] * 30
    with pytest.raises(ConfigError, match="positive integer"):
        plant_canaries(small_split, 0, rng)


def test_plant_pair_canaries(small_split) -> None:
    """``items_per_canary=2`` (fedals's co-occurrence rounds): each canary owns two fresh
    items, the first ones then the partners (the catalogue's last ``count``), both trained
    by its client only; the random draws, hence the included set and every real item of the
    canary clients, are those of one-item canaries."""
    one, can1 = plant_canaries(small_split, 30, np.random.default_rng(0))
    planted, can = plant_canaries(small_split, 30, np.random.default_rng(0), items_per_canary=2)
    n = small_split.n_items
    assert planted.n_items == n + 60 and planted.n_users == one.n_users
    assert np.array_equal(can.items, n + np.arange(30)) and can1.partners is None
    assert can.partners is not None and np.array_equal(can.partners, n + 30 + np.arange(30))
    assert np.array_equal(can.included, can1.included) and np.array_equal(can.users, can1.users)
    real = planted.train_items[: small_split.n_train]
    assert not np.isin(np.arange(n, n + 60), real).any()
    assert np.array_equal(planted.null_users, one.null_users)
    for u, i, p in zip(can.users, can.items, can.partners, strict=True):
        row = planted.user_train_items(int(u))
        assert row.size == 4 and row[-2:].tolist() == [i, p]
        assert np.array_equal(row[:2], one.user_train_items(int(u))[:2])
        assert planted.test_items[u] == one.test_items[u]
    with pytest.raises(ValueError, match="items_per_canary"):
        plant_canaries(small_split, 3, np.random.default_rng(0), items_per_canary=3)


def test_plant_canaries_needs_two_distinct_negative_sets() -> None:
    from securefed.data.split import leave_one_out
    from securefed.data.synthetic import make_synthetic

    # 60 items, 25 negatives: a canary client draws 4 + 2 * 25 = 54 distinct real items (fits);
    # with 30 negatives it would need 64 (a numpy traceback before the check counted both sets).
    data = make_synthetic(n_users=40, n_items=60, seed=3, min_history=6, mean_history=14.0)
    rng = np.random.default_rng(0)
    plant_canaries(leave_one_out(data, seed=3, n_eval_negatives=25), 4, rng)
    with pytest.raises(ConfigError, match="at least 64 real items .* the data has 60"):
        plant_canaries(leave_one_out(data, seed=3, n_eval_negatives=30), 4, rng)


def test_an_attribute_attack_without_signal_says_so_not_chance() -> None:
    """Profiles that are all zero (private fedals's count rounds upload no factor) gave every
    user the same prediction, read "chance level" at AUC 0.500 [0.500, 0.500]: it is no
    measurement of an attack at chance."""
    from attacks.attribute import attribute_inference
    from attacks.results import NO_SIGNAL, AttackResult

    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, size=80)

    def result(features: np.ndarray) -> AttackResult:
        metrics, ci, base = attribute_inference(features, labels, rng=np.random.default_rng(1))
        return AttackResult("attribute-gender", "upload-observer", metrics, ci, base)

    blank = result(np.zeros((80, 30)))
    assert blank.metrics["auc"] == 0.5 and blank.ci95["auc"] == [0.5, 0.5]
    assert blank.metrics["constant_scores"] and blank.verdict == NO_SIGNAL
    assert blank.as_dict()["verdict"] == NO_SIGNAL
    # Profiles that differ, whatever the attack makes of them, are scored as before.
    noise = result(rng.normal(size=(80, 30)))
    assert not noise.metrics["constant_scores"]
    assert noise.verdict in ("above chance", "chance level", "BELOW CHANCE")
