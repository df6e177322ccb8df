"""Full ranking of a fixed user sample (``--eval-users``): estimates, intervals, baselines."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from securefed import train
from securefed.baselines import CountScorer, popularity_counts
from securefed.config import TrainConfig
from securefed.errors import ConfigError
from securefed.evaluation import eval_user_sample, evaluate

SMALL = dict(model="fedals", synthetic_users=200, synthetic_items=300, rounds=2)


def test_a_run_ranks_its_user_sample_in_full_and_its_baselines_on_the_same_users(tmp_path):
    res = train(TrainConfig(eval_users=60, **SMALL), out=tmp_path / "r")
    s = res.summary
    assert s["full_eval_users"] == 60 and s["users"] == 200
    for key in ("test_full_hr@10", "test_full_ndcg@10"):
        lo, hi = s[f"{key}_ci95"]
        assert lo <= s[key] <= hi
    users = eval_user_sample(res.split.n_users, 60, seed=0)
    assert users is not None
    # The MostPop baseline's full metrics are over the same 60 users ...
    counts = popularity_counts(res.split)
    same = evaluate(CountScorer(counts), res.split, which="test", full_users=users)
    assert s["baseline_mostpop_test_full_hr@10"] == pytest.approx(same.full_hr)
    # ... while the sampled protocol covers every user, for the run and its baselines.
    everyone = evaluate(CountScorer(counts), res.split, which="test")
    assert s["baseline_mostpop_test_hr@10"] == pytest.approx(everyone.hr)
    records = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert all(r["full_eval_users"] == 60 for r in records if "test_full_hr@10" in r)
    # Without the sample, no interval is recorded and every user is ranked.
    whole = train(TrainConfig(**SMALL), out=tmp_path / "w")
    assert "full_eval_users" not in whole.summary
    assert "test_full_hr@10_ci95" not in whole.summary


@pytest.mark.parametrize("bad", [1, 0, -5])
def test_eval_users_must_be_a_count_of_at_least_two(bad):
    with pytest.raises(ConfigError, match="eval users must be an integer >= 2"):
        TrainConfig(eval_users=bad, **SMALL)


@pytest.mark.parametrize("bad", [True, 2.5, "many"])
def test_eval_users_must_be_a_whole_number(bad):
    with pytest.raises(ConfigError, match=f"eval_users must be a whole number, got {bad!r}"):
        TrainConfig(eval_users=bad, **SMALL)


def test_cli_eval_users_and_full_eval_every(tmp_path):
    from securefed.cli import app

    out = tmp_path / "c"
    result = CliRunner().invoke(
        app,
        [
            "train", "--model", "fedals", "--synthetic-users", "200", "--synthetic-items",
            "300", "--rounds", "2", "--eval-users", "50", "--full-eval-every", "2",
            "--out", str(out),
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "fixed sample of 50 of 200 users" in result.output
    cfg = (out / "config.toml").read_text()
    assert "eval_users = 50" in cfg and "full_eval_every = 2" in cfg
    bad = CliRunner().invoke(app, ["train", "--eval-users", "1", "--out", str(tmp_path / "b")])
    assert bad.exit_code == 2 and "eval users must be an integer >= 2" in bad.output
    assert not (tmp_path / "b").exists()


def test_flower_refuses_eval_users_in_one_line():
    pytest.importorskip("flwr")
    from securefed.config import PrivacyConfig
    from securefed.flower.server import check_config

    cfg = TrainConfig(eval_users=50, privacy=PrivacyConfig(secagg=True), **SMALL)
    with pytest.raises(ConfigError, match="eval_users .* not supported on Flower"):
        check_config(cfg)
    check_config(TrainConfig(privacy=PrivacyConfig(secagg=True), **SMALL))


def test_an_eval_users_sample_of_the_whole_population_is_said_once(tmp_path):
    """Found in a walkthrough: ``--eval-users 5000`` on a 395-user dataset was accepted
    without a word and ranked every user. The population is known only once the data is
    loaded (and a config may be reused across datasets), so it is a note, not a refusal."""
    from securefed.cli import app

    args = ["train", "--model", "fedals", "--synthetic-users", "200", "--synthetic-items"]
    args += ["300", "--rounds", "1"]
    note = "eval_users 5,000 is not below the 200 users of the data: every user is ranked in full"
    for extra in (["--dry-run"], ["--out", str(tmp_path / "r")]):
        res = CliRunner().invoke(app, [*args, "--eval-users", "5000", *extra])
        assert res.exit_code == 0, res.output
        assert res.output.count(note) == 1, res.output
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert "full_eval_users" not in summary  # what the note says: everyone was ranked
    sampled = CliRunner().invoke(app, [*args, "--eval-users", "199", "--dry-run"])
    assert sampled.exit_code == 0 and "is not below" not in sampled.output, sampled.output


def test_the_python_api_gets_the_whole_population_note_too(tmp_path):
    """The note above was printed by the CLI only: a library user's ``RunStart.notes`` and
    ``plan_run(...).notes`` lacked it. It is one of a new run's notes now (the CLI prints
    the notes, once: the test above); a resume's are empty (said when the run started)."""
    from securefed.training import RunInterrupted, plan_run

    note = "eval_users 5,000 is not below the 200 users of the data"
    whole = TrainConfig(eval_users=5000, **{**SMALL, "checkpoint_every": 1})
    assert [n for n in plan_run(whole).notes if n.startswith(note)] == [
        "eval_users 5,000 is not below the 200 users of the data: every user is ranked in "
        "full, as without it (no sample, no confidence intervals)"
    ]
    starts = []

    def stop(record):
        raise KeyboardInterrupt

    with pytest.raises(RunInterrupted):
        train(whole, out=tmp_path / "r", on_start=starts.append, progress=stop)
    assert sum(n.startswith(note) for n in starts[0].notes) == 1
    train(resume=tmp_path / "r", on_start=starts.append)
    assert starts[1].resumed and starts[1].notes == ()
    sampled = TrainConfig(eval_users=199, **SMALL)
    assert not any("eval_users" in n for n in plan_run(sampled).notes)
