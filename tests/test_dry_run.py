"""`securefed train --dry-run` / `securefed.training.plan_run`: the run a config would make,
settled on the data, with nothing trained or written."""

from __future__ import annotations

import json
import tomllib

import pytest
from typer.testing import CliRunner

from securefed import runs
from securefed.cli import app
from securefed.privacy import account
from securefed.training import PrivacyConfig, TrainConfig, plan_run, train

runner = CliRunner()


def _cfg(**kw) -> TrainConfig:
    base = dict(synthetic_users=300, synthetic_items=400, privacy=PrivacyConfig(epsilon=2.0))
    base.update(kw)
    return TrainConfig(**base)


def test_the_plan_is_what_the_run_records(tmp_path, monkeypatch):
    # The private fedals settles its mode on the data; the plan's config is what the run
    # writes into config.toml, and its noise the noise the run's summary reports.
    monkeypatch.chdir(tmp_path)
    cfg = _cfg()
    plan = plan_run(cfg)
    assert list(tmp_path.iterdir()) == []  # nothing written
    assert plan.notes and "private fedals" in plan.notes[0]
    assert plan.data["users"] == 300 and plan.privacy["target_epsilon"] == 2.0
    res = train(cfg, out=tmp_path / "run")
    recorded = tomllib.loads((tmp_path / "run" / runs.CONFIG_FILE).read_text())
    assert recorded == tomllib.loads(runs.dumps_toml(plan.config.to_dict()))
    assert res.summary["noise_multiplier"] == plan.privacy["noise_multiplier"]
    assert "epsilon" not in plan.privacy  # nothing spent yet


def test_a_secagg_plan_shows_the_distributed_noise_account_does_not(tmp_path):
    cfg = _cfg(client_fraction=0.1, privacy=PrivacyConfig(epsilon=2.0, secagg=True))
    plan = plan_run(cfg)
    central = account(epsilon=2.0, rounds=plan.config.rounds, client_fraction=0.1, users=300)
    assert plan.privacy["placement"] == "distributed"
    # Larger than `securefed account`'s central Gaussian (1.23 against 1.02 for these 3
    # rounds at rate 0.1; several times larger over many rounds at low epsilon).
    assert plan.privacy["noise_multiplier"] > 1.1 * central["noise_multiplier"]


def test_cli_dry_run_writes_nothing_and_prints_the_plan(tmp_path):
    out = tmp_path / "run"
    args = ["train", "--synthetic-users", "300", "--synthetic-items", "400", "--out", str(out)]
    res = runner.invoke(app, [*args, "--epsilon", "2", "--dry-run"])
    assert res.exit_code == 0, res.output
    assert "privacy plan: user-level DP, epsilon 2 at delta 1e-05" in res.output
    assert "noise multiplier" in res.output and "estimate:" in res.output
    assert "no run directory written" in res.output and not out.exists()
    res = runner.invoke(app, [*args, "--dry-run"])
    assert res.exit_code == 0 and "privacy: no DP" in res.output, res.output
    res = runner.invoke(app, [*args, "--dry-run", "--clients-per-round", "301"])
    assert res.exit_code == 2 and "exceeds the 300 users" in res.output, res.output
    assert not out.exists()
    res = runner.invoke(app, ["train", "--resume", str(tmp_path / "x"), "--dry-run"])
    assert res.exit_code == 2 and "--dry-run" in res.output, res.output


def test_the_plan_says_what_the_run_summary_would(tmp_path):
    # Found in review: an epsilon given beside a noise multiplier is a cap, not what the noise
    # was calibrated for; the caveats the run's summary prints are the plan's too.
    args = ["train", "--synthetic-users", "300", "--synthetic-items", "400", "--dry-run"]
    res = runner.invoke(app, [*args, "--epsilon", "4.5", "--noise-multiplier", "1.5"])
    assert res.exit_code == 0, res.output
    assert "noise multiplier 1.5 as given" in res.output and "(the run stops early)" in res.output
    ran = train(
        _cfg(privacy=PrivacyConfig(epsilon=4.5, noise_multiplier=1.5)), out=tmp_path / "cap"
    )
    assert ran.summary["rounds"] < ran.summary["rounds_planned"]  # it did stop early
    res = runner.invoke(
        app, [*args, "--epsilon", "2", "--noise", "distributed", "--replay-from-seed"]
    )
    assert "noise placement: continuous Gaussian shares without secure aggregation" in res.output
    assert "REPLAY RUN" in res.output
    # The plan has spent nothing: its warning said "Epsilon 0 holds only against an observer
    # who does not know the seed" (found in a walkthrough).
    flat = " ".join(res.output.split())
    assert "The epsilon it spends holds only against" in flat and "Epsilon 0 " not in flat
    res = runner.invoke(app, [*args, "--model", "ials"])
    assert res.exit_code == 0 and "a centralized reference" in res.output, res.output
    run = tmp_path / "cap"
    res = runner.invoke(app, [*args, "--out", str(run)])
    assert res.exit_code == 2 and "already holds a run" in res.output, res.output


