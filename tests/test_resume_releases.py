"""Resume never releases a round the ledger does not count.

The attack these tests stand for (issue 15, finding 4): a run that crashed between
checkpoints and was resumed redrew fresh noise for the re-run rounds: 8 releases, 6 ledger
events, epsilon reported under the target. securefed counts every release again
(docs/privacy.md, "Resume"): the ledger file, written ahead of every release, holds the rounds
released after the last checkpoint, and the resumed run appends its re-releases to it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from protocols.dp import PrivacyEvent, PrivacyLedger
from securefed import runs
from securefed.cli import app
from securefed.config import load_config_file
from securefed.errors import ConfigError, IntegrityError
from securefed.privacy import PrivateAggregator
from securefed.training import PrivacyConfig, TrainConfig, train

ROOT = Path(__file__).resolve().parents[1]
SMALL = dict(model="fedals", synthetic_users=60, synthetic_items=400, checkpoint_every=2)


class Stop(Exception):
    pass


@pytest.fixture
def releases(monkeypatch):
    """Every event a release was made under (the aggregator returned an aggregate)."""
    made: list[PrivacyEvent] = []
    original = PrivateAggregator.__call__

    def spy(self, updates, round_index):
        before = len(self.ledger)
        out = original(self, updates, round_index)
        if out is not None:
            assert len(self.ledger) == before + 1
            made.append([e for e in self.ledger.events if e.round == round_index][-1])
        return out

    monkeypatch.setattr(PrivateAggregator, "__call__", spy)
    return made


def _stop_after(round_no: int):
    """A progress callback that stops the run (raises Stop) once ``round_no`` is reported."""

    def progress(record):
        if record.round == round_no:
            raise Stop

    return progress


def _ledger(run_dir) -> dict:
    return json.loads((run_dir / runs.LEDGER_FILE).read_text())


def _epsilon_of(events, cfg: TrainConfig) -> float:
    delta = cfg.privacy.delta
    return PrivacyLedger(sorted(events, key=lambda e: e.round)).epsilon(delta, "prv")


@pytest.mark.slow
def test_exception_after_release_then_resume_counts_every_release(tmp_path, releases):
    cfg = TrainConfig(rounds=5, privacy=PrivacyConfig(noise_multiplier=2.0), **SMALL)
    run = tmp_path / "cut"

    def crash_after_round_3(record):
        if record.round == 3:  # released round 3; the last checkpoint holds round 2
            raise Stop

    with pytest.raises(Stop):
        train(cfg, out=run, progress=crash_after_round_3)
    assert len(releases) == 3 and len(_ledger(run)["events"]) == 3
    resumed = train(resume=run)
    # Rounds 3, 4, 5 were (re-)run: round 3 was released twice, with fresh noise each time.
    assert [e.round for e in releases] == [0, 1, 2, 2, 3, 4]
    events = _ledger(run)["events"]
    assert len(events) == len(releases) == resumed.summary["releases"] == 6
    assert resumed.summary["rounds"] == 5
    made = _epsilon_of(releases, cfg)
    assert resumed.summary["epsilon"] >= made - 1e-9
    # ... and strictly more than an uninterrupted run's five releases.
    assert resumed.summary["epsilon"] > _epsilon_of(releases[:5], cfg)


def test_resume_under_a_budget_refits_sigma_for_the_rounds_left(tmp_path, releases, monkeypatch):
    cfg = TrainConfig(rounds=4, privacy=PrivacyConfig(epsilon=2.0), **SMALL)
    run = tmp_path / "cut"

    def crash_after_round_3(record):
        if record.round == 3:
            raise Stop

    with pytest.raises(Stop):
        train(cfg, out=run, progress=crash_after_round_3)
    planned = releases[0].noise_multiplier
    import securefed.prior
    import securefed.privacy

    entries: list[int] = []
    for module in (securefed.privacy, securefed.prior):
        original = module.gaussian_epsilon

        def spy(history, *, _original=original, **kw):
            entries.append(len(history))
            return _original(history, **kw)

        monkeypatch.setattr(module, "gaussian_epsilon", spy)
    resumed = train(resume=run)
    # The ledger's releases are grouped by (sigma, q) as its own epsilon is: PRV's cost grows
    # with the entries (ungrouped, a 100-round resume took minutes; found in review).
    assert entries and max(entries) <= 2
    # The calibrated noise covers 4 releases; the crash spent 3 and the checkpoint kept 2, so
    # the 2 rounds left (round 3 again, and 4) get a larger sigma that fits beside the 3
    # releases the ledger holds: every round runs, every release counted, within the target.
    assert [e.round for e in releases] == [0, 1, 2, 2, 3] and resumed.summary["rounds"] == 4
    assert not resumed.summary.get("stopped")
    assert len(_ledger(run)["events"]) == 5
    refit = releases[-1].noise_multiplier
    assert releases[-2].noise_multiplier == refit > planned
    assert resumed.summary["noise_multipliers"] == [planned, refit]
    assert 0.99 * 2.0 <= _epsilon_of(releases, cfg) <= resumed.summary["epsilon"] <= 2.0


def _extend(run: Path, **settings) -> None:
    """Edit a run's config.toml as a user who extends a finished run does."""
    text = (run / runs.CONFIG_FILE).read_text()
    for key, value in settings.items():
        lines = [ln for ln in text.splitlines() if ln.startswith(f"{key} = ")]
        assert len(lines) == 1, key
        text = text.replace(lines[0], f"{key} = {value}")
    (run / runs.CONFIG_FILE).write_text(text)


