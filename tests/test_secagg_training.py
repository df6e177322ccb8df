"""Secure aggregation wired into training: same model as plain averaging, DP inside the ring."""

from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

from securefed.cli import app
from securefed.training import PrivacyConfig, TrainConfig, train

runner = CliRunner()
SMALL = dict(model="fedrap", synthetic_users=60, synthetic_items=400, checkpoint_every=1, rounds=2)


@pytest.mark.slow
def test_secagg_training_matches_plain_to_fixed_point_precision(tmp_path):
    plain = train(TrainConfig(**SMALL), out=tmp_path / "plain")
    secure = train(TrainConfig(privacy=PrivacyConfig(secagg=True), **SMALL), out=tmp_path / "sec")
    c_plain, c_sec = plain.model.C, secure.model.C
    # Stochastic rounding at scale 2^16: each coordinate of the mean is off by < 2^-16.
    assert float((c_plain - c_sec).abs().max()) < 1e-3
    assert float((c_plain - c_sec).abs().max()) > 0  # the sum really went through the ring
    for a, b in zip(plain.metrics, secure.metrics, strict=True):
        assert a["test_hr@10"] == pytest.approx(b["test_hr@10"], abs=0.02)
        assert b["secagg_survivors"] == 60 and b["contributors"] == 60
    assert secure.summary["secagg"] is True and secure.summary["epsilon"] is None


@pytest.mark.slow
def test_secagg_with_dropouts_uses_survivors_sum(tmp_path):
    cfg = TrainConfig(privacy=PrivacyConfig(secagg=True, secagg_simulate_dropout=0.04), **SMALL)
    res = train(cfg, out=tmp_path / "drop")
    for m in res.metrics:
        assert m["contributors"] == m["secagg_survivors"] <= 60
    assert any(m["contributors"] < 60 for m in res.metrics)


@pytest.mark.slow
def test_secagg_with_epsilon_uses_distributed_discrete_noise(tmp_path):
    cfg = TrainConfig(privacy=PrivacyConfig(secagg=True, epsilon=2.0), **SMALL)
    res = train(cfg, out=tmp_path / "ddg")
    s = res.summary
    assert s["placement"] == "distributed" and s["accountant"] == "rdp"
    assert s["epsilon"] <= 2.0 and s["min_survivors"] >= 1
    ledger = json.loads((tmp_path / "ddg" / "privacy_ledger.json").read_text())
    events = ledger["events"]
    assert len(events) == 2
    # 60 survivors less the ceil(0.05 * 60) = 3 that may collude with the server.
    assert all(e["mechanism"] != "gaussian" and e["noise_contributors"] == 57 for e in events)
    # The noise is really there: the aggregate differs from the noiseless secure sum.
    plain = train(TrainConfig(privacy=PrivacyConfig(secagg=True), **SMALL), out=tmp_path / "nodp")
    assert float((plain.model.C - res.model.C).abs().max()) > 1e-2


def test_cli_secagg_epsilon(tmp_path):
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
            "--secagg",
            "--epsilon",
            "2",
            "--out",
            str(tmp_path / "r"),
        ],
    )
    assert res.exit_code == 0, res.output
    assert "epsilon" in res.output
    # The threat model the epsilon holds under is printed beside it.
    assert "up to 0.05 of each round's clients colluding" in " ".join(res.output.split())


@pytest.mark.slow
def test_secagg_on_movielens_matches_plain(tmp_path, shared_data):
    base = dict(
        model="fedrap", dataset="ml-100k", data_dir=str(shared_data), rounds=1, checkpoint_every=1
    )
    from securefed.models.fedrap import FedRAPConfig

    quick = FedRAPConfig(local_epochs=2)
    plain = train(TrainConfig(params=quick, **base), out=tmp_path / "p")
    secure = train(
        TrainConfig(params=quick, privacy=PrivacyConfig(secagg=True), **base), out=tmp_path / "s"
    )
    assert float((plain.model.C - secure.model.C).abs().max()) < 1e-3
    for key in ("test_hr@10", "test_ndcg@10", "test_full_hr@10", "val_hr@10"):
        assert secure.summary[key] == pytest.approx(plain.summary[key], abs=0.005), key


