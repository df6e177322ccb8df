"""securefed report: grid planning, the end-to-end sweep through the CLI, resumption, the page."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import typer
from typer.testing import CliRunner

from securefed.errors import ConfigError
from securefed.report import (
    BASELINE_COLUMNS,
    CENTRALIZED,
    DP_BASELINE_COLUMNS,
    REQUIRED_COLUMNS,
    ReportConfig,
    SweepEvent,
    build_report,
    estimate_sweep,
    plan_cells,
    run_report,
)
from securefed.report.html import baseline_flags, summarise

SMALL = ["--dataset", "synthetic", "--synthetic-users", "60", "--synthetic-items", "400"]
FIGURES = ("frontier", "attacks", "epsilon_audit", "roc", "secagg")
#: Columns that say what a cell learned and spent (not how long it took).
QUALITY = [c for c in REQUIRED_COLUMNS if c != "seconds"] + [
    "val_hr@10",
    "val_ndcg@10",
    "noise_multiplier",
    "selected_round",
]


def _app() -> typer.Typer:
    from securefed.cli.report import report

    app = typer.Typer(pretty_exceptions_enable=False)

    @app.callback()
    def _root() -> None:
        """Test root (keeps `report` a subcommand, as in securefed.cli)."""

    app.command()(report)
    return app


def _invoke(*args: str):
    return CliRunner().invoke(_app(), ["report", *args])


# ---------------------------------------------------------------------------- planning


def test_plan_runs_meaningful_cells_and_names_the_skipped_ones():
    cfg = ReportConfig(models=("fedrap", "fedrecgel"), epsilons=(1.0, math.inf), seeds=2)
    cells, skipped = plan_cells(cfg)
    names = {c.name for c in cells}
    # per model: none/secagg at inf, dp and dp+secagg at 1; two seeds each; then the two
    # centralized references once per seed
    assert len(cells) == 2 * 4 * 2 + 2 * 2
    assert "fedrap-dp+secagg-eps1-s1" in names and "fedrecgel-none-epsinf-s0" in names
    assert not any(c.defense in ("dp", "dp+secagg") and math.isinf(c.epsilon) for c in cells)
    assert not any(c.defense in ("none", "secagg") and not math.isinf(c.epsilon) for c in cells)
    assert {(s.defense, s.epsilon) for s in skipped if s.model == "fedrap"} == {
        ("none", 1.0),
        ("secagg", 1.0),
        ("dp", math.inf),
        ("dp+secagg", math.inf),
    }
    assert all(s.reason for s in skipped)


def test_plan_adds_centralized_references_once_per_seed_and_any_registered_model_runs():
    cfg = ReportConfig(models=("fedals", "mostpop", "ials"), epsilons=(2.0, math.inf), seeds=2)
    cells, skipped = plan_cells(cfg)
    names = [c.name for c in cells]
    assert "fedals-dp-eps2-s1" in names and "mostpop-dp+secagg-eps2-s0" in names
    # ials was asked for as a model: one centralized cell per seed, every defense skipped.
    assert [n for n in names if n.startswith("ials")] == [
        "ials-centralized-s0",
        "ials-centralized-s1",
    ]
    assert {s.model for s in skipped if "CENTRALIZED" in s.reason} == {"ials"}
    # ease is a default reference: after the grid, once per seed, never audited.
    assert names[-2:] == ["ease-centralized-s0", "ease-centralized-s1"]
    refs = [c for c in cells if c.defense == CENTRALIZED]
    assert refs and not any(c.audited for c in refs)
    tc = refs[0].train_config(cfg)
    assert not tc.privacy.dp and not tc.privacy.secagg
    assert ReportConfig().models == ("fedals", "fedrap", "fedrecgel")


def test_report_rounds_apply_to_federated_models_only():
    cfg = ReportConfig(models=("fedals", "mostpop"), epsilons=(math.inf,), seeds=1, rounds=3)
    rounds = {c.model: c.train_config(cfg).rounds for c in plan_cells(cfg)[0]}
    assert rounds["fedals"] == 3
    assert rounds["mostpop"] == 1 and rounds["ials"] > 1  # their own defaults, not 3


def test_cell_configs_carry_their_defense():
    cfg = ReportConfig(
        models=("fedrap",), references=(), epsilons=(2.0, math.inf), seeds=1, rounds=3
    )
    by_defense = {c.defense: c.train_config(cfg) for c in plan_cells(cfg)[0]}
    assert by_defense["none"].privacy.dp is False and by_defense["none"].privacy.secagg is False
    assert by_defense["secagg"].privacy.secagg and not by_defense["secagg"].privacy.dp
    assert by_defense["dp"].privacy.epsilon == 2.0 and by_defense["dp"].privacy.noise == "central"
    dps = by_defense["dp+secagg"].privacy
    assert dps.epsilon == 2.0 and dps.secagg and dps.noise == "distributed"
    assert {c.rounds for c in by_defense.values()} == {3}


def test_dp_cells_of_a_model_with_a_private_mode_run_it():
    """FedRAP's and FedRecGEL's dp cells run their private mode (the prior, its rounds unless
    the report sets them, its Poisson cohorts); their dp+secagg cells, fedals's cells and a
    report with private modes off do not."""
    from securefed.models.registry import get_spec

    cfg = ReportConfig(
        models=("fedals", "fedrap", "fedrecgel"), references=(), epsilons=(2.0,), seeds=1
    )
    cells = {(c.model, c.defense): c.train_config(cfg) for c in plan_cells(cfg)[0]}
    for model in ("fedrap", "fedrecgel"):
        mode = get_spec(model).private_mode
        assert mode is not None
        dp = cells[(model, "dp")]
        assert dp.privacy.prior_share == mode.prior_share and dp.privacy.noise == "central"
        assert dp.rounds == mode.rounds and dp.client_fraction == mode.client_fraction
        secure = cells[(model, "dp+secagg")]
        assert secure.privacy.prior_share is None and secure.client_fraction is None
    assert cells[("fedals", "dp")].privacy.prior_share is None
    assert cells[("fedals", "dp")].client_fraction is None
    fixed = ReportConfig(models=("fedrap",), references=(), epsilons=(2.0,), seeds=1, rounds=3)
    dp = next(c.train_config(fixed) for c in plan_cells(fixed)[0] if c.defense == "dp")
    assert dp.rounds == 3 and dp.privacy.prior_share == 0.9  # --rounds still sets the rounds
    off = ReportConfig(
        models=("fedrap",), references=(), epsilons=(2.0,), seeds=1, private_modes=False
    )
    dp = next(c.train_config(off) for c in plan_cells(off)[0] if c.defense == "dp")
    assert dp.privacy.prior_share is None and dp.client_fraction is None
    assert dp.rounds == get_spec("fedrap").default_rounds
    assert off.to_dict()["private_modes"] is False


@pytest.mark.parametrize(("flag", "value"), [([], True), (["--no-private-modes"], False)])
def test_the_cli_passes_private_modes_on(flag, value, tmp_path, monkeypatch):
    import securefed.report

    seen = []

    def fake(config, **_):
        seen.append(config)
        raise ConfigError("stop here")

    monkeypatch.setattr(securefed.report, "run_report", fake)
    result = _invoke("--models", "fedrap", *SMALL, *flag, "--out", str(tmp_path / "r"))
    assert result.exit_code == 2 and "stop here" in result.stderr
    assert [c.private_modes for c in seen] == [value]


def test_a_grid_from_before_private_modes_is_told_how_to_continue(tmp_path):
    """A dp cell a report ran before private modes (DP on the uploads alone) is refused with
    the flag that continues its grid, before anything trains; that flag accepts it."""
    from securefed import runs
    from securefed.report.sweep import CELLS_DIR, _same_config

    grid = dict(
        models=("fedrap",), references=(), dataset="synthetic", synthetic_users=60,
        synthetic_items=400, epsilons=(2.0,), defenses=("dp",), seeds=1, audit=False,
    )  # fmt: skip
    old = ReportConfig(**grid, private_modes=False)
    (cell,) = plan_cells(old)[0]
    cell_dir = tmp_path / "r" / CELLS_DIR / cell.name
    cell_dir.mkdir(parents=True)
    config = runs.dumps_toml(cell.train_config(old).to_dict())
    (cell_dir / runs.CONFIG_FILE).write_text(config)
    with pytest.raises(ConfigError, match="give --no-private-modes to continue that grid"):
        run_report(ReportConfig(**grid), out=tmp_path / "r")
    assert sorted(p.name for p in cell_dir.iterdir()) == [runs.CONFIG_FILE]
    assert _same_config(cell_dir, cell.train_config(old))
    assert not _same_config(cell_dir, cell.train_config(ReportConfig(**grid)))
    # And the other way: a grid that ran the mode, rerun without it.
    (cell_dir / runs.CONFIG_FILE).write_text(
        runs.dumps_toml(cell.train_config(ReportConfig(**grid)).to_dict())
    )
    with pytest.raises(ConfigError, match="give --private-modes to continue that grid"):
        run_report(old, out=tmp_path / "r")


def test_a_finished_cell_drops_its_prior_and_its_finished_audits_files(tmp_path):
    from securefed import runs
    from securefed.prior import PRIOR_FILE
    from securefed.report.sweep import AUDIT_DIR, AUDIT_FAILED, _drop_checkpoints

    cell = tmp_path / "cell"
    replay = cell / AUDIT_DIR / "replay"
    replay.mkdir(parents=True)
    for d in (cell, replay):
        (d / runs.SUMMARY_FILE).write_text("{}")
        for name in (PRIOR_FILE, runs.CHECKPOINT_FILE):
            (d / name).write_bytes(b"x")
    _drop_checkpoints(cell)  # the audit is not done: it reads its replay's prior
    assert not (cell / PRIOR_FILE).exists() and not (cell / runs.CHECKPOINT_FILE).exists()
    assert (replay / PRIOR_FILE).exists() and (replay / runs.CHECKPOINT_FILE).exists()
    (cell / AUDIT_DIR / AUDIT_FAILED).write_text("{}")  # done, failed or not
    _drop_checkpoints(cell)
    assert sorted(p.name for p in replay.iterdir()) == [runs.SUMMARY_FILE]


def test_the_setup_names_the_private_mode_rows():
    from securefed.report.html import private_mode_line

    frame = pd.DataFrame(
        {
            "model": ["fedrap", "fedrap", "fedals"],
            "defense": ["dp+prior", "none", "dp"],
            "prior_share": [0.9, math.nan, math.nan],
        }
    )
    line = private_mode_line(frame)
    assert line is not None and line.startswith("Private modes: the dp+prior rows (fedrap)")
    assert "share 0.9 of the budget" in line and "fedals" not in line
    assert "dp+secagg" not in line  # no such row here
    secure = pd.concat([frame, frame.iloc[:1].assign(defense="dp+secagg", prior_share=math.nan)])
    assert "their dp+secagg rows cannot take the prior" in (private_mode_line(secure) or "")
    assert private_mode_line(frame.assign(prior_share=math.nan)) is None
    assert private_mode_line(frame.drop(columns="prior_share")) is None  # older results


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"epsilons": (0.0,)}, "epsilon must be > 0"),
        ({"defenses": ("dp", "noise")}, "defense must be one of"),
        ({"models": ("fedavg",)}, "model must be one of"),
        ({"seeds": 0}, "seeds must be a positive integer"),
        ({"jobs": 0}, "jobs must be a positive integer"),
        ({"min_hr": 1.5}, "min HR must be in [0, 1]"),
        ({"references": ("fedals",)}, "references must be centralized models"),
        ({"private_modes": "false"}, "private_modes must be true or false"),
    ],
)
def test_report_config_rejects_bad_values(kwargs, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        ReportConfig(**kwargs)


@pytest.mark.parametrize(
    "args",
    [
        ["--epsilons", "1,abc"],
        ["--epsilons", "1,,2"],
        ["--defenses", "dp,shield"],
        ["--models", "fedrap,fedavg"],
        ["--references", "mostpop"],
        ["--seeds", "0"],
        ["--from", "/nonexistent/securefed-report-dir"],
    ],
)
def test_bad_flags_exit_2_with_one_line(args, tmp_path):
    result = _invoke(*args, "--out", str(tmp_path / "r"))
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), result.stderr
    assert not (tmp_path / "r" / "cells").exists()


def test_report_into_a_folder_holding_other_files_is_refused_and_they_stay(tmp_path):
    """It wrote cells/, the pages and results.csv beside a finished run's model.pt."""
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "model.pt").write_bytes(b"mine")
    for args in (["--models", "fedrecgel", "--seeds", "1"], ["--from", str(tmp_path)]):
        result = _invoke(*args, "--out", str(folder))
        assert result.exit_code == 2, result.output
        lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and "already holds other files" in lines[0], result.stderr
        assert sorted(p.name for p in folder.iterdir()) == ["model.pt"]
    # A report's own leftovers are not foreign: an interrupted start leaves report.json alone.
    from securefed.report.sweep import SWEEP_FILE, _refuse_foreign_out

    started = tmp_path / "started"
    started.mkdir()
    (started / SWEEP_FILE).write_text("{}")
    _refuse_foreign_out(started)


