"""End-to-end training through the library API and the CLI: run directory, resume, errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from securefed.cli import app
from securefed.errors import ConfigError
from securefed.training import TrainConfig, train

SMALL = ["--synthetic-users", "60", "--synthetic-items", "400"]
FEDRAP = ["--model", "fedrap", *SMALL]
QUALITY_KEYS = ("loss", "val_hr@10", "val_ndcg@10", "test_hr@10", "test_ndcg@10", "test_full_hr@10")
runner = CliRunner()


def _small(**kw) -> TrainConfig:
    base = dict(
        model="fedrap", synthetic_users=60, synthetic_items=400, rounds=4, checkpoint_every=1
    )
    base.update(kw)
    return TrainConfig(**base)


def _quality(metrics: list[dict]) -> list[tuple]:
    return [tuple(m[k] for k in QUALITY_KEYS) for m in metrics]


@pytest.mark.slow
def test_train_writes_a_complete_run_directory(tmp_path):
    result = train(_small(), out=tmp_path / "run")
    run = tmp_path / "run"
    for name in ("config.toml", "metrics.jsonl", "model.pt", "summary.json", "data.json"):
        assert (run / name).exists(), name
    assert not (run / "checkpoint.pt").exists()  # a finished run keeps no resume state
    summary = json.loads((run / "summary.json").read_text())
    for key in (
        "model",
        "dataset",
        "rounds",
        "seed",
        "seconds",
        "test_hr@10",
        "test_ndcg@10",
        "test_full_hr@10",
        "test_full_ndcg@10",
        "val_hr@10",
        "val_ndcg@10",
    ):
        assert key in summary, key
    assert summary["rounds"] == 4 and summary["model"] == "fedrap"
    lines = (run / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["round"] for line in lines] == [1, 2, 3, 4]
    # The reported round is chosen on validation, and its test numbers are that round's.
    best = max(result.metrics, key=lambda m: (m["val_hr@10"], m["val_ndcg@10"], m["round"]))
    assert summary["selected_round"] == best["round"]
    assert summary["test_hr@10"] == best["test_hr@10"]
    # The resolved config round-trips.
    cfg = TrainConfig.from_dict(tomllib.loads((run / "config.toml").read_text()))
    assert cfg == _small()


@pytest.mark.slow
def test_same_seed_same_metrics_and_other_seed_differs(tmp_path):
    a = train(_small(rounds=2), out=tmp_path / "a")
    b = train(_small(rounds=2), out=tmp_path / "b")
    c = train(_small(rounds=2, seed=1), out=tmp_path / "c")
    assert _quality(a.metrics) == _quality(b.metrics)
    assert _quality(a.metrics) != _quality(c.metrics)


@pytest.mark.slow
def test_resume_after_interruption_gives_uninterrupted_metrics(tmp_path):
    full = train(_small(rounds=5, checkpoint_every=2), out=tmp_path / "full")

    class Stop(Exception):
        pass

    def stop_at_3(record):
        if record.round == 3:
            raise Stop

    with pytest.raises(Stop):
        train(_small(rounds=5, checkpoint_every=2), out=tmp_path / "cut", progress=stop_at_3)
    # Rounds 1-3 were logged, the checkpoint holds round 2: resume replays round 3.
    assert len((tmp_path / "cut" / "metrics.jsonl").read_text().splitlines()) == 3
    resumed = train(resume=tmp_path / "cut")
    assert _quality(resumed.metrics) == _quality(full.metrics)
    lines = (tmp_path / "cut" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["round"] for x in lines] == [1, 2, 3, 4, 5]


@pytest.mark.slow
def test_kill_9_then_resume(tmp_path):
    """A run killed with SIGKILL mid-way resumes to the uninterrupted metrics."""
    args = ["train", *FEDRAP, "--rounds", "6", "--checkpoint-every", "1"]
    full = runner.invoke(app, [*args, "--out", str(tmp_path / "full")])
    assert full.exit_code == 0, full.output
    run = tmp_path / "killed"
    proc = subprocess.Popen(
        [sys.executable, "-m", "securefed.cli", *args, "--out", str(run)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
    )
    deadline = time.time() + 120
    metrics = run / "metrics.jsonl"
    while time.time() < deadline:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 2:
            break
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    resumed = runner.invoke(app, ["train", "--resume", str(run)])
    assert resumed.exit_code == 0, resumed.output
    read = lambda p: [json.loads(x) for x in (p / "metrics.jsonl").read_text().splitlines()]  # noqa: E731
    assert _quality(read(run)) == _quality(read(tmp_path / "full"))


def test_cli_train_on_synthetic(tmp_path):
    res = runner.invoke(app, ["train", *SMALL, "--rounds", "2", "--out", str(tmp_path / "r")])
    assert res.exit_code == 0, res.output
    assert "SYNTHETIC" in res.output
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["rounds"] == 2 and 0 <= summary["test_hr@10"] <= 1


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--model", "nope"], "model must be one of"),
        (["--rounds", "0"], "rounds must be a positive integer"),
        (["--client-fraction", "1.5"], "client fraction must be in (0, 1]"),
        (["--client-fraction", "0.5", "--clients-per-round", "3"], "not both"),
        (["--dataset", "/no/such/file.csv"], "no/such/file.csv"),
        (["--negatives-from", "everything"], "negatives_from"),
        (["--sam", "maybe"], "--sam must be on or off"),
        (["--device", "tpu"], "device must be cpu or cuda"),
    ],
)
def test_cli_bad_flags_exit_2_with_one_line(tmp_path, argv, needle):
    res = runner.invoke(
        app, ["train", *FEDRAP, "--rounds", "1", *argv, "--out", str(tmp_path / "x")]
    )
    assert res.exit_code == 2, res.output
    assert needle in res.output
    assert "Traceback" not in res.output
    assert not (tmp_path / "x" / "metrics.jsonl").exists()


def test_cli_device_cuda_without_a_gpu_is_one_clear_line(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    res = runner.invoke(
        app, ["train", *SMALL, "--rounds", "1", "--device", "cuda", "--out", str(tmp_path / "x")]
    )
    assert res.exit_code == 2, res.output
    assert "torch sees no GPU here; use --device cpu" in res.output
    assert "Traceback" not in res.output
    assert not (tmp_path / "x" / "metrics.jsonl").exists()


def test_cli_refuses_to_overwrite_a_run(tmp_path):
    res = runner.invoke(app, ["train", *SMALL, "--rounds", "1", "--out", str(tmp_path / "r")])
    assert res.exit_code == 0, res.output
    before = (tmp_path / "r" / "metrics.jsonl").read_text()
    again = runner.invoke(app, ["train", *SMALL, "--rounds", "1", "--out", str(tmp_path / "r")])
    assert again.exit_code == 2 and "already holds a run" in again.output
    assert (tmp_path / "r" / "metrics.jsonl").read_text() == before


def test_config_file_and_flag_precedence(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        'model = "fedrap"\nrounds = 2\nsynthetic_users = 60\nsynthetic_items = 400\n'
        "[fedrap]\ndim = 8\n"
    )
    res = runner.invoke(
        app, ["train", "--config", str(cfg), "--rounds", "1", "--out", str(tmp_path / "r")]
    )
    assert res.exit_code == 0, res.output
    resolved = tomllib.loads((tmp_path / "r" / "config.toml").read_text())
    assert resolved["rounds"] == 1 and resolved["fedrap"]["dim"] == 8
    bad = tmp_path / "bad.toml"
    bad.write_text("[fedrap]\ndimension = 8\n")
    res = runner.invoke(app, ["train", "--config", str(bad), "--out", str(tmp_path / "s")])
    assert res.exit_code == 2 and "unknown key 'dimension'" in res.output


def test_config_validation_errors():
    with pytest.raises(ConfigError, match="seed"):
        TrainConfig(seed=-1)
    with pytest.raises(ConfigError, match="unknown config key"):
        TrainConfig.from_dict({"roundz": 3})


@pytest.mark.slow
def test_cli_train_on_movielens(tmp_path, shared_data):
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
            "--rounds",
            "1",
            "--local-epochs",
            "1",
            "--out",
            str(tmp_path / "ml"),
        ],
    )
    assert res.exit_code == 0, res.output
    summary = json.loads((tmp_path / "ml" / "summary.json").read_text())
    assert summary["users"] == 943 and summary["items"] == 1682
    assert summary["dataset"] == "ml-100k"


@pytest.mark.slow
def test_fedrecgel_trains_through_the_cli(tmp_path):
    res = runner.invoke(
        app,
        ["train", "--model", "fedrecgel", *SMALL, "--rounds", "2", "--out", str(tmp_path / "g")],
    )
    assert res.exit_code == 0, res.output
    metrics = [json.loads(x) for x in (tmp_path / "g" / "metrics.jsonl").read_text().splitlines()]
    assert all(m["participants"] == 6 for m in metrics)  # a uniform 10% of 60 users


def test_selected_round_always_gets_full_ranking_metrics(tmp_path):
    """Full ranking every 10 rounds: the selected round is re-evaluated from its saved model."""
    res = train(_small(model="fedrecgel", rounds=3, full_eval_every=10), out=tmp_path / "g")
    assert "test_full_hr@10" not in res.metrics[0] or res.summary["selected_round"] == 3
    assert res.summary["test_full_hr@10"] is not None
    selected = next(m for m in res.metrics if m["round"] == res.summary["selected_round"])
    assert selected["test_full_hr@10"] == res.summary["test_full_hr@10"]
    lines = [json.loads(x) for x in (tmp_path / "g" / "metrics.jsonl").read_text().splitlines()]
    assert "test_full_hr@10" in lines[res.summary["selected_round"] - 1]
    # Its one use spent, the best model is removed: the released model is the only copy.
    assert not (tmp_path / "g" / "best_model.pt").exists()
    assert (tmp_path / "g" / "model.pt").exists()


def test_resume_refuses_other_flags(tmp_path):
    res = runner.invoke(app, ["train", *SMALL, "--rounds", "1", "--out", str(tmp_path / "r")])
    assert res.exit_code == 0, res.output
    again = runner.invoke(app, ["train", "--resume", str(tmp_path / "r"), "--rounds", "3"])
    assert again.exit_code == 2 and "drop --rounds" in again.output


@pytest.mark.parametrize("select_on", [None, "full"])
def test_selection_rule_picks_the_best_round_of_its_metric(tmp_path, select_on):
    """The summary's round is the best validation HR@10 (then NDCG@10, ties: latest) of the
    sampled protocol, or of the full ranking with select_on full (every round ranked)."""
    cfg = TrainConfig(
        model="fedals", rounds=5, synthetic_users=120, synthetic_items=200, select_on=select_on
    )
    res = train(cfg, out=tmp_path / "run")
    metrics = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    hr, ndcg = ("val_full_hr@10", "val_full_ndcg@10") if select_on else ("val_hr@10", "val_ndcg@10")
    assert all(hr in m for m in metrics)
    best = max(metrics, key=lambda m: (m[hr], m[ndcg], m["round"]))
    assert res.summary["selected_round"] == best["round"]
    assert res.summary["test_full_hr@10"] == best["test_full_hr@10"]


def test_select_on_last_ignores_better_earlier_rounds():
    """The rule itself: with select_on last a later evaluated round replaces a better earlier
    one (and an unevaluated line is skipped); with the default the better one stays."""
    from securefed.training import _selected_round

    lines = [
        {"round": 1, "val_hr@10": 0.9, "val_ndcg@10": 0.5},
        {"round": 2, "val_hr@10": 0.4, "val_ndcg@10": 0.2},
        {"round": 3},
    ]
    last = TrainConfig(model="fedals", rounds=3, select_on="last")
    assert _selected_round(lines, last)["round"] == 2
    assert _selected_round(lines, TrainConfig(model="fedals", rounds=3))["round"] == 1


def test_select_on_last_reports_the_last_round(tmp_path):
    """select_on last: no choice on validation, the last evaluated round is reported (here
    with evaluations every second round of five: the last evaluation is round 5, the final
    one, and round 4, the last on the cadence, is not it)."""
    cfg = TrainConfig(
        model="fedals",
        rounds=5,
        eval_every=2,
        synthetic_users=120,
        synthetic_items=200,
        select_on="last",
    )
    res = train(cfg, out=tmp_path / "run")
    metrics = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    evaluated = [m for m in metrics if "val_hr@10" in m]
    assert [m["round"] for m in evaluated] == [2, 4, 5]
    assert res.summary["selected_round"] == 5
    assert res.summary["selection"] == "the last evaluated round"
    for key in ("test_hr@10", "test_full_hr@10", "val_hr@10"):
        assert res.summary[key] == evaluated[-1][key]


def test_select_on_from_the_command_line(tmp_path):
    """--select-on full reaches the config and the summary line; a bad value is one line,
    exit 2."""
    runner = CliRunner()
    out = tmp_path / "run"
    args = ["train", "--rounds", "2", "--synthetic-users", "120", "--synthetic-items", "200"]
    res = runner.invoke(app, [*args, "--select-on", "full", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "best validation full-ranking HR@10" in " ".join(res.output.split())
    assert tomllib.loads((out / "config.toml").read_text())["select_on"] == "full"
    bad = runner.invoke(app, [*args, "--select-on", "bogus", "--out", str(tmp_path / "b")])
    assert bad.exit_code == 2 and "select on must be sampled, full or last" in bad.output
    last = runner.invoke(app, [*args, "--select-on", "last", "--out", str(tmp_path / "l")])
    assert last.exit_code == 0, last.output
    assert "reported round 2 (the last evaluated round: no choice)" in " ".join(last.output.split())
    assert not (tmp_path / "b").exists()
    # Under DP a round chosen on validation is a use of the clear data the epsilon does not
    # cover: the line says so (not without DP, not for the last round).
    assert "outside the epsilon" not in res.output + last.output
    dp = runner.invoke(
        app,
        [*args, "--model", "fedrap", "--epsilon", "8", "--out", str(tmp_path / "dp")],
    )
    assert dp.exit_code == 0, dp.output
    said = " ".join(dp.output.split())
    assert "(best validation HR@10)" in said and "outside the epsilon" in said