@pytest.mark.slow
def test_secagg_dp_round_below_min_survivors_releases_nothing(tmp_path):
    """Noise shares are sized for ceil((1 - tolerance) * cohort) survivors; fewer: no release."""
    cfg = TrainConfig(
        privacy=PrivacyConfig(
            secagg=True, epsilon=2.0, secagg_dropout=0.05, secagg_simulate_dropout=0.3
        ),
        **SMALL,
    )
    res = train(cfg, out=tmp_path / "few")
    assert all(m["contributors"] == 0 and m["aborted"] for m in res.metrics)
    ledger = json.loads((tmp_path / "few" / "privacy_ledger.json").read_text())
    assert ledger["events"] == []
    assert res.summary["min_survivors"] == 57  # ceil(0.95 * 60)
    # Two rounds ran and none released (the ledger's count of events used to overwrite
    # "rounds", so a run with aborted rounds looked unfinished and printed "0 of 0").
    assert res.summary["rounds"] == 2 and res.summary["released_rounds"] == 0


def test_poisson_rounds_under_distributed_noise_size_shares_for_their_own_cohort(tmp_path):
    """A Poisson cohort's size varies; each round's shares are sized for the honest ones of
    ceil(0.95 m) of its own m clients (shares for 0.90 m: 5 % may collude with the server
    and know theirs), so no round aborts for a short sample and every round's noise is
    sigma^2 D2^2 / 0.90 whatever m is: neither the aborts nor the noise's size tells an
    observer of the releases how many clients were sampled. Shares sized for a fixed t (the
    expected cohort) aborted the short rounds and gave the others m / t of the calibrated
    variance. Each event counts the survivors less ceil(0.05 m) colluders' shares."""
    cfg = TrainConfig(
        privacy=PrivacyConfig(secagg=True, epsilon=4.0),
        **{**SMALL, "rounds": 6, "client_fraction": 0.5, "checkpoint_every": 6},
    )
    res = train(cfg, out=tmp_path / "poisson")
    assert not any(m.get("aborted") for m in res.metrics)
    events = json.loads((tmp_path / "poisson" / "privacy_ledger.json").read_text())["events"]
    sizes = [m["participants"] for m in res.metrics]
    assert len(events) == 6 and len(set(sizes)) > 1, sizes  # the sample's size varied
    sigma = res.summary["noise_multiplier"]
    for event, m in zip(events, sizes, strict=True):
        assert event["noise_contributors"] == m - math.ceil(0.05 * m)
        # The floor tolerates 5 % dropouts and leaves 0.90 m honest shares beside colluders.
        floor = event["min_survivors"]
        assert math.ceil(0.95 * m) <= floor <= math.ceil(0.95 * m) + 1
        assert floor - math.ceil(0.05 * m) >= 0.90 * m - 1e-9
        assert m * event["share_sigma"] ** 2 == pytest.approx(
            (sigma * event["l2_sensitivity"]) ** 2 / 0.90
        )
    assert res.summary["min_survivor_fraction"] == 0.95 and "min_survivors" not in res.summary
    assert res.summary["colluder_fraction"] == 0.05


def test_a_poisson_round_too_small_for_secure_aggregation_aborts_and_the_run_goes_on(tmp_path):
    """At q = 0.15 of 60 users (9 expected) rounds of 4-9 clients come up beside larger ones;
    no (k, t) meets secure aggregation's bounds below 4 clients at the defaults, and below 10
    (with noise shares in the ring) the survivor
    floor that leaves 90 % of the cohort as honest noise shares beside 5 % colluders is more
    than the cohort. Such a round aborts before anything is encoded (nothing released or
    charged) and the run goes on; it used to stop the run with a ConfigError from
    SecAggConfig."""
    cfg = TrainConfig(  # replay: the seed's cohorts, so the small rounds surely come up
        privacy=PrivacyConfig(secagg=True, epsilon=8.0, replay=True),
        **{**SMALL, "rounds": 10, "client_fraction": 0.15, "checkpoint_every": 10},
    )
    res = train(cfg, out=tmp_path / "tiny")
    sizes = [m["participants"] for m in res.metrics]
    assert len(sizes) == 10 and any(4 <= n < 10 for n in sizes), sizes
    assert any(n >= 10 for n in sizes), sizes
    for m in res.metrics:
        if m["participants"] < 10:
            assert m["contributors"] == 0
            assert "secure aggregation needs" in m["aborted"], m
        else:
            assert not m.get("aborted")
    events = json.loads((tmp_path / "tiny" / "privacy_ledger.json").read_text())["events"]
    assert len(events) == sum(n >= 10 for n in sizes) == res.summary["released_rounds"]


