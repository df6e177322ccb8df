"""Released-model membership inference (attacks/released.py): calibration and controls."""

from __future__ import annotations

import numpy as np
import pytest

from attacks.audit import AuditConfig, audit
from attacks.metrics import binary_metrics
from attacks.released import known_items, released_labels, released_scores
from protocols.seeding import torch_generator
from securefed.errors import ConfigError
from securefed.training import PrivacyConfig, TrainConfig, build_model, load_split

SMALL = {"synthetic_users": 60, "synthetic_items": 1000, "eval_every": 100, "checkpoint_every": 100}


def test_known_items_and_labels(small_split) -> None:
    n = small_split.n_users
    users, items = known_items(small_split, small_split.n_items, n)
    for u in (0, 7):
        mine = set(items[users == u].tolist())
        train = set(small_split.user_train_items(u).tolist())
        held = {int(small_split.val_items[u]), int(small_split.test_items[u])}
        assert mine == train | held
    part = np.zeros(n, dtype=bool)
    part[::2] = True
    labels = released_labels(small_split, small_split.n_items, n, part)
    # Members: training positives of participating users only; held-out items never.
    assert labels[0, small_split.user_train_items(0)].all()
    assert not labels[1].any()
    assert not labels[0, small_split.val_items[0]] and not labels[0, small_split.test_items[0]]


@pytest.mark.slow
def test_reference_calibration_removes_the_fit_artifact() -> None:
    # An untrained model carries no membership, yet the fit alone separates members (many per
    # user, logit level rising with the user's item count) from held-out items (two per user).
    cfg = TrainConfig(model="fedrecgel", **SMALL)
    split = load_split(cfg)
    model = build_model(cfg, split)
    released = {k: v.detach().clone() for k, v in model.global_parameters().items()}
    calibrated, raw, _ = released_scores(
        "fedrecgel",
        cfg,
        released,
        split,
        n_real=split.n_items,
        n_users=split.n_users,
        generator=torch_generator(0, "test-released"),
    )
    labels = released_labels(split, split.n_items, split.n_users, np.ones(split.n_users, bool))
    # Measured: raw 0.70, calibrated 0.50 (per-user centred). Under the null the AUC's
    # standard error is about 0.027 here (5k members, 120 held-out items): 0.1 is > 3.5 of them.
    assert binary_metrics(raw, labels).auc > 0.62
    assert abs(binary_metrics(calibrated, labels).auc - 0.5) < 0.1


@pytest.mark.slow
@pytest.mark.statistical
def test_negative_control_strong_dp(tmp_path) -> None:
    cfg = TrainConfig(
        model="fedrecgel",
        rounds=1,
        client_fraction=0.5,
        privacy=PrivacyConfig(epsilon=0.5),
        **SMALL,
    )
    res = audit(
        AuditConfig(train=cfg, attacks=("released",), canaries=0, bootstrap=50), out=tmp_path
    )
    rel = res.attacks[0]
    assert rel.name == "released" and rel.threat_model == "release-observer"
    assert "released" in rel.observes
    assert set(rel.metrics) >= {"auc", "tpr@1%fpr", "tpr@0.1%fpr", "f1", "uncalibrated_auc"}
    # Non-members: the ~30 users who never took part and every user's held-out items.
    assert 0 < rel.metrics["participating_users"] < 60
    # Stated interval |AUC - 0.5| < 0.1: the user-bootstrap 95 % interval here is about
    # +-0.05 wide, so 0.1 is about four standard errors.
    assert abs(rel.metrics["auc"] - 0.5) < 0.1, rel.metrics
    z = np.load(tmp_path / "scores.npz")
    assert z["released"].shape == z["released_labels"].shape == (60, 1000)


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (0, "released-model iterations"),
        (1001, "released-model iterations"),
        (True, "released_iterations must be a whole number"),  # the type check comes first
        (2.5, "released_iterations must be a whole number"),
    ],
)
def test_released_iterations_are_checked(bad, message) -> None:
    with pytest.raises(ConfigError, match=message):
        AuditConfig(released_iterations=bad)


@pytest.mark.slow
def test_two_identical_fits_give_identical_scores() -> None:
    """The released-model attack is reproducible to the last bit: two calls with the same
    generator seed gave raw logits up to 0.2 apart (the fits' gathers accumulate their
    gradients in a varying order, which L-BFGS amplifies), and two identical audits differed
    in the fourth decimal of the attack's AUC."""
    import torch

    cfg = TrainConfig(
        model="fedrecgel",
        synthetic_users=150,
        synthetic_items=400,
        **{k: v for k, v in SMALL.items() if not k.startswith("synthetic")},
    )
    split = load_split(cfg)
    model = build_model(cfg, split)
    noise = torch.Generator().manual_seed(1)
    released = {
        k: v.detach().clone() + 0.1 * torch.randn(v.shape, generator=noise)
        for k, v in model.global_parameters().items()
    }
    runs = [
        released_scores(
            "fedrecgel",
            cfg,
            released,
            split,
            n_real=split.n_items,
            n_users=split.n_users,
            generator=torch_generator(0, "test-released-twice"),
            iterations=5,
        )
        for _ in range(2)
    ]
    for calibrated, raw, _ in runs[1:]:
        np.testing.assert_array_equal(raw, runs[0][1])
        np.testing.assert_array_equal(calibrated, runs[0][0])
    assert not torch.are_deterministic_algorithms_enabled()  # the setting is restored