def test_a_hand_written_report_md_is_not_taken_for_a_report(tmp_path):
    """Found in a walkthrough: a folder holding only a hand-written report.md was taken for an
    earlier report and the file overwritten (one holding notes.txt was refused). A folder is
    a report's when it holds what a report writes and a person would not; a ``--from``
    report's own folder still takes a rerun."""
    from securefed.training import TrainConfig, train

    run = train(
        TrainConfig(model="mostpop", synthetic_users=60, synthetic_items=300),
        out=tmp_path / "run",
    ).run_dir
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "report.md").write_text("my notes\n")
    for args in (["--models", "mostpop", "--seeds", "1"], ["--from", str(run)]):
        result = _invoke(*args, "--out", str(mine))
        assert result.exit_code == 2, result.output
        lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and "already holds other files" in lines[0], result.stderr
        assert [p.name for p in mine.iterdir()] == ["report.md"]
        assert (mine / "report.md").read_text() == "my notes\n"
    page = tmp_path / "page"
    for _ in range(2):  # written, then rewritten in place
        result = _invoke("--from", str(run), "--out", str(page))
        assert result.exit_code == 0, result.output + str(result.exception)
    assert (page / "recommendations.json").exists() and (page / "report.md").exists()


def test_summary_picks_the_lowest_epsilon_meeting_the_floor():
    rows = []
    for defense, eps, hr in [
        ("none", math.inf, 0.60),
        ("dp", 1.0, 0.30),
        ("dp", 2.0, 0.52),
        ("dp", 8.0, 0.58),
        ("dp+secagg", 2.0, 0.49),
        ("dp+secagg", 8.0, 0.57),
    ]:
        rows.append(
            {
                "model": "fedrap",
                "defense": defense,
                "epsilon": eps,
                "seed": 0,
                "test_hr@10": hr,
                "test_ndcg@10": hr / 2,
                "test_full_hr@10": hr / 4,
                "epsilon_spent": eps,
                "seconds": 1.0,
            }
        )
    frame = pd.DataFrame(rows)
    (sentence,), floors = summarise(frame, 0.5)
    assert "ε = 2 with dp " in sentence and floors["fedrap"] == 0.5
    (sentence,), _ = summarise(frame, 0.55)
    assert "ε = 8 with dp " in sentence and "dp+secagg also meets it" in sentence
    (sentence,), _ = summarise(frame, 0.59)
    assert "no private setting meets" in sentence and "none meet it" in sentence
    (sentence,), floors = summarise(frame, None)  # default: 90 % of no-DP HR@10 = 0.54
    assert floors["fedrap"] == pytest.approx(0.54) and "ε = 8 with dp " in sentence