def _streamed(monkeypatch, workers):
    """Stream every secure round of the SMALL run (the threshold at 1,000 ring words), in
    tiles of 256 coordinates and blocks of 512, with ``workers`` mask threads."""
    from protocols.secagg import batched, simulation
    from securefed import costs, privacy

    monkeypatch.setattr(costs, "STREAM_RING_WORDS", 1000)
    monkeypatch.setattr(privacy, "ENCODE_TILE", 256)
    monkeypatch.setattr(privacy.EncodedBlocks, "align", 256)
    monkeypatch.setattr(privacy.DiscreteGaussianBlocks, "align", 256)
    monkeypatch.setattr(batched, "STREAM_BLOCK_BYTES", 8 * 60 * 600)
    monkeypatch.setattr(simulation, "default_workers", lambda: workers)


@pytest.mark.slow
def test_streamed_secure_round_matches_plain_and_does_not_depend_on_threads(tmp_path, monkeypatch):
    """A secure round too large for the [clients, d] table is encoded and masked a block at
    a time (FedRAP's uploads stream): the model equals plain averaging to fixed-point
    precision, and the inputs (rounding drawn per tile) do not depend on the mask threads."""
    small = {**SMALL, "rounds": 1}
    plain = train(TrainConfig(**small), out=tmp_path / "plain")
    runs = []
    for workers in (1, 2):
        with monkeypatch.context() as m:
            _streamed(m, workers)
            cfg = TrainConfig(privacy=PrivacyConfig(secagg=True), **small)
            runs.append(train(cfg, out=tmp_path / f"streamed{workers}"))
    one, two = runs
    assert one.metrics[0]["secagg_streamed"] is True and one.metrics[0]["secagg_survivors"] == 60
    gap = float((plain.model.C - one.model.C).abs().max())
    assert 0 < gap < 1e-3  # through the ring, rounded at scale 2^16
    assert bool((one.model.C == two.model.C).all())
    in_memory = train(TrainConfig(privacy=PrivacyConfig(secagg=True), **small), out=tmp_path / "m")
    assert in_memory.metrics[0]["secagg_streamed"] is False


@pytest.mark.slow
def test_fedals_secure_round_streams_and_matches_plain(tmp_path, monkeypatch):
    """fedals's uploads stream too (item rows, Gram, counts a block at a time): one streamed
    secure round gives the plain round's item factors to fixed-point precision."""
    small = {**SMALL, "model": "fedals", "rounds": 1}
    plain = train(TrainConfig(**small), out=tmp_path / "plain")
    with monkeypatch.context() as m:
        _streamed(m, 2)
        streamed = train(
            TrainConfig(privacy=PrivacyConfig(secagg=True), **small), out=tmp_path / "s"
        )
    assert streamed.metrics[0]["secagg_streamed"] is True
    v_plain, v_sec = plain.model.V, streamed.model.V
    gap = float((v_plain - v_sec).abs().max())
    assert 0 < gap < 1e-3 * max(1.0, float(v_plain.abs().max()))


@pytest.mark.slow
def test_streamed_secure_round_with_distributed_dp(tmp_path, monkeypatch):
    """Distributed DP streams too (rounding decided tile by tile, one bit a coordinate kept):
    the same ledger as the in-memory round, the noise really in the model, the survivors'
    shares accounted."""
    small = {**SMALL, "rounds": 1}
    cfg = TrainConfig(privacy=PrivacyConfig(secagg=True, epsilon=2.0, replay=True), **small)
    in_memory = train(cfg, out=tmp_path / "memory")
    with monkeypatch.context() as m:
        _streamed(m, 2)
        streamed = train(cfg, out=tmp_path / "streamed")
    assert streamed.metrics[0]["secagg_streamed"] is True
    assert in_memory.metrics[0]["secagg_streamed"] is False
    events = [
        json.loads((tmp_path / name / "privacy_ledger.json").read_text())["events"]
        for name in ("memory", "streamed")
    ]
    assert events[0] == events[1] and events[1][0]["noise_contributors"] == 60 - 3  # colluders
    assert streamed.summary["epsilon"] == in_memory.summary["epsilon"] <= 2.0
    plain = train(TrainConfig(privacy=PrivacyConfig(secagg=True), **small), out=tmp_path / "p")
    assert float((plain.model.C - streamed.model.C).abs().max()) > 1e-2  # the noise is there