def test_extending_a_finished_dp_run_spends_the_raised_budget(tmp_path, releases):
    """2 rounds at epsilon 2, then config.toml raised to 4 rounds at 4: the 2 rounds left get
    the sigma that fits beside the ledger (it used to keep the fresh 4-round plan's sigma and
    spend 3.5 of the 4). Raising only the rounds stops at once, and the summary names the
    sigma the releases used, not the unused one of the new plan."""
    cfg = TrainConfig(
        rounds=2, privacy=PrivacyConfig(epsilon=2.0), keep_private_state=True, **SMALL
    )
    train(cfg, out=tmp_path / "a")
    first = releases[0].noise_multiplier
    from securefed.training import RunFinished

    with pytest.raises(RunFinished, match="raise rounds and epsilon in its config.toml"):
        train(resume=tmp_path / "a")  # the message says how to extend a kept run
    fixed = TrainConfig(
        rounds=1,
        privacy=PrivacyConfig(noise_multiplier=2.0),
        keep_private_state=True,
        **SMALL,
    )
    train(fixed, out=tmp_path / "fixed")
    with pytest.raises(RunFinished, match=r"to train it longer raise rounds in its"):
        train(resume=tmp_path / "fixed")  # no epsilon to raise: a fixed sigma
    del releases[:]
    for name in ("rounds", "eps"):
        (tmp_path / name).mkdir()
        for f in (tmp_path / "a").iterdir():
            (tmp_path / name / f.name).write_bytes(f.read_bytes())
    _extend(tmp_path / "rounds", rounds=4)
    only_rounds = train(resume=tmp_path / "rounds").summary
    assert only_rounds["releases"] == 2 and "would raise epsilon" in only_rounds["stopped"]
    assert only_rounds["noise_multipliers"] == [first]
    _extend(tmp_path / "eps", rounds=4, epsilon=4.0)
    raised = train(resume=tmp_path / "eps").summary
    assert raised["releases"] == 4 and not raised.get("stopped")
    second = releases[-1].noise_multiplier
    assert raised["noise_multipliers"] == [first, second] and second < first
    assert 0.99 * 4.0 <= raised["epsilon"] <= 4.0


_KILLER = textwrap.dedent(
    """
    import os, signal, sys
    from securefed.training import PrivacyConfig, TrainConfig, train

    def observer(view):
        # Called after the round's aggregate was released and applied, before its checkpoint.
        if view.round_index == int(sys.argv[2]):
            os.kill(os.getpid(), signal.SIGKILL)

    privacy = PrivacyConfig(noise_multiplier=2.0, secagg=True)
    cfg = TrainConfig(model="fedals", synthetic_users=60, synthetic_items=400, rounds=5,
                      checkpoint_every=2, privacy=privacy)
    train(cfg, out=sys.argv[1], observer=observer)
    """
)