def _with_baselines(rows, mostpop, dp_mostpop):
    """Rows with the baseline columns a report reads (one split, DP-MostPop per epsilon)."""
    frame = pd.DataFrame(rows)
    frame["role"] = "federated"
    frame["test_full_ndcg@10"] = frame["test_hr@10"] / 8
    # Each metric relates to sampled HR@10 as in _row (NDCG / 2, full HR / 4, full NDCG / 8).
    for m, f in (("test_hr@10", 1), ("test_ndcg@10", 2), ("test_full_hr@10", 4),
                 ("test_full_ndcg@10", 8)):  # fmt: skip
        frame[f"baseline_random_{m}"] = 0.01 / f
        frame[f"baseline_mostpop_{m}"] = mostpop / f
        frame[f"baseline_dp_mostpop_{m}"] = [
            dp_mostpop.get(e, math.nan) / f if d.startswith("dp") else math.nan
            for e, d in zip(frame["epsilon"], frame["defense"], strict=True)
        ]
    return frame


def _row(defense, eps, hr, model="fedrecgel"):
    return {
        "model": model, "defense": defense, "epsilon": eps, "seed": 0, "test_hr@10": hr,
        "test_ndcg@10": hr / 2, "test_full_hr@10": hr / 4, "epsilon_spent": eps, "seconds": 1.0,
        "dataset": "ml-100k", "seconds_per_round": 1.0, "secagg_seconds_per_round": math.nan,
    }  # fmt: skip


def test_a_tie_in_hits_is_not_below_whatever_the_float_rounding_of_its_mean():
    """Two seeds with 77 and 81 hits of 943 tie MostPop's 79 of 943 on both: their mean
    differs from it only by float rounding, which is not below it; one hit fewer is."""
    from securefed.report.html import _below

    mean = (77 / 943 + 81 / 943) / 2
    assert mean != 79 / 943  # the rounding this is about
    row = {"epsilon": 1.0, "hr": 0.5, "full_hr": mean, "mostpop_hr": 0.4,
           "mostpop_full_hr": 79 / 943}  # fmt: skip
    assert _below(row) == []
    row["full_hr"] = 78 / 943
    assert _below(row) == ["MostPop (full HR@10 0.0827 < 0.0838)"]


def test_a_floor_from_a_no_dp_run_below_the_count_is_called_a_low_bar():
    """The default floor is 90 % of the model's best no-DP HR@10; where that run is itself
    below MostPop, the sentence that states the floor says so (FedRAP on MovieLens 100K:
    0.186 against 0.402), and says nothing where it is above."""
    rows = [_row("none", math.inf, 0.19), _row("dp", 2.0, 0.43)]
    (sentence,), _ = summarise(_with_baselines(rows, 0.40, {2.0: 0.42}), None)
    assert (
        "(90 % of its best no-DP HR@10, 0.1900, itself below MostPop's 0.4000: a low bar; "
        "set --min-hr)" in sentence
    )
    rows = [_row("none", math.inf, 0.66), _row("dp", 2.0, 0.45)]
    (sentence,), _ = summarise(_with_baselines(rows, 0.40, {2.0: 0.42}), None)
    assert "low bar" not in sentence


