"""What the CLI says while it works (issue 18): the data summary before training, one plain line
per round when stderr is not a terminal, a resumed run's true total, and ``--version``."""

from __future__ import annotations

import importlib.metadata
import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from securefed.cli.progress import RoundDisplay, data_summary
from securefed.cli.root import app
from securefed.training import RunInterrupted, RunStart, TrainConfig, train

runner = CliRunner()
SMALL = ["--synthetic-users", "60", "--synthetic-items", "400"]


def test_version_prints_the_installed_distribution_version():
    res = runner.invoke(app, ["--version"])
    assert res.exit_code == 0, res.output
    assert res.output.strip() == f"securefed {importlib.metadata.version('securefed')}"


def test_data_summary_comes_before_the_first_round(tmp_path):
    # 20 users with 8 items each, two users with 2 (dropped under the default 5), 3 duplicates.
    rows = [(u, u * 8 + k) for u in range(20) for k in range(8)]
    rows += [(100, 1), (100, 2), (101, 3), (101, 4)]
    rows += rows[:3]
    csv = tmp_path / "plays.csv"
    csv.write_text("user,item\n" + "".join(f"{u},{i}\n" for u, i in rows))
    run = tmp_path / "run"
    res = runner.invoke(
        app, ["train", "--model", "mostpop", "--dataset", str(csv), "--out", str(run)]
    )
    assert res.exit_code == 0, res.output
    data = json.loads((run / "data.json").read_text())
    assert (data["dropped_users"], data["dropped_interactions"], data["duplicate_rows"]) == (
        2,
        4,
        3,
    )
    assert data["interactions"] == 160 and data["min_interactions"] == 5
    text = res.output
    first = text.index("data: plays: 20 users, 160 items, 160 interactions kept")
    assert "2 users dropped (fewer than 5 interactions: 4 interactions), 3 duplicate rows" in text
    assert first < text.index("round 1/1")


def test_data_summary_lines():
    data = dict(
        name="ml-100k",
        users=943,
        items=1682,
        interactions=100000,
        train_interactions=98114,
        dropped_users=0,
        dropped_interactions=0,
        duplicate_rows=18586,
        min_interactions=5,
    )
    assert data_summary(data) == [
        "data: ml-100k: 943 users, 1,682 items, 100,000 interactions kept",
        "      0 users dropped (fewer than 5 interactions), 18,586 duplicate rows removed",
    ]
    # The loader's notes follow, except those repeating the counts above (their wording is
    # securefed.data.loaders.COUNT_NOTE's).
    data["notes"] = [
        "18,586 duplicate (user, item) row(s) removed, kept the latest timestamp",
        "12 user(s) with fewer than 5 interactions dropped (30 interactions)",
        "user ids read as strings (line 2 is not a number): each distinct string is one user",
    ]
    assert data_summary(data)[2:] == [
        "      user ids read as strings (line 2 is not a number): each distinct string is one user"
    ]


def test_redirected_output_gets_one_plain_line_per_round_with_epsilon(tmp_path):
    res = runner.invoke(
        app,
        ["train", "--model", "fedals", *SMALL, "--rounds", "3", "--noise-multiplier", "2"]
        + ["--out", str(tmp_path / "r")],
    )
    assert res.exit_code == 0, res.output
    lines = [x for x in res.output.splitlines() if x.startswith("round ")]
    assert [x.split()[1] for x in lines] == ["1/3", "2/3", "3/3"]
    pattern = r"round \d/3  loss -?\d+\.\d{4}  val HR@10 \d\.\d{4}  eps \d+\.\d{3}  \(\d+\.\d s\)"
    assert all(re.fullmatch(pattern, x) for x in lines), lines


def test_resumed_run_shows_its_total(tmp_path):
    run = tmp_path / "r"

    def stop_at_2(record):
        if record.round == 2:
            raise KeyboardInterrupt

    cfg = TrainConfig(model="fedrap", synthetic_users=60, synthetic_items=400, rounds=4)
    with pytest.raises(RunInterrupted):
        train(cfg, out=run, progress=stop_at_2)
    res = runner.invoke(app, ["train", "--resume", str(run)])
    assert res.exit_code == 0, res.output
    assert f"resuming {run} after round 2 of 4" in res.output.replace("\n", "")
    lines = [x.split()[1] for x in res.output.splitlines() if x.startswith("round ")]
    assert lines == ["3/4", "4/4"]


def test_terminal_bar_of_a_resumed_run_starts_at_its_round_with_its_total():
    start = RunStart(
        run_dir=Path("runs/x"),
        rounds=100,
        start_round=30,
        resumed=True,
        data=dict(
            name="s",
            users=1,
            items=1,
            train_interactions=1,
            dropped_users=0,
            dropped_interactions=0,
            duplicate_rows=0,
        ),
    )
    with RoundDisplay(plain=False) as display:
        assert display.bar is not None
        task = display.bar.tasks[0]
        assert task.total is None  # unknown while the data loads
        display.start(start)
        assert (task.total, task.completed) == (100, 30)


def test_aborted_rounds_are_said_at_each_round_and_in_the_summary(tmp_path):
    # Nine in ten clients drop out of every secure round: no round can be unmasked, so no
    # aggregate ever reaches the model. The run completes; the user must be told, loudly.
    config = tmp_path / "run.toml"
    config.write_text(
        'model = "fedrap"\nsynthetic_users = 60\nsynthetic_items = 400\nrounds = 2\n'
        "[privacy]\nsecagg = true\nsecagg_simulate_dropout = 0.9\n"
    )
    res = runner.invoke(app, ["train", "--config", str(config), "--out", str(tmp_path / "r")])
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.split())
    assert "round 1 aborted, the shared model took no step:" in text
    assert "round 2 aborted, the shared model took no step:" in text
    assert "2 of 2 rounds aborted (no aggregate reached the shared model; rounds 1, 2):" in text
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["aborted_rounds"] == [1, 2]
    assert summary["aborted_reason"].endswith("the round is aborted and reveals nothing")