@pytest.mark.slow
def test_kill_9_after_a_release_then_resume_counts_every_release(tmp_path, releases):
    run = tmp_path / "killed"
    script = tmp_path / "killer.py"
    script.write_text(_KILLER)
    proc = subprocess.run(
        [sys.executable, str(script), str(run), "2"],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        timeout=600,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
    # Rounds 0, 1, 2 were released by the killed process; the checkpoint holds round 2.
    killed = 3
    assert len(_ledger(run)["events"]) == killed
    assert runs.load_checkpoint(run)["round"] == 2
    resumed = train(resume=run)
    assert [e.round for e in releases] == [2, 3, 4]
    events = _ledger(run)["events"]
    assert len(events) == killed + len(releases) == resumed.summary["releases"] == 6
    every = [PrivacyEvent.from_dict(e) for e in events]
    assert resumed.summary["epsilon"] >= PrivacyLedger(every).epsilon(1e-5, "rdp") - 1e-9


def test_resume_refuses_a_ledger_file_that_lost_events(tmp_path):
    cfg = TrainConfig(rounds=2, privacy=PrivacyConfig(noise_multiplier=2.0), **SMALL)
    run = tmp_path / "r"

    def stop_at_2(record):
        if record.round == 2:
            raise Stop

    with pytest.raises(Stop):
        train(cfg, out=run, progress=stop_at_2)
    ledger = _ledger(run)
    (run / runs.LEDGER_FILE).write_text(json.dumps({**ledger, "events": ledger["events"][:1]}))
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    with pytest.raises(IntegrityError, match="fewer privacy events than the checkpoint"):
        train(resume=run)
    (run / runs.LEDGER_FILE).unlink()
    with pytest.raises(IntegrityError, match="missing"):
        train(resume=run)
    after = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    before.pop(runs.LEDGER_FILE)
    assert after == before  # nothing half-written


@pytest.mark.parametrize("replay", [True, False], ids=["replay-then-os", "os-then-replay"])
def test_resume_refuses_to_change_where_the_noise_comes_from(tmp_path, replay):
    """A replay run's config.toml edited to ``replay = false`` before a resume printed OS
    randomness (and claimed amplification) for releases its seed regenerates (found in
    review); the reverse labels OS releases replayed. Either way the resume is refused before
    anything is written, and resumes once the setting is back."""
    cfg = TrainConfig(rounds=3, privacy=PrivacyConfig(noise_multiplier=2.0, replay=replay), **SMALL)
    run = tmp_path / "r"
    with pytest.raises(Stop):
        train(cfg, out=run, progress=_stop_after(2))
    assert _ledger(run)["summary"]["randomness"] == ("replay" if replay else "os")
    config = run / runs.CONFIG_FILE
    text = config.read_text()
    flipped = text.replace(f"replay = {str(replay).lower()}", f"replay = {str(not replay).lower()}")
    assert flipped != text
    config.write_text(flipped)
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    with pytest.raises(ConfigError, match="release\\(s\\) so far drew their noise") as err:
        train(resume=run)
    assert f"replay = {str(replay).lower()} under [privacy]" in str(err.value)
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before
    config.write_text(text)
    resumed = train(resume=run)
    assert resumed.summary["randomness"] == ("replay" if replay else "os")
    assert resumed.summary["rounds"] == 3


@pytest.mark.parametrize(
    ("model", "line", "edited", "restore"),
    [
        ("fedals", "delta = 1e-05", "delta = 1e-07", "delta = 1e-05"),
        ("fedals", "secagg = false", "secagg = true", "secagg = false"),
        (
            "fedrap",
            'privacy_unit = "user"',
            'privacy_unit = "interaction"',
            'privacy_unit = "user"',
        ),
        (
            "fedals",
            "noise_multiplier = 2.0",
            'noise_multiplier = 2.0\nnoise = "distributed"',
            'noise = "central"',
        ),
    ],
    ids=["delta", "secagg", "unit", "placement"],
)
def test_resume_refuses_to_change_the_privacy_design(tmp_path, model, line, edited, restore):
    """A ``delta`` tightened in config.toml before a resume re-accounted the ledger above its
    own target (2.49 for 2) and stopped on the budget without a word why; ``secagg`` switched
    on mid-run moved every release to another accountant (found in a walkthrough). The unit,
    delta, secure aggregation and the noise's placement are kept: refused in one line, before
    anything is written, naming the setting to restore; the run resumes once it is back."""
    privacy = PrivacyConfig(noise_multiplier=2.0)
    cfg = TrainConfig(rounds=3, privacy=privacy, **{**SMALL, "model": model})
    run = tmp_path / "r"
    with pytest.raises(Stop):
        train(cfg, out=run, progress=_stop_after(2))
    config = run / runs.CONFIG_FILE
    text = config.read_text()
    assert text.count(line) == 1
    config.write_text(text.replace(line, edited))
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    with pytest.raises(ConfigError, match="one run's privacy statement covers one design") as err:
        train(resume=run)
    assert f"set {restore} under [privacy]" in str(err.value) and "\n" not in str(err.value)
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before
    res = CliRunner().invoke(app, ["train", "--resume", str(run)])
    assert res.exit_code == 2 and "covers one design" in res.output
    config.write_text(text)
    assert train(resume=run).summary["rounds"] == 3


@pytest.mark.parametrize("setting", ["epsilon", "noise_multiplier"])
def test_resume_refuses_a_dp_run_whose_config_drops_dp(tmp_path, setting):
    """A DP run's config.toml edited to drop its epsilon resumed without DP (found in a
    walkthrough): its remaining rounds released updates without clipping or noise, its
    model.pt was the non-private model, and the ledger still claimed an epsilon. It is
    refused before anything is written, and resumes once the setting is back."""
    value = 4.0 if setting == "epsilon" else 2.0
    privacy = PrivacyConfig(**{setting: value})  # type: ignore[arg-type]
    cfg = TrainConfig(rounds=3, privacy=privacy, **SMALL)
    run = tmp_path / "r"
    with pytest.raises(Stop):
        train(cfg, out=run, progress=_stop_after(2))
    config = run / runs.CONFIG_FILE
    text = config.read_text()
    dropped = (
        "\n".join(line for line in text.splitlines() if not line.startswith(f"{setting} =")) + "\n"
    )
    assert dropped != text
    config.write_text(dropped)
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    with pytest.raises(ConfigError, match="differentially private release\\(s\\)") as err:
        train(resume=run)
    assert "now asks for no DP" in str(err.value) and "\n" not in str(err.value)
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before
    res = CliRunner().invoke(app, ["train", "--resume", str(run)])
    assert res.exit_code == 2 and "now asks for no DP" in res.output
    config.write_text(text)
    resumed = train(resume=run)
    assert resumed.summary["rounds"] == 3 and resumed.summary["epsilon"] is not None


def test_audit_of_a_run_compares_the_columns_and_evaluation_negatives(tmp_path):
    """A table's column names and the evaluation's negatives landed after ``audit --run``'s
    check: an edited ``[columns]`` table would re-simulate the run on other data, an edited
    ``eval_negatives`` another protocol; both are compared with what the summary records."""
    from attacks.audit import AuditConfig, audit

    data = tmp_path / "t.csv"
    rows = [(u, (u * 7 + k * 3) % 120) for u in range(40) for k in range(12)]
    data.write_text("cust,sku,when\n" + "".join(f"{u},{i},{n}\n" for n, (u, i) in enumerate(rows)))
    cfg = TrainConfig(
        model="fedals",
        dataset=str(data),
        columns={"user": "cust", "item": "sku", "timestamp": "when"},
        eval_negatives=49,
        rounds=2,
        privacy=PrivacyConfig(epsilon=2.0, replay=True),
    )
    run = tmp_path / "r"
    summary = train(cfg, out=run).summary
    assert summary["columns"] == {"user": "cust", "item": "sku", "timestamp": "when"}
    assert summary["eval_negatives"] == 49
    config = run / runs.CONFIG_FILE
    text = config.read_text()
    out = tmp_path / "audit"
    for edited, said in [
        (text.replace("eval_negatives = 49", "eval_negatives = 30"), "evaluation negatives 30"),
        (text.replace('timestamp = "when"\n', ""), "columns"),
    ]:
        assert edited != text
        config.write_text(edited)
        with pytest.raises(ConfigError, match="no longer describes the run") as err:
            audit(AuditConfig(run=str(run), attacks=("differencing",), canaries=0), out=out)
        assert said in str(err.value)
        assert not out.exists()


def test_audit_of_a_run_refuses_a_config_that_is_not_the_run(tmp_path):
    """``audit --run`` re-simulates a replay run from its config.toml: a config edited after
    the run (epsilon 2 to 8) was audited as the epsilon-8 run, audit.json claiming 7.99 for a
    directory whose ledger says about 2 (found in a walkthrough); a run resumed after its
    round 3 released that round twice with refit noise, which no re-simulation reproduces.
    Both are refused in one line before anything trains."""
    from attacks.audit import AuditConfig, audit

    cfg = TrainConfig(
        rounds=3,
        privacy=PrivacyConfig(epsilon=2.0, replay=True),
        **{**SMALL, "checkpoint_every": 2},
    )
    run = tmp_path / "r"
    train(cfg, out=run)
    config = run / runs.CONFIG_FILE
    text = config.read_text()
    config.write_text(text.replace("epsilon = 2.0", "epsilon = 8.0"))
    out = tmp_path / "audit"
    with pytest.raises(ConfigError, match="no longer describes the run") as err:
        audit(AuditConfig(run=str(run), attacks=("differencing",), canaries=0), out=out)
    assert "target epsilon 8.0 in config.toml, 2.0 when it ran" in str(err.value)
    assert not out.exists()

    config.write_text(text)
    # Where the noise came from, and a noise multiplier given in place of the epsilon (found
    # in review: both edits passed). The OS run is refused as OS anyway; its source first.
    os_run = tmp_path / "os"
    train(dataclasses.replace(cfg, privacy=PrivacyConfig(epsilon=2.0)), out=os_run)
    os_config = os_run / runs.CONFIG_FILE
    os_config.write_text(os_config.read_text().replace("replay = false", "replay = true"))
    with pytest.raises(ConfigError, match="noise source replay in config.toml, os when it ran"):
        audit(AuditConfig(run=str(os_run), attacks=("differencing",), canaries=0), out=out)
    sigma_run = tmp_path / "sigma"
    train(
        dataclasses.replace(cfg, privacy=PrivacyConfig(noise_multiplier=2.0, replay=True)),
        out=sigma_run,
    )
    sigma_config = sigma_run / runs.CONFIG_FILE
    sigma_config.write_text(
        sigma_config.read_text().replace("noise_multiplier = 2.0", "noise_multiplier = 0.3")
    )
    with pytest.raises(ConfigError, match="noise multiplier 0.3 in config.toml, 2.0 when it ran"):
        audit(AuditConfig(run=str(sigma_run), attacks=("differencing",), canaries=0), out=out)
    assert not out.exists()

    resumed = tmp_path / "resumed"
    longer = dataclasses.replace(cfg, rounds=4)
    with pytest.raises(Stop):
        train(longer, out=resumed, progress=_stop_after(3))  # round 3 released, checkpoint at 2
    assert train(resume=resumed).summary["releases"] == 5
    with pytest.raises(ConfigError, match="released 1 round\\(s\\) a second time"):
        audit(AuditConfig(run=str(resumed), attacks=("differencing",), canaries=0), out=out)
    assert not out.exists()
    # The popularity prior's release sits beside round 1's: no second release (the report's
    # dp cells of FedRAP were refused for it).
    from attacks.audit import _check_replayable

    prior = TrainConfig(
        model="fedrap",
        synthetic_users=60,
        synthetic_items=400,
        rounds=2,
        client_fraction=0.5,
        privacy=PrivacyConfig(epsilon=2.0, replay=True, prior_share=0.9),
    )
    with_prior = train(prior, out=tmp_path / "prior")
    assert with_prior.summary["releases"] == 3 and with_prior.summary["released_rounds"] == 2
    _check_replayable(tmp_path / "prior", prior)


def test_resume_refuses_a_config_that_is_not_the_runs(tmp_path):
    """``train(config, resume=run)`` ignored ``config`` silently, where the CLI refuses every
    flag given with --resume (found in a walkthrough): a different config, or another
    ``out``, is refused; the run's own config, or none, resumes."""
    cfg = TrainConfig(rounds=3, privacy=PrivacyConfig(noise_multiplier=2.0), **SMALL)
    run = tmp_path / "r"
    with pytest.raises(Stop):
        train(cfg, out=run, progress=_stop_after(2))
    other = TrainConfig(rounds=3, privacy=PrivacyConfig(epsilon=2.0), **SMALL)
    with pytest.raises(ConfigError, match="the config given differs from it") as err:
        train(other, resume=run)
    assert "privacy epsilon 2.0, the run's None" in str(err.value)
    with pytest.raises(ConfigError, match="DP False, the run's True"):
        train(TrainConfig(rounds=3, **SMALL), resume=run)
    with pytest.raises(ConfigError, match="drop out="):
        train(resume=run, out=tmp_path / "elsewhere")
    # The config it was started with resumes, though config.toml holds it settled on the
    # data (fedals's dimension: None given, 32 recorded; found in review).
    recorded = TrainConfig.from_dict(load_config_file(run / runs.CONFIG_FILE))
    assert cfg.params.dim is None and recorded.params.dim is not None
    assert train(cfg, resume=run, out=run).summary["rounds"] == 3


def test_a_resumed_run_whose_clip_changed_reports_every_clip(tmp_path, capfd):
    """A run resumed after its config.toml changed the clip printed only the new clip, over
    a ledger of releases at both (found in a walkthrough): the summary lists each clip its
    model releases used, in order; a run of one clip lists none."""
    cfg = TrainConfig(rounds=4, privacy=PrivacyConfig(noise_multiplier=2.0, clip=1.0), **SMALL)
    run = tmp_path / "r"
    with pytest.raises(Stop):
        train(cfg, out=run, progress=_stop_after(2))
    config = run / runs.CONFIG_FILE
    config.write_text(config.read_text().replace("clip = 1.0", "clip = 0.5"))
    summary = train(resume=run).summary
    assert summary["clips"] == [1.0, 0.5] and summary["clip"] == 0.5
    import types

    from securefed.cli.common import _print_summary

    _print_summary(types.SimpleNamespace(summary=summary, run_dir=run))
    assert "clips 1, 0.5)" in " ".join(capfd.readouterr().out.split())
    one = train(cfg, out=tmp_path / "one").summary
    assert "clips" not in one


def test_audit_of_an_interaction_level_run_resumed_after_a_release_is_refused(tmp_path):
    """``audit --run`` refused a user-level run that released a round twice from its summary's
    ``releases``, which an interaction-level run's summary lacks: one resumed after its round 3
    made its DP-SGD releases was re-simulated from its seed as if it had released each round
    once (found in review). Its ledger holds round 3's releases twice: refused the same way,
    nothing written; from its summary's DP-SGD steps too when the ledger is gone."""
    from attacks.audit import AuditConfig, ResumedRun, _check_replayable, audit
    from securefed.models.fedrap import FedRAPConfig

    cfg = TrainConfig(
        model="fedrap",
        synthetic_users=40,
        synthetic_items=200,
        rounds=4,
        checkpoint_every=2,
        params=FedRAPConfig(local_epochs=2),  # two DP-SGD releases a round
        privacy=PrivacyConfig(epsilon=8.0, privacy_unit="interaction", replay=True),
    )
    whole = tmp_path / "whole"
    train(cfg, out=whole)
    _check_replayable(whole, cfg)  # released once each: replayable
    run = tmp_path / "resumed"
    with pytest.raises(Stop):
        train(cfg, out=run, progress=_stop_after(3))  # round 3 released, checkpoint at 2
    summary = train(resume=run).summary
    assert summary["privacy_unit"] == "interaction" and "releases" not in summary
    # Round 3 spent twice: the budget stops it before round 4.
    assert summary["released_rounds"] == 3 and summary["dpsgd_steps"] == 8
    out = tmp_path / "audit"
    with pytest.raises(ResumedRun, match="released 1 round\\(s\\) a second time") as refused:
        audit(AuditConfig(run=str(run), attacks=("row-change",), canaries=0), out=out)
    assert "4 DP-SGD releases for round(s) 3, 2 a round" in str(refused.value)
    assert not out.exists()
    res = CliRunner().invoke(app, ["audit", "--run", str(run), "--out", str(out)])
    assert res.exit_code == 2 and "a second time" in res.output, res.output
    assert "Traceback" not in res.output and not out.exists()
    (run / runs.LEDGER_FILE).unlink()
    with pytest.raises(ResumedRun, match="8 DP-SGD releases for 3 rounds of 2 each"):
        _check_replayable(run, cfg)