def test_a_cell_below_mostpop_is_flagged_and_never_the_best_private_one():
    # The issue-18 case: every private cell below MostPop (0.40); the highest at epsilon 8.
    rows = [_row("none", math.inf, 0.42), _row("dp", 2.0, 0.0976), _row("dp", 8.0, 0.12)]
    frame = _with_baselines(rows, mostpop=0.40, dp_mostpop={2.0: 0.39, 8.0: 0.40})
    (sentence,), _ = summarise(frame, None)
    assert "best private one" not in sentence
    assert "every private setting is below a baseline" in sentence
    assert "BELOW MostPop (sampled HR@10 0.1200 < 0.4000" in sentence
    assert "DP-MostPop at ε = 8 (sampled HR@10 0.1200 < 0.4000" in sentence
    flags = baseline_flags(frame)
    assert [f.split(":")[0] for f in flags] == ["fedrecgel · dp · ε = 2", "fedrecgel · dp · ε = 8"]
    assert all("BELOW MostPop" in f and "DP-MostPop" in f for f in flags)
    # A private cell above MostPop and DP-MostPop can be the best private one; one that beats
    # MostPop but not DP-MostPop at its epsilon cannot.
    rows = [_row("none", math.inf, 0.9), _row("dp", 2.0, 0.45), _row("dp", 8.0, 0.5)]
    frame = _with_baselines(rows, mostpop=0.40, dp_mostpop={2.0: 0.39, 8.0: 0.55})
    (sentence,), _ = summarise(frame, None)
    assert "the best private one above its baselines is dp at ε = 2 " in sentence
    assert baseline_flags(frame) == [
        "fedrecgel · dp · ε = 8: BELOW DP-MostPop at ε = 8 (sampled HR@10 0.5000 < 0.5500, "
        "full HR@10 0.1250 < 0.1375)."
    ]
    # A setting that meets the floor but loses to MostPop says so in the same sentence.
    rows = [_row("none", math.inf, 0.30), _row("dp", 2.0, 0.29)]
    (sentence,), _ = summarise(_with_baselines(rows, 0.40, {2.0: 0.2}), None)
    assert "ε = 2 with dp" in sentence and "It is BELOW MostPop" in sentence


def test_the_disk_estimate_counts_what_cells_keep_not_their_deleted_checkpoints():
    """A finished cell keeps its metrics and its audit's scores; its checkpoints and released
    model are deleted, so they count only towards the peak, one running cell (per job) at a
    time; its audit's replay checkpoints and recording too (the recording was not counted)."""
    from attacks.audit import estimate_audit_disk, kept_bytes_bound
    from securefed.costs import RunShape, estimate_run, run_files_bytes
    from securefed.report.sweep import REPORT_PAGES_BYTES, REPORT_ROW_BYTES
    from securefed.training import load_split

    cfg = ReportConfig(
        models=("fedrap",), dataset="synthetic", synthetic_users=60, synthetic_items=400,
        epsilons=(1.0, math.inf), defenses=("none", "secagg"), seeds=2, rounds=2,
    )  # fmt: skip
    cells, _ = plan_cells(cfg)
    todo = [(c.name, c.train_config(cfg), c.audited) for c in cells]
    est = estimate_sweep(cfg, todo, speed=1.0)
    shape = RunShape.of(load_split(todo[0][1]))
    runs_ = [estimate_run(c, shape, speed=1.0) for _, c, _ in todo]
    audits = {n: kept_bytes_bound(c, shape.users, shape.items) for n, c, a in todo if a}
    assert len(audits) == 4  # fedrap none / secagg, two seeds; the references are not audited
    # Under secure aggregation the per-client attacks are skipped: fewer score matrices.
    assert audits["fedrap-secagg-epsinf-s0"] < audits["fedrap-none-epsinf-s0"]
    disk = {n: estimate_audit_disk(c, shape) for n, c, a in todo if a}
    assert all(d.scores == audits[n] and d.recording > 0 for n, d in disk.items())
    files = sum(run_files_bytes(c) for _, c, _ in todo)
    pages = REPORT_PAGES_BYTES + REPORT_ROW_BYTES * len(todo)
    kept = sum(r.disk_final - r.model_bytes for r in runs_) + files + pages
    kept += sum(d.kept for d in disk.values())
    assert est.disk_bytes == kept
    assert est.disk_bytes - pages < sum(r.checkpoint_bytes for r in runs_)
    # The audit's replay adds 256 canary clients, each with FedRAP's private state: its
    # checkpoints and recording, beside what the cell keeps, are the largest running cell.
    largest = max(d.peak for d in disk.values())
    assert largest > max(r.disk_peak for r in runs_) * (shape.users + 256) / shape.users
    assert est.running_disk >= largest
    assert est.disk_peak == est.disk_bytes - pages + max(est.running_disk, pages)
    assert "of disk kept" in est.line() and "at most while cells run" in est.line()
    # An audited cell's time: its training, the replay (canaries added) and the scoring of
    # every chosen attack's matrix; fewer attacks under secure aggregation.
    from attacks.audit import estimate_audit_seconds

    plain, secure = (
        next(c for n, c, _ in todo if n == f"fedrap-{d}-epsinf-s0") for d in ("none", "secagg")
    )
    t = 1.0
    assert estimate_audit_seconds(plain, 60, 400, t) > 2 * t * (60 + 256) / 60
    assert estimate_audit_seconds(secure, 60, 400, t) < estimate_audit_seconds(plain, 60, 400, t)
    assert est.cells["fedrap-none-epsinf-s0"] > est.cells["ials-centralized-s0"]


def test_audit_time_counts_the_users_the_rounds_observe():
    """An audit of 300 clients of a 29,858 x 40,981 population records and scores those 300
    users' rows: its fixed costs are a hundredth of an audit that observes every user (the
    estimate said 2.9 h for such a 98 s audit when it counted all users)."""
    from attacks.audit import estimate_audit_seconds
    from securefed.config import TrainConfig

    users, items = 29_858, 40_981
    few = TrainConfig(model="fedrap", rounds=1, clients_per_round=300)
    every = TrainConfig(model="fedrap", rounds=1)
    t_few = estimate_audit_seconds(few, users, items, 0.0, attacks=["imia"])
    t_every = estimate_audit_seconds(every, users, items, 0.0, attacks=["imia"])
    assert t_every > 30 * t_few and t_few < 300
    more_rounds = TrainConfig(model="fedrap", rounds=10, clients_per_round=300)
    assert estimate_audit_seconds(more_rounds, users, items, 0.0, attacks=["imia"]) > 5 * t_few


