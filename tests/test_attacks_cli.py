"""``securefed audit`` end to end on a small synthetic run, and its flag errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
import typer
from typer.testing import CliRunner

from attacks.recorder import RECORDING_VERSION
from securefed.cli.audit import audit

app = typer.Typer()
app.command()(audit)
runner = CliRunner()

SMALL = [
    "--model",
    "fedrap",
    "--synthetic-users",
    "50",
    "--synthetic-items",
    "600",
    "--rounds",
    "2",
    "--local-epochs",
    "1",
    "--canaries",
    "40",
]


@pytest.mark.slow
def test_cli_end_to_end(tmp_path) -> None:
    out = tmp_path / "audit"
    res = runner.invoke(
        app,
        ["--attacks", "row-change,intersection,union", "--keep-recording", "--out", str(out)]
        + SMALL,
    )
    assert res.exit_code == 0, res.output
    assert "empirical epsilon" in res.output
    assert "(kept)" in res.output and (out / "run" / "audit" / "record").is_dir()
    rep = json.loads((out / "audit.json").read_text())
    for key in (
        "model",
        "dataset",
        "epsilon",
        "delta",
        "secagg",
        "accounted_epsilon",
        "attacks",
        "audit",
    ):
        assert key in rep
    assert rep["model"] == "fedrap" and rep["secagg"] is False and rep["epsilon"] is None
    names = [a["name"] for a in rep["attacks"]]
    assert names == ["row-change", "intersection", "union"]
    for a in rep["attacks"]:
        assert set(a) >= {"name", "threat_model", "metrics", "ci95", "baseline"}
        assert set(a["metrics"]) >= {"auc", "tpr@1%fpr", "tpr@0.1%fpr", "f1"}
        lo, hi = a["ci95"]["auc"]
        assert lo <= a["metrics"]["auc"] <= hi
        assert a["baseline"]["auc"] == 0.5
        assert a["verdict"] in ("above chance", "chance level", "BELOW CHANCE")
        assert (a["verdict"] == "above chance") == (lo > 0.5)
    assert "vs chance" in res.output and "(random)" in res.output
    assert set(rep["audit"]) >= {"epsilon_lower_bound", "confidence", "method"}
    assert rep["recorded_bytes"] > 0
    assert rep["seconds"]["train"] > 0
    assert all(a["seconds"] >= 0 for a in rep["attacks"])
    assert sum(a["seconds"] for a in rep["attacks"]) <= rep["seconds"]["scoring"]
    assert max(a["seconds"] for a in rep["attacks"]) > 0
    scores = np.load(out / "scores.npz")
    # Real users only (canary clients are the audit's own).
    assert scores["row-change"].shape == scores["labels"].shape == (50, 600)
    assert scores["canary_scores"].shape == (40,)

    # --run reuses what the first audit recorded: no training, the same numbers.
    again = tmp_path / "again"
    res = runner.invoke(
        app, ["--run", str(out / "run"), "--attacks", "row-change", "--out", str(again)]
    )
    assert res.exit_code == 0, res.output
    rep2 = json.loads((again / "audit.json").read_text())
    assert rep2["attacks"][0]["metrics"]["auc"] == rep["attacks"][0]["metrics"]["auc"]
    assert rep2["audit"]["epsilon_lower_bound"] == rep["audit"]["epsilon_lower_bound"]
    assert not (again / "replay").exists()
    assert rep2["seconds"]["train"] is None  # the recording was reused
    res = runner.invoke(
        app, ["--run", str(out / "run"), "--attacks", "differencing", "--out", str(again / "x")]
    )
    assert res.exit_code == 2 and "recorded statistics for" in res.output
    # An attack not recorded by name that reads only what was recorded (the upload tables)
    # is scored from it (found in a walkthrough adding an attack); with every attack, the
    # ones whose statistics were not recorded are skipped, with the reason.
    res = runner.invoke(
        app, ["--run", str(out / "run"), "--attacks", "gradient-ratio", "--out", str(again / "g")]
    )
    assert res.exit_code == 0, res.output
    [gradient] = json.loads((again / "g" / "audit.json").read_text())["attacks"]
    assert gradient["name"] == "gradient-ratio" and 0 <= gradient["metrics"]["auc"] <= 1
    res = runner.invoke(app, ["--run", str(out / "run"), "--out", str(again / "all")])
    assert res.exit_code == 0, res.output
    every = {
        a["name"]: a for a in json.loads((again / "all" / "audit.json").read_text())["attacks"]
    }
    assert every["differencing"]["note"].startswith("skipped: not recorded in")
    assert "auc" in every["row-change"]["metrics"] and "auc" in every["gradient-ratio"]["metrics"]
    # A recording made by other statistic code is not rescored as if it were this one's.
    meta_path = out / "run" / "audit" / "audit_meta.json"
    meta = json.loads(meta_path.read_text())
    assert meta["recording_version"] == RECORDING_VERSION
    meta.pop("recording_version")  # as every recording before versions were written
    meta_path.write_text(json.dumps(meta))
    res = runner.invoke(
        app, ["--run", str(out / "run"), "--attacks", "row-change", "--out", str(again / "y")]
    )
    assert res.exit_code == 2 and "recording of version 1" in " ".join(res.output.split())
    assert not (again / "y").exists()


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (["--attacks", "nonsense"], "unknown attack"),
        (["--epsilon", "-1"], "epsilon must be > 0"),
        (["--model", "svd"], "model must be one of"),
        (
            ["--secagg", "--attacks", "row-change", "--clients-per-round", "20"],
            "secure aggregation",
        ),
        (["--canaries", "-3"], "canaries must be"),
    ],
)
def test_cli_bad_flags_exit_2_with_one_line(tmp_path, flags, needle) -> None:
    res = runner.invoke(app, [*flags, "--out", str(tmp_path / "a"), *SMALL[2:6]])
    assert res.exit_code == 2, res.output
    lines = [line for line in res.output.strip().splitlines() if line.strip()]
    assert len(lines) == 1, res.output
    assert needle in res.output
    assert not (tmp_path / "a" / "audit.json").exists()


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (["--secagg", "--attacks", "imia", "--clients-per-round", "20"], "secure aggregation"),
        (["--imia-iterations", "0", "--attacks", "imia"], "IMIA iterations"),
        (["--attacks", "released,bogus"], "unknown attack"),
    ],
)
def test_cli_imia_released_flag_errors(tmp_path, flags, needle) -> None:
    res = runner.invoke(app, [*flags, "--out", str(tmp_path / "a"), *SMALL[2:6]])
    assert res.exit_code == 2, res.output
    lines = [line for line in res.output.strip().splitlines() if line.strip()]
    assert len(lines) == 1, res.output
    assert needle in res.output


def test_audit_of_an_interaction_level_run(tmp_path) -> None:
    from securefed.cli import app as main_app

    run = tmp_path / "run"
    res = runner.invoke(
        main_app,
        # A replay run: the audit re-simulates it (an OS-randomness run cannot be).
        ["train", "--epsilon", "4", "--privacy-unit", "interaction", "--replay-from-seed"]
        + ["--out", str(run), *SMALL[:-2]],
    )
    assert res.exit_code == 0, res.output
    out = tmp_path / "a1"
    res = runner.invoke(
        app,
        ["--run", str(run), "--out", str(out), "--attacks", "row-change,union", "--canaries", "8"],
    )
    assert res.exit_code == 0, res.output
    rep = json.loads((out / "audit.json").read_text())
    # Zero-out interaction canaries, one per host user (tests/test_interaction_canaries.py).
    assert rep["audit"]["unit"] == "interaction" and rep["audit"]["canaries"] == 8
    assert rep["audit"]["epsilon_lower_bound"] <= rep["accounted_epsilon"]
    notes = {a["name"]: a["observes"] for a in rep["attacks"]}
    assert "own DP-SGD" in notes["row-change"] and "DP-SGD noise" in notes["union"]
    # Uploads carry their own DP-SGD noise here: no note that DP leaves them to the server.
    assert "not the uploads" not in " ".join(res.output.split())


def test_recorder_holds_only_the_tables_its_attacks_read() -> None:
    from attacks.recorder import recorder_bytes, recorder_tables

    assert recorder_tables({"released"}, upload=True) == ()
    assert recorder_tables({"union"}, upload=False) == ("union_sum",)
    # Upload attacks read nothing when the uploads are not observable (secure aggregation).
    assert recorder_tables({"row-change", "imia"}, upload=False) == ()
    assert len(recorder_tables({"row-change", "attribute"}, upload=True)) == 5
    assert recorder_bytes({"imia", "union"}, 10, 7, upload=True) == 2 * 10 * 7 * 4


def test_audit_too_big_for_memory_is_refused_in_one_line_and_leaves_nothing(
    tmp_path, monkeypatch
) -> None:
    """Issue 17: an audit of a 30k x 41k catalogue was killed by the kernel after 33 s at
    24 GB (nine users x items float32 tables in the recorder, 4.9 GB each); it is now
    refused before any model is built, naming the chosen attacks that would fit."""
    import dataclasses

    from attacks.audit import _check_audit_memory, _layout, audit_memory_bytes
    from attacks.canaries import plant_canaries
    from protocols.seeding import numpy_generator
    from securefed import costs
    from securefed.training import TrainConfig, load_split

    cfg = TrainConfig(model="fedrap", synthetic_users=50, synthetic_items=600, rounds=2)
    split, _ = plant_canaries(load_split(cfg), 40, numpy_generator(0, "audit-canaries"))
    # row-change: 5 tables + a score matrix; union: 1 + 1; released: a matrix, its labels;
    # labels and masks for all. Room for union and released (5 + 3 + 1 + 2 bytes an entry).
    # And each canary's upload, dense and clipped, for the canary test.
    layout = _layout(cfg, split.n_users, split.n_items)
    room = audit_memory_bytes(
        ["union", "released"], split.n_users, split.n_items, upload=True, canaries=40, layout=layout
    )
    assert room == split.n_users * split.n_items * (4 + 8 + 1 + 1 + 2) + 2 * 4 * 40 * layout
    real_estimate = costs.estimate_run
    # The training takes nothing here; the arrays get room for union and released only.
    monkeypatch.setattr(
        costs,
        "estimate_run",
        lambda *a, **k: dataclasses.replace(real_estimate(*a, **k), peak_memory=0),
    )
    monkeypatch.setattr(costs, "available_memory", lambda: room)
    out = tmp_path / "audit"
    res = runner.invoke(app, ["--attacks", "row-change,union,released", "--out", str(out)] + SMALL)
    assert res.exit_code == 2, res.output
    text = " ".join(res.output.split())
    assert "6 recorder tables" in text
    assert "--attacks union,released would fit" in text
    assert "Traceback" not in res.output and not out.exists()
    # Room for all three: nothing refused; the arrays' bytes are returned.
    chosen = ["row-change", "union", "released"]
    everything = audit_memory_bytes(
        chosen, split.n_users, split.n_items, upload=True, canaries=40, layout=layout
    )
    monkeypatch.setattr(costs, "available_memory", lambda: everything)
    assert _check_audit_memory(cfg, split, chosen, upload=True, canaries=40) == everything


def test_two_audits_without_out_get_two_directories(tmp_path, monkeypatch) -> None:
    """``--out`` left out: each audit writes a fresh audits/<time>-<model>-<dataset> (it was
    one fixed audits/latest, so a second audit was refused)."""
    monkeypatch.chdir(tmp_path)
    small = [*SMALL[:-2], "--canaries", "8", "--attacks", "row-change", "--rounds", "1"]
    for _ in range(2):
        res = runner.invoke(app, small)
        assert res.exit_code == 0, res.output
    made = sorted(p.name for p in (tmp_path / "audits").iterdir())
    assert len(made) == 2 and all("-fedrap-synthetic" in name for name in made), made
    assert all((tmp_path / "audits" / name / "audit.json").is_file() for name in made)


def test_printed_table_keeps_names_whole_and_lists_unscored_attacks_below() -> None:
    """Output to a file or pipe is 140 columns wide, so names are not cut; an attack with
    nothing to score (NaN AUC) and a skipped one are lines under the table, not rows of
    "nan" or a reason squeezed into a metric column."""
    from pathlib import Path
    from types import SimpleNamespace

    from securefed.cli.audit import _print
    from securefed.cli.common import LOG_WIDTH, out

    nan = float("nan")
    scored = {
        "name": "attribute-gender",
        "threat_model": "aggregate-observer",
        "metrics": {"auc": 0.61, "macro_f1": 0.5},
        "ci95": {"auc": [0.55, 0.67]},
        "baseline": {"auc": 0.5, "macro_f1": 0.4},
        "note": "",
    }
    empty = {
        "name": "gradient-ratio",
        "threat_model": "upload-observer",
        "metrics": {"auc": nan, "users": 0},
        "ci95": {"auc": [nan, nan]},
        "baseline": {"auc": 0.5},
        "note": "no upload carried a direction",
    }
    skipped = {
        "name": "imia",
        "threat_model": "upload-observer",
        "metrics": {},
        "ci95": {},
        "baseline": {},
        "note": "skipped: not for this model",
    }
    report = {
        "model": "fedals",
        "dataset": "synthetic",
        "epsilon": None,
        "secagg": False,
        "rounds": 2,
        "accounted_epsilon": None,
        "attacks": [scored, empty, skipped],
        "audit": None,
    }
    result = SimpleNamespace(
        report=report, bytes_recorded=0, kept_recording=False, out_dir=Path("audits/x")
    )
    assert out.width == LOG_WIDTH  # pytest captures stdout: not a terminal
    with out.capture() as captured:
        _print(result)
    text = captured.get()
    rows = [line for line in text.splitlines() if line.startswith("│ attr")]
    assert len(rows) == 1 and "attribute-gender" in rows[0]
    assert "aggregate-observer" in rows[0] and "0.610 [0.550, 0.670]" in rows[0]
    assert "nan" not in text and "gradient-ratio │" not in text and "imia │" not in text
    assert (
        "not in the table: gradient-ratio (upload-observer): nothing in this run to score" in text
    )
    assert "not in the table: imia (upload-observer): skipped: not for this model" in text


def test_a_delta_the_canary_bound_cannot_use_is_refused_before_training(
    tmp_path, monkeypatch
) -> None:
    """The one-run bound spends canaries x delta of its significance (0.025 at the default
    95 % confidence): delta 1e-4 with 256 canaries used to be refused only after the whole
    replay had trained, leaving a run without audit.json. It is refused first, in one line
    naming the canaries that fit, and nothing is written."""
    import attacks.audit

    def no_training(*args, **kwargs):
        raise AssertionError("the audit trained before refusing its delta")

    monkeypatch.setattr(attacks.audit, "train", no_training)
    out = tmp_path / "audit"
    args = ["--epsilon", "2", "--delta", "1e-4", "--out", str(out), *SMALL, "--canaries", "256"]
    res = runner.invoke(app, args)
    assert res.exit_code == 2, res.output
    text = " ".join(res.output.split())
    assert "delta 0.0001 is too large for an audit with 256 canaries" in text
    assert "--canaries 250 or fewer" in text  # 250 x 1e-4 < 0.025 (1 - 0.95 is 0.05 + 4e-17)
    assert "Traceback" not in res.output and not out.exists()
    # With a popularity prior the significance is halved again: 125 canaries fit.
    res = runner.invoke(app, [*args, "--canaries", "200", "--private-prior", "0.5"])
    assert res.exit_code == 2 and "--canaries 125 or fewer" in " ".join(res.output.split())


def test_a_central_dp_audit_says_the_upload_rows_are_not_what_dp_protects(tmp_path) -> None:
    """Upload attacks at AUC 1.0 under --epsilon read as a broken defence without the line
    saying that central DP protects the release, not the uploads (found 2026-12-06)."""
    out = tmp_path / "a"
    res = runner.invoke(
        app,
        ["--epsilon", "2", "--attacks", "row-change", "--canaries", "8", "--out", str(out)] + SMALL,
    )
    assert res.exit_code == 0, res.output
    assert "protects what is released, not the uploads" in " ".join(res.output.split())


def test_an_attribute_attack_without_signal_says_so_in_the_audit_and_the_report(tmp_path):
    """Private fedals's attribute attack reads profiles its count rounds never upload: its
    scores are constant, which the audit printed, wrote and the report averaged as an attack
    at "chance level" (AUC 0.500 [0.500, 0.500])."""
    from attacks.results import NO_SIGNAL
    from securefed.report import build_report

    out = tmp_path / "audit"
    argv = ["--model", "fedals", "--epsilon", "2", "--synthetic-users", "100"]
    argv += ["--synthetic-items", "300", "--attacks", "attribute", "--canaries", "0"]
    res = runner.invoke(app, [*argv, "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "no signal" in res.output and "chance level" not in res.output
    (attack,) = json.loads((out / "audit.json").read_text())["attacks"]
    assert attack["name"] == "attribute-gender" and attack["verdict"] == NO_SIGNAL
    assert attack["metrics"]["constant_scores"] is True and NO_SIGNAL in attack["note"]
    report = build_report([out], tmp_path / "report")
    assert list(report.results["attribute-gender:verdict"]) == [NO_SIGNAL]
    (note,) = [n for n in report.notes if "no signal" in n]
    assert note.startswith("attribute-gender had no signal in 1 cell(s)")
    page = (tmp_path / "report" / "report.md").read_text()
    assert "0.500 (attribute-gender)" not in page  # not the row's best attack AUC
