"""Ctrl-C: exit 130, the run's own path in the resume hint, a checkpoint of the last completed
round, and a resume that continues from it to the uninterrupted metrics (issue 18).

An interrupt between rounds (raised from the ``progress`` callback, which is what the CLI's
first Ctrl-C does) checkpoints the completed round; one inside a round writes nothing more, so
the checkpoint, ``metrics.jsonl`` and the privacy ledger always describe completed rounds.
"""

from __future__ import annotations

import json
import os
import signal

import pytest
from typer.testing import CliRunner

from securefed import runs
from securefed.cli import app
from securefed.models.fedrap import FedRAP
from securefed.privacy import PrivateAggregator
from securefed.training import PrivacyConfig, RunInterrupted, TrainConfig, train

SMALL = ["--model", "fedrap", "--synthetic-users", "60", "--synthetic-items", "400"]
QUALITY_KEYS = ("loss", "val_hr@10", "val_ndcg@10", "test_hr@10", "test_ndcg@10", "test_full_hr@10")
runner = CliRunner()


def _small(**kw) -> TrainConfig:
    base = dict(model="fedrap", synthetic_users=60, synthetic_items=400, rounds=5)
    base.update(kw)
    return TrainConfig(**base)


def _quality(metrics: list[dict]) -> list[tuple]:
    return [tuple(m[k] for k in QUALITY_KEYS) for m in metrics]


def _rounds_logged(run) -> list[int]:
    return [json.loads(x)["round"] for x in (run / runs.METRICS_FILE).read_text().splitlines()]


def _interrupt_at(n: int):
    def progress(record):
        if record.round == n:
            raise KeyboardInterrupt

    return progress


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    return train(_small(), out=tmp_path_factory.mktemp("full") / "run")


def test_interrupt_between_rounds_checkpoints_and_resumes_to_the_same_metrics(
    tmp_path, uninterrupted
):
    run = tmp_path / "cut"
    # The default checkpoint every 10 rounds would leave nothing to resume from at round 3.
    with pytest.raises(RunInterrupted) as caught:
        train(_small(), out=run, progress=_interrupt_at(3))
    exc = caught.value
    assert isinstance(exc, KeyboardInterrupt)
    assert (exc.rounds_kept, exc.interrupted_round, exc.checkpoint_written) == (3, None, True)
    assert str(run) in str(exc) and "continues from round 4" in str(exc)
    assert runs.load_checkpoint(run)["round"] == 3 and _rounds_logged(run) == [1, 2, 3]
    resumed = train(resume=run)
    assert _quality(resumed.metrics) == _quality(uninterrupted.metrics)
    assert _rounds_logged(run) == [1, 2, 3, 4, 5]


def test_resume_runs_only_the_rounds_after_the_interrupt(tmp_path):
    run = tmp_path / "cut"
    with pytest.raises(RunInterrupted):
        train(_small(rounds=4), out=run, progress=_interrupt_at(2))
    seen = []
    train(resume=run, progress=seen.append)
    assert [(r.round, r.rounds_planned) for r in seen] == [(3, 4), (4, 4)]


def test_interrupt_inside_a_round_writes_no_part_of_it(tmp_path, monkeypatch):
    run = tmp_path / "cut"
    original = FedRAP.end_round

    def interrupted_end_round(self, round_index):
        original(self, round_index)  # the round's model step is done, nothing logged yet
        if round_index == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(FedRAP, "end_round", interrupted_end_round)
    with pytest.raises(RunInterrupted) as caught:
        train(_small(checkpoint_every=2), out=run)
    exc = caught.value
    assert (exc.rounds_kept, exc.interrupted_round, exc.checkpoint_written) == (2, 3, False)
    assert "during round 3 of 5" in str(exc) and "continues from round 3" in str(exc)
    # The checkpoint still holds round 2 (not the half-finished round 3), as does the log.
    assert runs.load_checkpoint(run)["round"] == 2 and _rounds_logged(run) == [1, 2]


def test_interrupt_with_nothing_new_since_the_checkpoint_rewrites_nothing(tmp_path):
    run = tmp_path / "cut"
    with pytest.raises(RunInterrupted) as caught:
        train(_small(checkpoint_every=2), out=run, progress=_interrupt_at(2))
    assert caught.value.rounds_kept == 2 and not caught.value.checkpoint_written