def test_a_model_run_without_its_private_mode_is_told_before_it_starts(tmp_path, monkeypatch):
    # FedRAP and FedRecGEL at a target epsilon without --private-mode: the plan (and the
    # run's start) names what DP alone measured and the mode's flags; not with the mode's
    # prior, not without a target epsilon, not with noise inside secure aggregation (the
    # prior's release needs central noise), not for fedals (its mode needs no flag).
    from securefed.models.registry import get_spec

    monkeypatch.chdir(tmp_path)
    eps = PrivacyConfig(epsilon=2.0)
    flags = get_spec("fedrap").private_mode.flags()
    told = [
        _cfg(model="fedrap", rounds=2),
        _cfg(model="fedrecgel", rounds=2),
        # Where --private-mode is taken: noise placed "distributed" without secure
        # aggregation, or central noise with it.
        _cfg(model="fedrap", rounds=2, privacy=PrivacyConfig(epsilon=2.0, noise="distributed")),
        _cfg(
            model="fedrap",
            rounds=2,
            privacy=PrivacyConfig(epsilon=2.0, secagg=True, noise="central"),
        ),
    ]
    for cfg in told:
        notes = plan_run(cfg).notes
        assert [n for n in notes if "below DP-MostPop" in n and flags in n], (cfg, notes)
    quiet = [
        _cfg(model="fedrap", rounds=2, privacy=PrivacyConfig(epsilon=2.0, prior_share=0.9)),
        _cfg(model="fedrap", rounds=2, privacy=PrivacyConfig(noise_multiplier=1.0)),
        _cfg(model="fedrap", rounds=2, privacy=PrivacyConfig(epsilon=2.0, secagg=True)),
        _cfg(model="fedrap", rounds=2, privacy=PrivacyConfig(epsilon=2.0, noise_multiplier=5.0)),
        _cfg(model="fedals", privacy=eps),
    ]
    for cfg in quiet:
        assert not [n for n in plan_run(cfg).notes if "below DP-MostPop" in n], cfg
    seen = []
    train(_cfg(model="fedrap", rounds=1), out=tmp_path / "run", on_start=seen.append)
    assert any("--private-mode" in n for n in seen[0].notes)


def test_a_sampled_plan_and_summary_give_the_epsilon_against_the_server(tmp_path, monkeypatch):
    # Amplification by sampling holds only against those who do not learn the cohorts: the
    # plan gives what every round released costs against whoever learns them (the
    # run's own epsilon_unamplified once all are released, central noise), and the summary's
    # privacy line says both numbers, the server's first where the noise is placed against
    # it (inside secure aggregation).
    monkeypatch.chdir(tmp_path)
    cfg = _cfg(
        model="fedrap",
        rounds=3,
        client_fraction=0.5,
        privacy=PrivacyConfig(epsilon=2.0, prior_share=0.5),
    )
    planned = plan_run(cfg).privacy["epsilon_unamplified_planned"]
    res = train(cfg, out=tmp_path / "run")
    assert res.summary["releases"] == 3 + 1  # the prior's release and every round
    assert planned == pytest.approx(res.summary["epsilon_unamplified"], rel=1e-9)
    assert planned > res.summary["epsilon"]
    assert "epsilon_unamplified_planned" not in plan_run(_cfg(model="fedrap", rounds=3)).privacy
    args = ["train", "--synthetic-users", "100", "--synthetic-items", "200", "--epsilon", "2"]
    args += ["--client-fraction", "0.5"]
    cases = [
        ([], "amplified", "against an observer who learns the cohorts"),
        (["--secagg"], "against the server", "against the server that samples the cohorts"),
    ]
    for extra, first, whom in cases:
        out = runner.invoke(app, [*args, *extra, "--out", str(tmp_path / f"cli{len(extra)}")])
        assert out.exit_code == 0, out.output
        line = " ".join(out.output.split("privacy: ", 1)[1].split())
        assert line.index(first) < 20 and whom in line.split("(")[0], line
        s = json.loads((tmp_path / f"cli{len(extra)}" / runs.SUMMARY_FILE).read_text())
        for eps in (s["epsilon"], s["epsilon_unamplified"]):
            assert f"epsilon {eps:.4g}" in line
        dry = " ".join(runner.invoke(app, [*args, *extra, "--dry-run"]).output.split())
        assert f"{whom.replace(' the cohorts', ' them') if extra else whom}: epsilon" in dry, dry
    # Central noise: the server is trusted (it sees the sums), so no line calls the number
    # the server's.
    assert "against the server" not in " ".join(
        runner.invoke(app, [*args, "--out", str(tmp_path / "again")]).output.split()
    )
    # A cohort of the expected size too small for the noise shares (its rounds would abort,
    # as the run's would): the plan stands without the number (found in review).
    tiny = _cfg(client_fraction=0.02, privacy=PrivacyConfig(epsilon=2.0, secagg=True))
    assert "epsilon_unamplified_planned" not in plan_run(tiny).privacy


def test_a_private_fedals_plan_says_what_another_number_of_rounds_changes(tmp_path, monkeypatch):
    # The private mode was built for its default rounds (a count round and two co-occurrence
    # rounds); a --rounds of the user's runs, and its note says what it changes.
    monkeypatch.chdir(tmp_path)
    eps = PrivacyConfig(epsilon=8.0)
    default = " ".join(plan_run(_cfg(privacy=eps)).notes[0].split())
    assert "built and measured" not in default and "no co-occurrence round" not in default
    ten = " ".join(plan_run(_cfg(privacy=eps, rounds=10)).notes[0].split())
    assert "10 rounds: the mode was built and measured at 3" in ten and "here 1/10" in ten
    one = " ".join(plan_run(_cfg(privacy=eps, rounds=1)).notes[0].split())
    assert "1 round: no co-occurrence round, the model is the count" in one