# ---------------------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def swept(tmp_path_factory) -> Path:
    """A small audited grid through the CLI: FedRAP, eps {1, inf}, all four defenses."""
    out = tmp_path_factory.mktemp("report") / "r"
    result = _invoke(
        "--models", "fedrap", *SMALL, "--rounds", "2", "--epsilons", "1,inf",
        "--seeds", "1", "--min-hr", "0.05", "--out", str(out),
    )  # fmt: skip
    assert result.exit_code == 0, result.output + str(result.exception)
    return out


@pytest.mark.slow
def test_sweep_writes_every_file_with_one_complete_row_per_cell(swept):
    for name in ("report.html", "report.md", "results.csv", "results.parquet"):
        assert (swept / name).stat().st_size > 0, name
    for fig in FIGURES:
        assert (swept / "figures" / f"{fig}.png").stat().st_size > 1000, fig
        assert (swept / "figures" / f"{fig}.svg").read_text().lstrip().startswith("<?xml")
    csv = pd.read_csv(swept / "results.csv")
    cells = sorted(p.name for p in (swept / "cells").iterdir())
    assert sorted(csv["cell"]) == cells == sorted(
        ["fedrap-none-epsinf-s0", "fedrap-secagg-epsinf-s0", "fedrap-dp-eps1-s0",
         "fedrap-dp+secagg-eps1-s0", "ials-centralized-s0", "ease-centralized-s0"]
    )  # fmt: skip
    missing = csv[list(REQUIRED_COLUMNS)].isna().sum()
    assert missing.sum() == 0, missing[missing > 0]
    # Every cell is audited, or the report names why its audit failed (utility still stands);
    # the centralized references have no uploads and are not audited.
    central = csv["role"] == "centralized"
    assert (csv.loc[central, "defense"] == CENTRALIZED).all() and not csv.loc[central, "dp"].any()
    assert not csv.loc[central, "audited"].any()
    fed = csv[~central]
    assert (fed["audited"] | fed["audit_error"].astype("string").fillna("").ne("")).all()
    assert fed.loc[fed["defense"].isin(["none", "dp", "dp+prior"]), "audited"].all()
    assert fed.loc[fed["audited"], "epsilon_lower_bound"].notna().all()
    for _, row in fed[~fed["audited"]].iterrows():
        assert f"The audit of {row['cell']} failed" in (swept / "report.md").read_text()
    # FedRAP's dp cell ran its private mode (the prior), its dp+secagg cell could not; a
    # finished cell keeps no model file, the prior's released counts and the audit's included.
    shares = dict(zip(csv["cell"], csv["prior_share"], strict=True))
    assert shares["fedrap-dp-eps1-s0"] == 0.9
    assert all(math.isnan(v) for c, v in shares.items() if c != "fedrap-dp-eps1-s0")
    assert "Private modes: the dp+prior rows (fedrap)" in (swept / "report.md").read_text()
    assert csv.loc[csv["cell"] == "fedrap-dp-eps1-s0", "defense"].tolist() == ["dp+prior"]
    assert not list((swept / "cells").rglob("*.pt"))
    # What the sweep kept is within the disk estimate it printed, which is a bound (the least
    # compressible scores measured) but not a loose one.
    cfg = ReportConfig(
        models=("fedrap",), dataset="synthetic", synthetic_users=60, synthetic_items=400,
        rounds=2, epsilons=(1.0, math.inf), seeds=1,
    )  # fmt: skip
    planned, _ = plan_cells(cfg)
    est = estimate_sweep(cfg, [(c.name, c.train_config(cfg), c.audited) for c in planned])
    kept = sum(f.stat().st_size for f in (swept / "cells").rglob("*") if f.is_file())
    assert kept <= est.disk_bytes <= 20 * kept, (kept, est.disk_bytes)
    dp = csv[csv["dp"]]
    assert (dp["epsilon_spent"] <= dp["epsilon"] + 1e-9).all()
    assert np.isinf(csv.loc[~csv["dp"], "epsilon_spent"]).all()
    assert csv.loc[csv["secagg"], "secagg_seconds_per_round"].gt(0).all()
    parquet = pd.read_parquet(swept / "results.parquet")
    assert len(parquet) == len(csv) and list(parquet.columns) == list(csv.columns)
    md = (swept / "report.md").read_text()
    assert "not run because they mean nothing" in md and "dp at epsilon inf" in md
    assert "HR@10 ≥ 0.05 (--min-hr)" in md
    # Every threat model of the setup is described, not just named.
    threats = next(line for line in md.splitlines() if "Threat models of the attacks" in line)
    for name in ("upload-observer", "aggregate-observer", "release-observer"):
        assert f"{name}: " in threats and f"{name}: {name}" not in threats


@pytest.mark.slow
def test_every_row_carries_its_baselines_from_the_same_split(swept):
    from securefed.baselines import baseline_metrics
    from securefed.config import TrainConfig, load_config_file
    from securefed.training import load_split

    csv = pd.read_csv(swept / "results.csv")
    dp = csv["dp"]
    assert csv.loc[dp, list(DP_BASELINE_COLUMNS)].notna().all().all()
    assert csv.loc[~dp, list(DP_BASELINE_COLUMNS)].isna().all().all()
    row = csv[csv["cell"] == "fedrap-dp-eps1-s0"].iloc[0]
    cfg = TrainConfig.from_dict(load_config_file(Path(row["run_dir"]) / "config.toml"))
    want = baseline_metrics(load_split(cfg), seed=0, epsilon=1.0)
    for col in (*BASELINE_COLUMNS, *DP_BASELINE_COLUMNS):
        assert row[col] == pytest.approx(want[col], abs=1e-6), col
    assert row["lift_over_mostpop_test_hr@10"] == pytest.approx(
        row["test_hr@10"] / row["baseline_mostpop_test_hr@10"]
    )
    below = csv["test_hr@10"] < csv["baseline_mostpop_test_hr@10"]
    assert (csv.loc[below, "verdict"].str.contains("BELOW MostPop")).all()
    md = (swept / "report.md").read_text()
    header = next(line for line in md.splitlines() if line.startswith("| model | defense"))
    for name in ("MostPop HR@10", "DP-MostPop HR@10 at this ε", "against the baselines"):
        assert name in header
    table = [line for line in md.splitlines() if line.startswith("| ")]
    assert any(line.startswith("| MostPop (item counts, same split) |") for line in table)
    assert any(line.startswith("| random scores (expected, same split) |") for line in table)
    for ref in ("ials", "ease"):
        assert any(line.startswith(f"| {ref} (CENTRALIZED reference") for line in table), ref
    # Every key-table row whose mean is below MostPop's says so in words.
    for (model, defense, eps), part in csv.groupby(["model", "defense", "epsilon"]):
        line = next(
            ln for ln in table
            if ln.startswith(f"| {model}") and f"| {defense} |" in ln
            and (f"| {eps:g} |" in ln or (math.isinf(eps) and "| ∞ (no DP) |" in ln))
        )  # fmt: skip
        is_below = part["test_hr@10"].mean() < part["baseline_mostpop_test_hr@10"].mean() - 1e-9
        assert ("BELOW" in line and "MostPop" in line.split("BELOW")[1]) == is_below, line
    svg = (swept / "figures" / "frontier.svg").read_text()
    for label in ("MostPop (same split)", "DP-MostPop at that ε", "ials (CENTRALIZED"):
        assert label in svg, label


