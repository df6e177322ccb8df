"""A run whose loss or parameters go NaN or infinite stops at once, says which round and why,
keeps its last finite checkpoint and exits 1 from the CLI; a loss growing without bound is
warned about once (issue 18)."""

from __future__ import annotations

import json
import math

import pytest
import torch
from typer.testing import CliRunner

from securefed import runs
from securefed.cli import app
from securefed.federation.base import RoundStats
from securefed.models.fedrap import FedRAP
from securefed.training import LOSS_GROWTH_WARNING, TrainConfig, train

runner = CliRunner()
SMALL = dict(model="fedrap", synthetic_users=60, synthetic_items=400, rounds=5, checkpoint_every=2)


def _nan_loss_in(monkeypatch, round_index: int) -> None:
    original = FedRAP.client_round

    def client_round(self, participants, r, generator):
        updates, stats = original(self, participants, r, generator)
        if r == round_index:
            stats = RoundStats(loss=math.nan, samples=stats.samples)
        return updates, stats

    monkeypatch.setattr(FedRAP, "client_round", client_round)


def _poison(monkeypatch, round_index: int, tensor: str) -> None:
    """Set one entry of the model's ``tensor`` (C: shared, D: private) to inf in a round."""
    original = FedRAP.end_round

    def end_round(self, r):
        original(self, r)
        if r == round_index:
            getattr(self, tensor).view(-1)[0] = math.inf

    monkeypatch.setattr(FedRAP, "end_round", end_round)


def _finite(state) -> bool:
    return all(
        bool(torch.isfinite(v).all())
        for v in state.values()
        if isinstance(v, torch.Tensor) and v.is_floating_point()
    )


@pytest.mark.parametrize(
    ("poison", "why"),
    [
        (lambda mp: _nan_loss_in(mp, 3), "the training loss is nan"),
        (lambda mp: _poison(mp, 3, "C"), "the shared model holds NaN or infinite values (C)"),
        # Private state is checked where it is saved: round 4 is a checkpoint round.
        (lambda mp: _poison(mp, 3, "D"), "the model holds NaN or infinite values (D)"),
    ],
    ids=["loss", "shared", "private"],
)
def test_non_finite_round_stops_and_keeps_the_last_finite_checkpoint(
    tmp_path, monkeypatch, poison, why
):
    poison(monkeypatch)
    run = tmp_path / "run"
    res = train(TrainConfig(**SMALL), out=run)
    assert res.summary["diverged_round"] == 4
    assert res.summary["stopped"].startswith(f"diverged in round 4: {why}")
    assert "last finite checkpoint (round 2) is kept" in res.summary["stopped"]
    ckpt = runs.load_checkpoint(run)
    assert ckpt["round"] == 2 and _finite(ckpt["model"])
    # The diverged round is not logged; the summary reports the finite rounds.
    logged = [json.loads(x)["round"] for x in (run / runs.METRICS_FILE).read_text().splitlines()]
    assert logged == [1, 2, 3] and res.summary["rounds"] == 3
    assert json.loads((run / runs.SUMMARY_FILE).read_text())["diverged_round"] == 4


def test_an_empty_round_is_not_divergence(tmp_path, monkeypatch):
    # A round where nobody trained reports a NaN loss by design (no samples).
    original = FedRAP.client_round

    def client_round(self, participants, r, generator):
        updates, stats = original(self, participants, r, generator)
        return updates, RoundStats(loss=math.nan, samples=0) if r == 1 else stats

    monkeypatch.setattr(FedRAP, "client_round", client_round)
    res = train(TrainConfig(**{**SMALL, "rounds": 3}), out=tmp_path / "run")
    assert "stopped" not in res.summary and res.summary["rounds"] == 3


def test_cli_diverged_run_exits_1_with_one_line(tmp_path, monkeypatch):
    _nan_loss_in(monkeypatch, 1)
    run = tmp_path / "run"
    res = runner.invoke(
        app,
        ["train", "--model", "fedrap", "--synthetic-users", "60", "--synthetic-items", "400"]
        + ["--rounds", "4", "--out", str(run)],
    )
    assert res.exit_code == 1, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit)  # no traceback
    text = res.output.replace("\n", "")
    assert "diverged in round 2: the training loss is nan" in text
    assert "no checkpoint had been written" in text  # checkpoints every 10 rounds
    assert not (run / runs.CHECKPOINT_FILE).exists()


