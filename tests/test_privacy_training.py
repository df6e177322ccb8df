"""DP wired into training at the aggregate seam: clipping, noise, ledger, budget, CLI."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from securefed.cli import app
from securefed.federation.base import DenseUpdates, UpdateLayout
from securefed.privacy import PrivateAggregator
from securefed.training import PrivacyConfig, TrainConfig, train

runner = CliRunner()
SMALL = dict(model="fedrap", synthetic_users=60, synthetic_items=400, checkpoint_every=1)


def _aggregator(small_split, **privacy) -> PrivateAggregator:
    cfg = TrainConfig(rounds=5, privacy=PrivacyConfig(**privacy), **SMALL)
    return PrivateAggregator(cfg, small_split, dim=4)


def test_clipping_is_applied_before_summing(small_split):
    agg = _aggregator(small_split, noise_multiplier=1e-6, clip=1.0, accountant="rdp")
    vectors = torch.tensor([[3.0, 4.0, 0, 0], [0.3, 0.4, 0, 0], [0, 0, 0, 10.0]])
    updates = DenseUpdates(
        clients=torch.arange(3), vectors=vectors, layout=UpdateLayout(("x",), ((4,),))
    )
    out = agg(updates, 0)
    expected = torch.tensor([0.6 + 0.3, 0.8 + 0.4, 0.0, 1.0])
    torch.testing.assert_close(out.total, expected, atol=1e-4, rtol=0)
    assert out.denominator == 3  # every client each round: the cohort size is public
    assert len(agg.ledger.events) == 1


@pytest.mark.statistical
def test_central_noise_has_the_calibrated_std(small_split):
    """Sample std of the noise over 20,000 coordinates within 5% of sigma*C.

    False failure: the sample variance of n=20,000 normals has relative sd sqrt(2/n) = 1%,
    so a 5% band on the std (about 10% on the variance) is a 7-sigma event (< 1e-11).
    The same check with sigma off by 10% fails (power check below).
    """
    agg = PrivateAggregator(
        TrainConfig(rounds=5, privacy=PrivacyConfig(noise_multiplier=2.0, clip=0.5), **SMALL),
        small_split,
        dim=20_000,
    )
    zeros = DenseUpdates(
        clients=torch.arange(2),
        vectors=torch.zeros(2, 20_000),
        layout=UpdateLayout(("x",), ((20_000,),)),
    )
    noise = agg(zeros, 0).total
    std = float(noise.double().std())
    assert abs(std / 1.0 - 1) < 0.05
    assert abs(std / 1.1 - 1) > 0.05  # a 10% wrong sigma would be caught


@pytest.mark.statistical
def test_central_noise_after_a_secure_sum_covers_the_rounding(small_split):
    """The unmasked secure sum holds stochastically rounded inputs, each within
    ``sqrt(d) / scale`` of its clipped float, so the server's noise is sized for
    ``clip + sqrt(d) / scale`` (it was sized for ``clip``). A coarse scale (16) makes the
    difference 18x; the sample std of 20,000 coordinates is within 1 % (sd) of its target.
    """
    dim, clip, sigma = 20_000, 0.5, 2.0
    privacy = PrivacyConfig(
        noise_multiplier=sigma, clip=clip, secagg=True, noise="central", secagg_scale_bits=4
    )
    agg = PrivateAggregator(TrainConfig(rounds=5, privacy=privacy, **SMALL), small_split, dim=dim)
    zeros = DenseUpdates(
        clients=torch.arange(20),
        vectors=torch.zeros(20, dim),
        layout=UpdateLayout(("x",), ((dim,),)),
    )
    out = agg(zeros, 0)
    expected = sigma * (clip + dim**0.5 / 16)
    assert out.noise_std == pytest.approx(expected)
    assert abs(float(out.total.double().std()) / expected - 1) < 0.05


def test_dp_run_reports_spent_epsilon_and_ledger(tmp_path):
    res = train(
        TrainConfig(rounds=3, privacy=PrivacyConfig(epsilon=2.0), **SMALL), out=tmp_path / "r"
    )
    s = res.summary
    assert s["epsilon"] <= 2.0 and s["epsilon"] > 1.9
    assert s["delta"] == 1e-5 and s["privacy_unit"] == "user" and s["accountant"] == "prv"
    assert s["clip"] == 10.0 and s["noise_multiplier"] > 1
    eps = [m["epsilon"] for m in res.metrics]
    assert eps == sorted(eps) and eps[-1] == pytest.approx(s["epsilon"])
    ledger = json.loads((tmp_path / "r" / "privacy_ledger.json").read_text())
    assert len(ledger["events"]) == 3
    assert {e["noise_multiplier"] for e in ledger["events"]} == {s["noise_multiplier"]}


def test_budget_cap_stops_cleanly_and_finishes_the_run(tmp_path):
    """A fixed sigma with an epsilon cap stops before the round that would overspend; the run
    can release nothing more, so it finishes as a completed one does: its released model is
    written and its private state dropped (kept only with keep_private_state), and a resume is
    refused as finished, naming the budget."""
    from protocols.dp import compute_epsilon
    from securefed.training import RunFinished

    after_two = compute_epsilon(noise_multiplier=0.8, sample_rate=1.0, steps=2, delta=1e-5)
    after_three = compute_epsilon(noise_multiplier=0.8, sample_rate=1.0, steps=3, delta=1e-5)
    cap = (after_two + after_three) / 2
    capped = PrivacyConfig(noise_multiplier=0.8, clip=1.0, epsilon=cap)
    res = train(TrainConfig(rounds=6, privacy=capped, **SMALL), out=tmp_path / "r")
    assert res.summary["rounds"] == 2
    assert res.summary["stopped"]
    assert after_two - 1e-9 <= res.summary["epsilon"] <= cap
    assert res.summary["budget_spent"] is True
    assert not (tmp_path / "r" / "checkpoint.pt").exists()
    assert (tmp_path / "r" / "model.pt").exists()
    ledger = json.loads((tmp_path / "r" / "privacy_ledger.json").read_text())
    assert len(ledger["events"]) == 2
    with pytest.raises(RunFinished, match="privacy budget was spent.*larger --epsilon"):
        train(resume=tmp_path / "r")
    assert len(json.loads((tmp_path / "r" / "privacy_ledger.json").read_text())["events"]) == 2
    kept = train(
        TrainConfig(rounds=6, privacy=capped, keep_private_state=True, **SMALL),
        out=tmp_path / "k",
    )
    assert kept.summary["rounds"] == 2 and (tmp_path / "k" / "checkpoint.pt").exists()
    with pytest.raises(RunFinished, match="budget was spent; it kept its private state, so"):
        train(resume=tmp_path / "k")


@pytest.mark.slow
def test_train_epsilon_2_on_movielens(tmp_path, shared_data):
    res = runner.invoke(
        app,
        [
            "train",
            "--model",
            "fedrap",
            "--dataset",
            "ml-100k",
            "--data-dir",
            str(shared_data),
            "--epsilon",
            "2",
            "--rounds",
            "2",
            "--local-epochs",
            "2",
            "--out",
            str(tmp_path / "dp"),
        ],
    )
    assert res.exit_code == 0, res.output
    s = json.loads((tmp_path / "dp" / "summary.json").read_text())
    assert s["epsilon"] <= 2.0
    assert 0 <= s["test_hr@10"] <= 1 and "epsilon 2" in res.output.replace("1.99", "2")


def test_account_command_json():
    res = runner.invoke(
        app,
        [
            "account",
            "--epsilon",
            "2",
            "--rounds",
            "100",
            "--client-fraction",
            "0.1",
            "--users",
            "943",
            "--json",
        ],
    )
    assert res.exit_code == 0, res.output
    obj = json.loads(res.output)
    assert set(obj) >= {
        "epsilon",
        "delta",
        "noise_multiplier",
        "sample_rate",
        "rounds",
        "accountant",
    }
    assert obj["noise_multiplier"] == pytest.approx(2.3, rel=0.05)  # Opacus PRV reference value
    assert obj["epsilon"] <= 2.0
    back = runner.invoke(
        app,
        [
            "account",
            "--noise-multiplier",
            str(obj["noise_multiplier"]),
            "--rounds",
            "100",
            "--client-fraction",
            "0.1",
            "--json",
        ],
    )
    assert json.loads(back.output)["epsilon"] == pytest.approx(obj["epsilon"], rel=1e-6)


def test_account_refuses_dp_sgd_settings_that_would_change_nothing():
    for argv, needle in (
        (["--model", "fedrecgel"], "--model describes client-side DP-SGD"),
        (["--local-epochs", "3", "--no-sam"], "--local-epochs, --sam describe"),
        (["--privacy-unit", "interaction", "--sam"], "--sam does not apply to fedrap"),
        (
            ["--privacy-unit", "interaction", "--model", "fedrecgel", "--local-epochs", "2"],
            "--local-epochs does not apply to fedrecgel",
        ),
    ):
        res = runner.invoke(app, ["account", "--epsilon", "2", "--rounds", "5", *argv])
        assert res.exit_code == 2 and needle in " ".join(res.output.split()), res.output
    res = runner.invoke(
        app,
        ["account", "--noise-multiplier", "3", "--rounds", "5", "--json"]
        + ["--privacy-unit", "interaction"],
    )
    assert json.loads(res.output)["steps"] == 50  # FedRAP's 10 local epochs a round


def test_account_command_without_users_and_with_tiny_sigma():
    res = runner.invoke(app, ["account", "--epsilon", "2", "--rounds", "100", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["noise_multiplier"] == pytest.approx(20, rel=0.05)  # issue
    res = runner.invoke(app, ["account", "--noise-multiplier", "1e-9", "--rounds", "100"])
    assert res.exit_code == 0, res.output
    assert "noise multiplier 1e-09 -> epsilon 5.5e+19" in " ".join(res.output.split())


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--epsilon", "-1"], "epsilon must be > 0"),
        (["--epsilon", "2", "--delta", "0.5"], "delta must be below 1/n_users"),
        (["--epsilon", "2", "--no-secure"], "use --replay-from-seed"),
        (["--replay-from-seed"], "has no DP"),
        (["--epsilon", "2", "--clip", "0"], "clip must be"),
    ],
)
def test_dp_flag_errors(tmp_path, argv, needle):
    res = runner.invoke(
        app,
        [
            "train",
            "--synthetic-users",
            "60",
            "--synthetic-items",
            "400",
            "--rounds",
            "1",
            *argv,
            "--out",
            str(tmp_path / "x"),
        ],
    )
    assert res.exit_code == 2, res.output
    assert needle in res.output and "Traceback" not in res.output


@pytest.mark.parametrize("privacy", [None, dict(noise_multiplier=1e-9, clip=1e4)])
def test_null_users_upload_zero_and_are_still_counted(small_split, privacy):
    """The zero-out neighbour (the user canary audit's absent world): a null user's upload
    counts as zero in the released sum, and it stays in the cohort and the denominator, so
    the worlds differ by its contribution alone."""
    import dataclasses

    import numpy as np

    from securefed.training import build_aggregator, build_model

    split = dataclasses.replace(small_split, null_users=np.array([1, 3], dtype=np.int64))
    cfg = TrainConfig(rounds=5, privacy=PrivacyConfig(**(privacy or {})), **SMALL)
    model = build_model(cfg, split)
    vectors = torch.arange(1.0, 5.0).unsqueeze(1) * torch.ones(4, model.layout.size)
    updates = DenseUpdates(clients=torch.tensor([0, 1, 2, 3]), vectors=vectors, layout=model.layout)
    out = build_aggregator(cfg, split, model)(updates, 0)
    torch.testing.assert_close(out.total, vectors[0] + vectors[2], atol=1e-4, rtol=0)
    assert out.contributors == 4 and out.denominator == 4


def test_an_empty_poisson_cohort_under_distributed_noise_releases_the_recorded_share(small_split):
    """No client to add a share: the server adds the one share the event records (it read an
    undefined name and crashed after the event was written; found in review)."""
    cfg = TrainConfig(
        rounds=5,
        client_fraction=0.1,
        privacy=PrivacyConfig(noise_multiplier=2.0, clip=0.5, noise="distributed"),
        **SMALL,
    )
    agg = PrivateAggregator(cfg, small_split, dim=20_000)
    empty = DenseUpdates(
        clients=torch.zeros(0, dtype=torch.long),
        vectors=torch.zeros(0, 20_000),
        layout=UpdateLayout(("x",), ((20_000,),)),
    )
    out = agg(empty, 0)
    assert out is not None and out.contributors == 0 and len(agg.ledger.events) == 1
    assert abs(float(out.total.double().std()) / 1.0 - 1) < 0.05  # sigma C = 2 x 0.5