@pytest.mark.slow
def test_old_cells_without_baselines_get_them_from_their_split(swept, tmp_path):
    old = tmp_path / "old"
    for name in ("fedrap-dp-eps1-s0", "fedrap-none-epsinf-s0"):
        shutil.copytree(swept / "cells" / name, old / "cells" / name)
        path = old / "cells" / name / "summary.json"
        summary = json.loads(path.read_text())
        kept = {
            k: v for k, v in summary.items()
            if not k.startswith(("baseline_", "lift_over_")) and k != "verdict"
        }  # fmt: skip
        assert len(kept) < len(summary)
        path.write_text(json.dumps(kept))
    result = build_report([old], tmp_path / "page")
    new = result.results.set_index("cell")
    ref = pd.read_csv(swept / "results.csv").set_index("cell")
    cols = [*BASELINE_COLUMNS, *DP_BASELINE_COLUMNS]
    for cell in new.index:
        assert new.loc[cell, "baselines_from"].startswith("split")
        for col in cols:
            a, b = new.loc[cell, col], ref.loc[cell, col]
            assert (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, abs=1e-6), col
    assert "MostPop (item counts, same split)" in result.markdown.read_text()


@pytest.mark.slow
def test_report_from_existing_directories(swept, tmp_path):
    cells = sorted((swept / "cells").iterdir())[:2]
    result = _invoke("--from", str(cells[0]), str(cells[1]), "--out", str(tmp_path / "again"))
    assert result.exit_code == 0, result.output + str(result.exception)
    csv = pd.read_csv(tmp_path / "again" / "results.csv")
    assert sorted(csv["cell"]) == [c.name for c in cells]
    assert (tmp_path / "again" / "report.html").exists()


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


_PROBE = """<script>window.addEventListener("load", () => {
  const r = [];
  document.querySelectorAll("img, svg").forEach((e) => {
    const b = e.getBoundingClientRect();
    r.push({tag: e.tagName, natural: e.naturalWidth ?? 1, w: b.width, h: b.height,
            complete: e.complete ?? true});
  });
  const p = document.createElement("pre"); p.id = "probe"; p.textContent = JSON.stringify(r);
  document.body.appendChild(p); console.log("probe-ready");
});</script>"""