def test_loss_growing_without_bound_is_warned_about_once(tmp_path, monkeypatch):
    original = FedRAP.client_round

    def client_round(self, participants, r, generator):
        updates, stats = original(self, participants, r, generator)
        first = 0.5 if r == 0 else -0.5 * (LOSS_GROWTH_WARNING * 10) ** (r / 2)
        return updates, RoundStats(loss=first, samples=stats.samples)

    monkeypatch.setattr(FedRAP, "client_round", client_round)
    seen = []
    res = train(TrainConfig(**SMALL), out=tmp_path / "run", progress=seen.append)
    warned = [r.round for r in seen if r.warning]
    # |loss| passes LOSS_GROWTH_WARNING x the first round's at round 3 (r = 2), and is
    # warned about only then.
    assert warned == [3] and "round 3: the training loss" in seen[2].warning
    assert res.summary["warnings"] == [seen[2].warning] and "stopped" not in res.summary


def _growing_loss(monkeypatch):
    """FedRAP's round loss made to grow: |loss| passes LOSS_GROWTH_WARNING x the first
    round's at round 3 (in its local training step, which a node's own users' training goes
    through too)."""
    original = FedRAP.train_plan

    def train_plan(self, plan, r):
        updates, stats = original(self, plan, r)
        first = 0.5 if r == 0 else -0.5 * (LOSS_GROWTH_WARNING * 10) ** (r / 2)
        return updates, RoundStats(loss=first, samples=stats.samples)

    monkeypatch.setattr(FedRAP, "train_plan", train_plan)


def test_a_flower_run_warns_about_a_growing_loss_as_the_in_process_run_does(tmp_path, monkeypatch):
    # The server reads the round's loss off the secure sum; the same warning, once, in its
    # progress and its summary.
    from securefed.config import PrivacyConfig
    from securefed.flower.local import LocalTransport
    from securefed.flower.server import FederatedServer

    _growing_loss(monkeypatch)
    cfg = TrainConfig(**{**SMALL, "rounds": 4}, privacy=PrivacyConfig(secagg=True))
    seen = []
    server = FederatedServer(
        cfg,
        run_dir=tmp_path / "fl",
        transport=LocalTransport(2, state_dir=tmp_path / "nodes"),
        progress=seen.append,
    )
    res = server.run()
    warned = [r.round for r in seen if r.warning]
    assert warned == [3] and "round 3: the training loss" in seen[2].warning
    assert res.summary["warnings"] == [seen[2].warning]


def test_the_metrics_follower_warns_about_a_growing_loss_once(tmp_path):
    # `flower local` / `simulate` show a Flower run's rounds from its metrics lines: the same
    # warning as the run's own, its reference the first finite loss, a resume's kept lines
    # included.
    from securefed.flower.deploy import MetricsFollower
    from securefed.training import LossWatch

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    runs.append_metrics(run_dir, {"round": 1, "loss": float("nan")})  # aborted: no loss
    runs.append_metrics(run_dir, {"round": 2, "loss": 0.5})  # kept by a resume
    shown = []
    with MetricsFollower(run_dir, shown.append, rounds=6, poll=60) as follower:
        big = LOSS_GROWTH_WARNING  # the threshold is big x the reference 0.5
        for r, loss in [(3, 0.4 * big), (4, float("nan")), (5, -0.6 * big), (6, 1e3 * big)]:
            runs.append_metrics(run_dir, {"round": r, "loss": loss})
        follower.check()
    assert [(r.round, r.warning is not None) for r in shown] == [
        (3, False),
        (4, False),
        (5, True),
        (6, False),
    ]
    watch = LossWatch([{"round": 2, "loss": 0.5}])
    assert watch.see(5, -0.6 * big) == shown[2].warning and "round 5" in shown[2].warning
    fresh = LossWatch()
    assert fresh.see(1, 0.0, trained=False) is None and fresh.first is None
    assert fresh.see(2, 1e9, trained=False) is None  # no trained round yet: no reference