def test_interrupted_dp_run_keeps_checkpoint_metrics_and_ledger_in_step(tmp_path):
    cfg = TrainConfig(
        model="fedals",
        synthetic_users=60,
        synthetic_items=400,
        rounds=5,
        privacy=PrivacyConfig(noise_multiplier=2.0),
    )
    run = tmp_path / "dp"
    with pytest.raises(RunInterrupted):
        train(cfg, out=run, progress=_interrupt_at(3))
    ckpt = runs.load_checkpoint(run)
    ledger = json.loads((run / runs.LEDGER_FILE).read_text())["events"]
    assert ckpt["round"] == 3 and _rounds_logged(run) == [1, 2, 3] and len(ledger) == 3
    resumed = train(resume=run)
    # Nothing was re-released: the checkpoint held every released round.
    assert len(json.loads((run / runs.LEDGER_FILE).read_text())["events"]) == 5
    assert resumed.summary["releases"] == 5


def test_dp_run_interrupted_after_a_release_counts_the_re_release(tmp_path, monkeypatch):
    cfg = TrainConfig(
        model="fedals",
        synthetic_users=60,
        synthetic_items=400,
        rounds=4,
        checkpoint_every=2,
        privacy=PrivacyConfig(noise_multiplier=2.0),
    )
    run = tmp_path / "dp"
    original = PrivateAggregator.__call__

    def interrupted_after_release(self, updates, round_index):
        out = original(self, updates, round_index)
        if round_index == 2:
            raise KeyboardInterrupt  # round 3 was released, its model step never ran
        return out

    monkeypatch.setattr(PrivateAggregator, "__call__", interrupted_after_release)
    with pytest.raises(RunInterrupted) as caught:
        train(cfg, out=run)
    assert "released and counted again" in str(caught.value)
    assert runs.load_checkpoint(run)["round"] == 2
    assert len(json.loads((run / runs.LEDGER_FILE).read_text())["events"]) == 3
    monkeypatch.setattr(PrivateAggregator, "__call__", original)
    resumed = train(resume=run)
    # Round 3 was released twice and is counted twice (docs/privacy.md, "Resume").
    assert resumed.summary["releases"] == 5
    assert len(json.loads((run / runs.LEDGER_FILE).read_text())["events"]) == 5


def _sigint_in_round(monkeypatch, round_index: int, times: int) -> None:
    """A real SIGINT to this process during ``round_index`` (0-based), ``times`` times."""
    original = FedRAP.end_round

    def end_round(self, r):
        original(self, r)
        if r == round_index:
            for _ in range(times):
                os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(FedRAP, "end_round", end_round)


def test_cli_ctrl_c_finishes_the_round_exits_130_and_resumes(tmp_path, monkeypatch, uninterrupted):
    run = tmp_path / "cli"
    _sigint_in_round(monkeypatch, 1, times=1)
    before = signal.getsignal(signal.SIGINT)
    res = runner.invoke(app, ["train", *SMALL, "--rounds", "5", "--out", str(run)])
    assert res.exit_code == 130, res.output
    assert signal.getsignal(signal.SIGINT) is before  # the CLI's handler is gone again
    assert "RUN_DIR" not in res.output
    assert f"--resume {run}" in res.output.replace("\n", "")
    assert "after round 2 of 5 (checkpoint written)" in res.output
    assert "continues from round 3" in res.output
    assert runs.load_checkpoint(run)["round"] == 2
    monkeypatch.undo()
    resumed = runner.invoke(app, ["train", "--resume", str(run)])
    assert resumed.exit_code == 0, resumed.output
    assert "resuming" in resumed.output and "round 3/5" in resumed.output
    assert "round 1/5" not in resumed.output
    lines = [json.loads(x) for x in (run / runs.METRICS_FILE).read_text().splitlines()]
    assert _quality(lines) == _quality(uninterrupted.metrics)


def test_cli_second_ctrl_c_stops_at_once(tmp_path, monkeypatch):
    run = tmp_path / "cli"
    _sigint_in_round(monkeypatch, 1, times=2)
    res = runner.invoke(app, ["train", *SMALL, "--rounds", "5", "--out", str(run)])
    assert res.exit_code == 130, res.output
    assert "during round 2 of 5" in res.output and "continues from round 1" in res.output
    assert not (run / runs.CHECKPOINT_FILE).exists() and _rounds_logged(run) == [1]


def test_other_commands_exit_130_on_ctrl_c(monkeypatch):
    import securefed.privacy

    def interrupted(**kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(securefed.privacy, "account", interrupted)
    res = runner.invoke(app, ["account", "--epsilon", "2"])
    assert res.exit_code == 130 and "interrupted" in res.output