def _headless(browser: str, profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    profile.mkdir(exist_ok=True)
    return subprocess.run(
        [
            browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0", *args,
        ],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


@pytest.mark.slow
def test_html_renders_in_headless_chromium_with_every_figure_visible(swept, tmp_path):
    browser = _chromium()
    if browser is None:
        pytest.skip("chromium is not installed (run .ci/install-chromium.sh)")
    page = (swept / "report.html").read_text()
    assert "http://" not in page and "https://" not in page and "<script" not in page
    # DOM: every figure present and laid out with a non-zero size (probe injected in a copy).
    probed = tmp_path / "probe.html"
    probed.write_text(page.replace("</body>", _PROBE + "</body>"))
    dom = _headless(
        browser, tmp_path / "p1", "--virtual-time-budget=5000", "--dump-dom", probed.as_uri()
    )
    assert dom.returncode == 0, dom.stderr[-2000:]
    start = dom.stdout.index('<pre id="probe">') + len('<pre id="probe">')
    figs = json.loads(dom.stdout[start : dom.stdout.index("</pre>", start)].replace("&quot;", '"'))
    assert len(figs) == len(FIGURES)
    for f in figs:
        assert f["complete"] and f["natural"] > 0 and f["w"] > 100 and f["h"] > 100, f
    console = [ln for ln in dom.stderr.splitlines() if "CONSOLE" in ln]
    assert len(console) == 1 and "probe-ready" in console[0], console  # capture works, no errors
    # Screenshot of the real page: not blank, and ink all the way down (figures drawn).
    shot = tmp_path / "shot.png"
    res = _headless(
        browser, tmp_path / "p2", "--hide-scrollbars", "--window-size=1280,7000",
        f"--screenshot={shot}", (swept / "report.html").as_uri(),
    )  # fmt: skip
    assert res.returncode == 0 and shot.exists(), res.stderr[-2000:]
    assert not [ln for ln in res.stderr.splitlines() if "CONSOLE" in ln]
    from PIL import Image

    img = np.asarray(Image.open(shot).convert("L"), dtype=np.float64)
    assert img.std() > 10
    inked = np.nonzero((img < 200).any(axis=1))[0]
    assert inked.size > 0.3 * img.shape[0] * (inked.max() / img.shape[0])
    assert inked.max() > 3000  # the page runs past the first figures


# ---------------------------------------------------------------------------- resumption


class _Stop(Exception):
    pass


@pytest.mark.slow
def test_interrupted_sweep_resumes_to_the_same_results(tmp_path):
    cfg = ReportConfig(
        models=("fedrecgel",),
        dataset="synthetic",
        synthetic_users=60,
        synthetic_items=400,
        rounds=2,
        epsilons=(1.0, math.inf),
        seeds=1,
        audit=False,
    )
    whole = run_report(cfg, out=tmp_path / "whole")

    events: list[SweepEvent] = []

    def stop_after_two(ev: SweepEvent) -> None:
        events.append(ev)
        if ev.kind == "done" and ev.done == 2:
            raise _Stop

    with pytest.raises(_Stop):
        run_report(cfg, out=tmp_path / "cut", progress=stop_after_two)
    assert not (tmp_path / "cut" / "results.csv").exists()
    finished = [p for p in (tmp_path / "cut" / "cells").iterdir() if (p / "summary.json").exists()]
    assert len(finished) == 2
    assert not [p for p in finished if (p / "checkpoint.pt").exists()]  # only while training

    events.clear()
    resumed = run_report(cfg, out=tmp_path / "cut", progress=events.append)
    plan = events[0]
    # four fedrecgel cells and the two centralized references (ials, ease)
    assert plan.kind == "plan" and (plan.done, plan.total) == (2, 6)
    assert sum(e.kind == "done" for e in events) == 4  # only the unfinished cells ran
    assert not list((tmp_path / "cut" / "cells").rglob("*.pt"))
    a = pd.read_csv(whole.csv)[QUALITY]
    b = pd.read_csv(resumed.csv)[QUALITY]
    pd.testing.assert_frame_equal(a, b)
    md = resumed.markdown.read_text()
    assert "This sweep ran no attack audit (--no-audit)" in md and "attacks.png" not in md
    assert not (resumed.out / "figures" / "attacks.png").exists()


@pytest.mark.slow
def test_rerun_with_other_settings_into_the_same_directory_is_refused(tmp_path):
    base = dict(
        models=("fedrecgel",), dataset="synthetic", synthetic_users=60, synthetic_items=400,
        epsilons=(math.inf,), defenses=("none",), seeds=1, audit=False,
    )  # fmt: skip
    run_report(ReportConfig(**base, rounds=1), out=tmp_path / "r")
    with pytest.raises(ConfigError, match="was run with other settings"):
        run_report(ReportConfig(**base, rounds=2), out=tmp_path / "r")


def test_a_finished_private_fedals_cell_is_reused_by_the_same_command(tmp_path):
    """config.toml records what the private fedals settled on the data (its mode, the
    population rule); the same grid run again compares against its own settled config and
    reuses the cell (it used to refuse it as "run with other settings", found 2026-12-06)."""
    cfg = ReportConfig(
        models=("fedals",), dataset="synthetic", synthetic_users=300, synthetic_items=200,
        rounds=2, epsilons=(2.0,), defenses=("dp",), seeds=1, audit=False, references=(),
    )  # fmt: skip
    run_report(cfg, out=tmp_path / "r")
    events: list[SweepEvent] = []
    run_report(cfg, out=tmp_path / "r", progress=events.append)
    assert events[0].kind == "plan" and events[0].done == events[0].total
    assert not any(e.kind == "done" for e in events)


@pytest.mark.slow
def test_parallel_jobs_give_the_same_results_as_one_job(tmp_path):
    cfg = dict(
        models=("fedrecgel",), dataset="synthetic", synthetic_users=60, synthetic_items=400,
        rounds=2, epsilons=(1.0, math.inf), seeds=1, audit=False,
    )  # fmt: skip
    one = run_report(ReportConfig(**cfg, jobs=1), out=tmp_path / "one")
    done: list[tuple[float, float]] = []  # (seconds reported, when)
    events: list[SweepEvent] = []

    def progress(event: SweepEvent) -> None:
        events.append(event)
        if event.kind == "done":
            done.append((event.seconds, time.perf_counter()))

    t0 = time.perf_counter()
    two = run_report(ReportConfig(**cfg, jobs=2), out=tmp_path / "two", progress=progress)
    # Each cell's seconds are its own, not its wait in the queue: two workers cannot have
    # spent more than twice the sweep's time (the time since submission summed to more).
    seconds = [s for s, _ in done]
    assert len(seconds) == 6 and min(seconds) > 0  # 4 model cells, 2 references
    # Every cell starts once, before it is done, and never more than two run at once.
    in_flight: set[str] = set()
    for e in events:
        if e.kind == "start":
            assert e.cell not in in_flight and len(in_flight) < 2
            in_flight.add(str(e.cell))
        elif e.kind == "done":
            in_flight.remove(str(e.cell))
    assert not in_flight
    assert sorted(str(e.cell) for e in events if e.kind == "start") == sorted(
        str(e.cell) for e in events if e.kind == "done"
    )
    assert sum(seconds) <= 2 * (done[-1][1] - t0)
    cols = ["cell", "test_hr@10", "test_ndcg@10", "epsilon_spent"]
    pd.testing.assert_frame_equal(
        pd.read_csv(one.csv)[cols], pd.read_csv(two.csv)[cols], check_exact=False, atol=1e-6
    )


@pytest.mark.slow
def test_a_failing_audit_is_reported_and_the_sweep_goes_on(tmp_path, monkeypatch):
    import attacks.audit

    def broken(*args, **kwargs):
        raise ConfigError("audit exploded on purpose")

    monkeypatch.setattr(attacks.audit, "audit", broken)
    cfg = ReportConfig(
        models=("fedrecgel",), dataset="synthetic", synthetic_users=60, synthetic_items=400,
        rounds=1, epsilons=(math.inf,), defenses=("none",), seeds=1, audit=True,
    )  # fmt: skip
    result = run_report(cfg, out=tmp_path / "r")
    row = result.results.iloc[0]
    assert not row["audited"] and row["audit_error"] == "audit exploded on purpose"
    assert "The audit of fedrecgel-none-epsinf-s0 failed: audit exploded" in (
        result.markdown.read_text()
    )
    assert (tmp_path / "r" / "cells" / row["cell"] / "audit" / "failed.json").exists()


@pytest.mark.slow
def test_a_reference_too_costly_for_the_catalogue_is_left_out_with_a_note(tmp_path, monkeypatch):
    import securefed.report.sweep

    monkeypatch.setattr(securefed.report.sweep, "REFERENCE_MAX_ITEMS", {"ease": 399})
    cfg = ReportConfig(
        models=("mostpop",), dataset="synthetic", synthetic_users=60, synthetic_items=400,
        epsilons=(math.inf,), defenses=("none",), seeds=1, audit=False,
    )  # fmt: skip
    result = run_report(cfg, out=tmp_path / "r")
    assert sorted(result.results["cell"]) == ["ials-centralized-s0", "mostpop-none-epsinf-s0"]
    assert any(n.startswith("The ease reference was left out") for n in result.notes)
    assert "The ease reference was left out" in result.markdown.read_text()


def test_a_missing_report_dependency_is_refused_before_any_cell_trains(tmp_path, monkeypatch):
    import importlib.util

    from securefed import report as report_mod
    from securefed.errors import ConfigError

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "pyarrow" else real(name, *a)
    )
    cfg = report_mod.ReportConfig(models=("mostpop",), epsilons=(math.inf,), defenses=("none",))
    with pytest.raises(ConfigError, match="pyarrow \\(for results.parquet\\).*pip install pyarrow"):
        report_mod.run_report(cfg, out=tmp_path / "r")
    assert not (tmp_path / "r").exists()


def test_report_from_runs_of_other_splits_or_one_seed_twice_is_refused(tmp_path):
    """``--from`` averages each setting over its runs: a train run and an audit's run (which
    adds canary users) of one seed were read as two seeds on two user sets (found in a
    walkthrough). Runs of one split, one per seed, are reported; the rest is one line."""
    from securefed.errors import DataError
    from securefed.report import collect_results
    from securefed.training import TrainConfig, train

    def run(name, **kw):
        cfg = TrainConfig(model="mostpop", **{"synthetic_users": 60, "synthetic_items": 300, **kw})
        return train(cfg, out=tmp_path / name).run_dir

    s0, s1, wide = run("s0", seed=0), run("s1", seed=1), run("wide", seed=2, synthetic_users=70)
    assert sorted(collect_results([s0, s1])["seed"]) == [0, 1]
    shutil.copytree(s0, tmp_path / "s0-again")
    with pytest.raises(DataError, match="are both mostpop none at epsilon inf, seed 0"):
        collect_results([s0, tmp_path / "s0-again"])
    notes: list[str] = []
    assert len(collect_results([s0, wide], notes)) == 2  # e.g. cells of an older report
    assert any("different user sets (60, 70 users of synthetic" in n for n in notes)
    rows = [f"{u},{(u * 7 + j) % 200},{u * 100 + j}" for u in range(30) for j in range(12)]
    (tmp_path / "log.csv").write_text("user,item,timestamp\n" + "\n".join(rows) + "\n")
    other = train(
        TrainConfig(model="mostpop", dataset=str(tmp_path / "log.csv")), out=tmp_path / "o"
    )
    with pytest.raises(DataError, match="the runs are of 2 datasets"):
        collect_results([s0, other.run_dir])
    result = _invoke("--from", str(s0), str(tmp_path / "s0-again"), "--out", str(tmp_path / "page"))
    assert result.exit_code == 2 and "are both mostpop none" in result.output
    assert not (tmp_path / "page").exists()


def test_results_attack_columns_follow_the_attack_registry() -> None:
    """Found in a walkthrough: results.csv's attack columns (and the attack plot's panels)
    came in the order the rows first held them, a secure-aggregation cell's aggregate attacks
    before the per-client ones and a new attack before IMIA; now the registry's order."""
    from securefed.report.sweep import _in_attack_order

    columns = ["model", "union:auc", "union:auc:lo", "seed", "released:auc", "row-change:auc"]
    columns += ["attribute-gender:auc", "gone:auc", "intersection:f1", "verdict"]
    assert _in_attack_order(columns) == [
        "model",
        "seed",
        "verdict",
        "row-change:auc",
        "intersection:f1",
        "attribute-gender:auc",
        "union:auc",
        "union:auc:lo",
        "released:auc",
        "gone:auc",
    ]


def test_a_resumed_cell_is_audited_by_a_replay_of_its_config(tmp_path, monkeypatch):
    """A cell interrupted and resumed released a round again; audit --run refuses such a run
    (no re-simulation is it), and the report then named the audit as failed with advice it
    cannot act on (found in review): it audits a replay of the cell's config instead."""
    import attacks.audit as audit_module
    from attacks.audit import ResumedRun
    from securefed.report.sweep import _run_cell
    from securefed.training import TrainConfig, train

    cfg = TrainConfig(model="fedals", rounds=2, synthetic_users=40, synthetic_items=200)
    cell = tmp_path / "cell"
    train(cfg, out=cell)
    calls = []

    def fake(config, *, out, progress=None):
        calls.append(config)
        if config.run is not None:
            raise ResumedRun("resumed")
        out.mkdir(parents=True)
        (out / "audit.json").write_text("{}")

    monkeypatch.setattr(audit_module, "audit", fake)
    _run_cell(cell, cfg, audit=True)
    assert [c.run for c in calls] == [str(cell), None]
    assert calls[1].train.model == "fedals" and calls[1].train.rounds == 2
    assert (cell / "audit" / "audit.json").exists()
    assert not (cell / "audit" / "failed.json").exists()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"epsilons": "12"}, "epsilons must be a list of numbers, got '12'"),
        ({"epsilons": 2}, "epsilons must be a list of numbers, got 2"),
        ({"epsilons": (2, "x")}, "epsilons must be a list of numbers"),
        ({"models": "fedals"}, "models must be a list of strings, got 'fedals'"),
        ({"delta": "1e-5"}, "delta must be a number, got '1e-5'"),
        ({"min_hr": "0.5"}, "min_hr must be a number, got '0.5'"),
    ],
)
def test_report_config_checks_types_before_reading_them(kwargs, message):
    """Found by a library walkthrough: ``epsilons="12"`` was read a character at a time (two
    cells, epsilons 1 and 2), ``models="fedals"`` said "got 'f'", and a string delta leaked
    Python's TypeError."""
    with pytest.raises(ConfigError) as err:
        ReportConfig(**kwargs)
    assert str(err.value).startswith(message), str(err.value)


def test_audit_config_checks_types_and_takes_a_mapping_for_train():
    from attacks.audit import AuditConfig

    with pytest.raises(ConfigError, match="attacks must be a list of strings, got 'all'"):
        AuditConfig(attacks="all")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="train must be a TrainConfig"):
        AuditConfig(train=3)  # type: ignore[arg-type]
    assert AuditConfig(train={"model": "mostpop"}).train.model == "mostpop"  # type: ignore[arg-type]


def test_a_catalogue_too_small_for_canaries_is_refused_before_any_cell_trains(tmp_path):
    """Found by a library walkthrough: with 200 items every cell trained and then every audit
    failed (canary clients need 202 real items), said only in the report's notes."""
    cfg = ReportConfig(
        models=("fedals",), references=(), dataset="synthetic", synthetic_users=60,
        synthetic_items=200, epsilons=(2.0,), defenses=("dp",), seeds=1, audit=True,
    )  # fmt: skip
    out = tmp_path / "r"
    with pytest.raises(ConfigError, match="canary clients need at least 202 real items"):
        run_report(cfg, out=out)
    assert not out.exists()
