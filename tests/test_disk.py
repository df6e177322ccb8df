"""Small footprints on disk (issue 18, point 3): compact FedRAP checkpoints that resume to the
same bits, finished runs that keep their released model and no client's private state,
audits that keep their recordings only when asked, reports that drop a cell's checkpoint once
the cell is finished."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from securefed import runs
from securefed.models.fedrap import FedRAP, FedRAPConfig
from securefed.training import TrainConfig, build_model, load_split, train

# A catalogue much larger than what a user samples in a round (about 5 x 80 pairs), so the
# rows touched in the first rounds are a minority and the checkpoint is the sparse form.
SPARSE = dict(
    model="fedrap",
    synthetic_users=40,
    synthetic_items=2000,
    params=FedRAPConfig(local_epochs=2),
)


def _cfg(**kw) -> TrainConfig:
    return TrainConfig(**{**SPARSE, **kw})


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32)


def _assert_same_state(a: FedRAP, b: FedRAP) -> None:
    for key in ("C", "D", "w", "b", "_d_scale"):
        assert torch.equal(_bits(getattr(a, key)), _bits(getattr(b, key))), key
    assert (a.lr_args, a.lr_network) == (b.lr_args, b.lr_network)


def test_resume_from_a_sparse_checkpoint_equals_the_uninterrupted_run_bit_for_bit(tmp_path):
    full = train(_cfg(rounds=4), out=tmp_path / "full")

    def stop_at_2(record):
        if record.round == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(_cfg(rounds=4), out=tmp_path / "cut", progress=stop_at_2)
    saved = runs.load_checkpoint(tmp_path / "cut")
    assert saved["round"] == 2
    assert "D_rows" in saved["model"] and "D" not in saved["model"]  # the new, sparse form
    resumed = train(resume=tmp_path / "cut")
    _assert_same_state(full.model, resumed.model)
    keys = ("loss", "val_hr@10", "test_hr@10", "test_full_hr@10")
    assert [[m[k] for k in keys] for m in resumed.metrics] == [
        [m[k] for k in keys] for m in full.metrics
    ]


def test_a_sparse_checkpoint_stores_only_rows_training_wrote(tmp_path, monkeypatch):
    touched: set[tuple[int, int]] = set()
    plan_round = FedRAP.plan_round

    def recording(self, participants, generator):
        plan = plan_round(self, participants, generator)
        users = plan.participants[plan.sample_user].tolist()
        touched.update(zip(users, plan.sample_item.tolist(), strict=True))
        return plan

    monkeypatch.setattr(FedRAP, "plan_round", recording)
    result = train(_cfg(rounds=2, keep_private_state=True), out=tmp_path / "r")
    state = runs.load_checkpoint(tmp_path / "r")["model"]
    model = result.model
    n_users, n_items, dim = model.D.shape
    mask = torch.from_numpy(np.unpackbits(state["D_mask"].numpy(), count=n_users * n_items))
    mask = mask.view(n_users, n_items)
    stored = {(int(u), int(i)) for u, i in torch.nonzero(mask).tolist()}
    # Exactly the rows whose bits left the initial view, and each one a row a plan touched.
    fresh = build_model(_cfg(rounds=2), load_split(_cfg(rounds=2)))
    differs = (_bits(model.D) != _bits(fresh.D)).any(dim=2)
    assert stored == {(int(u), int(i)) for u, i in torch.nonzero(differs).tolist()}
    assert stored <= touched
    assert len(stored) < n_users * n_items // 2
    assert state["D_rows"].shape == (len(stored), dim)
    assert torch.equal(_bits(state["D_base"]), _bits(fresh.D[0]))
    back = build_model(_cfg(rounds=2), result.split)
    back.load_state_dict(state)
    _assert_same_state(model, back)


def test_a_mostly_rewritten_view_is_stored_dense_and_reads_back():
    cfg = _cfg(synthetic_items=300, rounds=1)
    split = load_split(cfg)
    model = build_model(cfg, split)
    initial = model.D.clone()
    model.D[:, : split.n_items // 2 + 1] += 1.0  # more than half of every user's rows
    state = model.checkpoint_state()
    assert "D" in state and "D_rows" not in state
    model.D.copy_(initial)
    model.D[0, 0, 0] = float("nan")
    sparse = model.checkpoint_state()
    assert sparse["D_rows"].shape == (1, model.config.dim)
    back = build_model(cfg, split)
    back.load_state_dict(sparse)
    assert torch.equal(_bits(back.D), _bits(model.D))


def test_a_sparse_state_that_does_not_fit_is_refused():
    cfg = _cfg(synthetic_items=300, rounds=1)
    split = load_split(cfg)
    model = build_model(cfg, split)
    model.D[1, 2] += 1.0
    state = dict(model.checkpoint_state())
    state["D_rows"] = state["D_rows"][:0]
    with pytest.raises(ValueError, match="D_rows"):
        build_model(cfg, split).load_state_dict(state)


def _files(run_dir) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(run_dir.iterdir()) if p.is_file()}


def _tensor_names(state, prefix=""):
    for key, value in state.items():
        if isinstance(value, torch.Tensor):
            yield prefix + key
        elif isinstance(value, dict):
            yield from _tensor_names(value, f"{prefix}{key}.")


def test_a_finished_fedrap_run_keeps_its_released_model_and_no_private_state(tmp_path):
    """Issue 18's target, scaled: the ML-100K run directory <= 40 MB against its 203 MB of
    private views. Here the private state (D, d_scale, w, b) is 40 x 2000 x 32 floats (10 MB):
    the finished directory holds the shared C (256 KB) and a few kilobytes of text."""
    run = tmp_path / "r"
    result = train(_cfg(rounds=2), out=run)
    n_users, n_items, dim = result.model.D.shape
    assert result.checkpoint_bytes > n_users * n_items * 4  # it was written while training
    assert sorted(p.name for p in run.iterdir()) == [
        "config.toml", "data.json", "metrics.jsonl", "model.pt", "summary.json",
    ]  # fmt: skip
    released = runs.load_state(run / runs.MODEL_FILE)
    assert released["round"] == 2 and released["model"] == "fedrap"
    assert sorted(_tensor_names(released)) == ["state.C"]  # no per-client tensor
    assert torch.equal(released["state"]["C"], result.model.C)
    c_bytes = n_items * dim * 4
    total = sum(p.stat().st_size for p in run.iterdir())
    assert total <= c_bytes + 64 * 1024
    assert total < n_users * n_items * dim * 4 // 20  # the private views alone


def test_keep_private_state_keeps_the_resume_checkpoint_of_a_finished_run(tmp_path):
    run = tmp_path / "r"
    result = train(_cfg(rounds=2, keep_private_state=True), out=run)
    saved = runs.load_checkpoint(run)
    assert saved["round"] == 2 and {"D_rows", "w", "b", "d_scale"} <= set(saved["model"])
    assert (run / runs.MODEL_FILE).exists()
    back = build_model(_cfg(rounds=2), result.split)
    back.load_state_dict(saved["model"])
    _assert_same_state(result.model, back)


def test_resuming_a_finished_run_says_so_and_changes_nothing(tmp_path):
    from typer.testing import CliRunner

    from securefed.cli import app
    from securefed.errors import ConfigError
    from securefed.training import RunFinished

    run = tmp_path / "r"
    train(_cfg(rounds=2), out=run)
    before = _files(run)
    with pytest.raises(RunFinished, match="finished all its 2 rounds"):
        train(resume=run)
    res = CliRunner().invoke(app, ["train", "--resume", str(run)])
    assert res.exit_code == 0, res.output
    assert "finished all its 2 rounds" in res.output and "round 1/" not in res.output
    assert _files(run) == before
    # Planned longer afterwards: without its private state it cannot continue, and it must
    # not start over from round 1 (which would rewrite its metrics).
    path = run / runs.CONFIG_FILE
    path.write_text(path.read_text().replace("rounds = 2", "rounds = 3"))
    before = _files(run)
    with pytest.raises(ConfigError, match="--keep-private-state") as refused:
        train(resume=run)
    assert not isinstance(refused.value, RunFinished)
    res = CliRunner().invoke(app, ["train", "--resume", str(run)])
    assert res.exit_code == 2 and "--keep-private-state" in res.output
    assert _files(run) == before


def test_an_audit_leaves_no_recording_and_no_checkpoint_unless_asked(tmp_path):
    from typer.testing import CliRunner

    from securefed.cli import app

    out = tmp_path / "audit"
    argv = ["audit", "--model", "fedrap", "--synthetic-users", "30", "--synthetic-items", "300"]
    argv += ["--rounds", "2", "--local-epochs", "1", "--canaries", "10", "--out", str(out)]
    res = CliRunner().invoke(app, [*argv, "--attacks", "row-change,union,released"])
    assert res.exit_code == 0, res.output
    assert "removed after scoring" in res.output
    rep = json.loads((out / "audit.json").read_text())
    assert rep["recorded_bytes"] > 0  # something was recorded, and then removed
    left = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert not [p for p in left if "/audit/" in p or p.startswith(".") or p.endswith(".pt")]
    assert {"audit.json", "scores.npz", "run/summary.json", "run/metrics.jsonl"} <= set(left)
    assert not list(out.glob(".recording-*"))


@pytest.mark.slow  # a whole report (figures, page); test_report checks finished cells too
def test_a_report_keeps_a_cell_checkpoint_only_while_the_cell_trains(tmp_path):
    import math

    from securefed.report import ReportConfig, run_report

    cfg = ReportConfig(
        models=("fedrap",), dataset="synthetic", synthetic_users=30, synthetic_items=200,
        rounds=2, epsilons=(math.inf,), defenses=("none",), seeds=1, audit=False, references=(),
    )  # fmt: skip
    cells = tmp_path / "r" / "cells"
    while_training: list[bool] = []

    def progress(ev):
        if ev.kind == "round" and ev.round == 2:  # the last round's checkpoint is written
            while_training.append((cells / ev.cell / runs.CHECKPOINT_FILE).exists())

    run_report(cfg, out=tmp_path / "r", progress=progress)
    assert while_training == [True]
    (cell,) = cells.iterdir()
    assert (cell / runs.SUMMARY_FILE).exists()
    assert not list(cells.rglob("*.pt"))


def test_audit_json_is_strict_json_with_null_for_what_is_not_a_number(tmp_path):
    """An attack with nothing to score (the private fedals's count rounds upload no factor:
    the gradient-ratio AUC is not a number) was written as a bare ``NaN``, which Python reads
    and ``jq`` or ``JSON.parse`` refuse: it is ``null``."""
    from typer.testing import CliRunner

    from securefed.cli import app

    out = tmp_path / "audit"
    argv = ["audit", "--model", "fedals", "--epsilon", "2", "--synthetic-users", "30"]
    argv += ["--synthetic-items", "300", "--attacks", "gradient-ratio", "--canaries", "0"]
    res = CliRunner().invoke(app, [*argv, "--out", str(out)])
    assert res.exit_code == 0, res.output

    def refuse(constant: str) -> None:
        raise ValueError(f"audit.json holds {constant}, which is not JSON")

    rep = json.loads((out / "audit.json").read_text(), parse_constant=refuse)
    [attack] = rep["attacks"]
    assert attack["name"] == "gradient-ratio" and attack["metrics"]["auc"] is None


def test_the_attack_table_benchmark_reads_null_as_not_a_number():
    """benchmarks/attacks_table.py read audit.json's numbers with float(), which a strict
    audit.json's null broke (found in review)."""
    import importlib.util
    import math
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "attacks_table.py"
    spec = importlib.util.spec_from_file_location("attacks_table", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    report = {
        "model": "fedals",
        "accounted_epsilon": 1.99,
        "audit": {"epsilon_lower_bound": None},
        "attacks": [{"name": "gradient-ratio", "metrics": {"auc": None, "embedding_cosine": None}}],
    }
    row = module.table_row(report, defense="dp-eps2", seed=0, rounds=3)
    assert math.isnan(row["inversion_cosine"]) and math.isnan(row["empirical_epsilon"])
    assert row["accounted_epsilon"] == 1.99


# ---------------------------------------------------------------------------- audit and report

AUDIT_ARGV = ["audit", "--model", "fedrap", "--synthetic-users", "30", "--synthetic-items"]
AUDIT_ARGV += ["300", "--rounds", "2", "--local-epochs", "1"]


def _errors(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("error:")]


def test_an_audit_that_cannot_fit_the_free_disk_is_refused_before_anything_is_written(
    tmp_path, monkeypatch
):
    """``securefed audit`` checked memory, not disk: an audit whose replay checkpoints (the
    canary clients' private state included), recording and scores exceed the free space
    trained until the disk filled. It is refused in one line, nothing written, and the
    advice it gives fits."""
    from typer.testing import CliRunner

    import attacks.audit
    from securefed.cli import app

    free = {"bytes": 1000}
    monkeypatch.setattr("securefed.costs._free_disk_for", lambda directory: free["bytes"])
    built = []
    real_build = attacks.audit.build_model
    monkeypatch.setattr(
        attacks.audit, "build_model", lambda *a, **k: built.append(1) or real_build(*a, **k)
    )
    out = tmp_path / "deep" / "audit"
    res = CliRunner().invoke(app, [*AUDIT_ARGV, "--canaries", "10", "--out", str(out)])
    assert res.exit_code == 2, res.output
    (line,) = _errors(res.output)
    assert "this audit needs about" in line and "the replay training's checkpoints" in line
    assert f"1.0 kB is free on the file system holding {tmp_path}" in line
    assert "choose an --out on a file system with more free space" in line
    assert "Traceback" not in res.output
    assert not built and not (tmp_path / "deep").exists()
    # Room for the replay with fewer canaries (each one a client with FedRAP's private views
    # over the catalogue and the canaries' items): the refusal says how many, and they fit.
    full = attacks.audit.estimate_audit_disk(
        TrainConfig(model="fedrap", synthetic_users=30, synthetic_items=300, rounds=2),
        _shape(30, 300),
        canaries=10,
        attacks=["row-change"],
    )
    free["bytes"] = full.replay - 1
    res = CliRunner().invoke(
        app, [*AUDIT_ARGV, "--canaries", "10", "--attacks", "row-change", "--out", str(out)]
    )
    assert res.exit_code == 2, res.output
    (line,) = _errors(res.output)
    n = int(line.split("--canaries ")[1].split()[0])
    assert 0 < n < 10 and not built and not out.exists()
    res = CliRunner().invoke(
        app, [*AUDIT_ARGV, "--canaries", str(n), "--attacks", "row-change", "--out", str(out)]
    )
    assert res.exit_code == 0, res.output
    assert (out / "audit.json").exists() and built


def _shape(users: int, items: int):
    from securefed.costs import RunShape
    from securefed.training import load_split

    return RunShape.of(
        load_split(TrainConfig(model="fedrap", synthetic_users=users, synthetic_items=items))
    )


def test_the_audit_disk_refusal_names_the_attacks_or_the_recording_that_would_fit(tmp_path):
    from attacks.audit import _check_audit_disk
    from securefed.costs import InsufficientDisk, estimate_run

    cfg = TrainConfig(model="fedrap", synthetic_users=60, synthetic_items=400, rounds=2)
    replay = estimate_run(cfg, _shape(60, 400), speed=1.0)
    chosen = ["row-change", "intersection", "imia", "union", "released"]
    kw = dict(real_users=60, real_items=400, canaries=0, target_users=16)

    def check(attacks, keep, free):
        return _check_audit_disk(
            cfg, replay, attacks, tmp_path / "a", keep_recording=keep, free=free, **kw
        )

    kept = check(chosen, True, 10**12)
    plain = check(chosen, False, 10**12)
    assert kept.peak > plain.peak and kept.kept > plain.kept  # the accumulators
    with pytest.raises(InsufficientDisk, match="without --keep-recording it would fit"):
        check(chosen, True, plain.peak)
    with pytest.raises(InsufficientDisk, match="--attacks ") as refused:
        check(chosen, False, plain.peak - 1)
    attacks = str(refused.value).split("--attacks ")[1].split()[0].split(",")
    assert set(attacks) < set(chosen) and check(attacks, False, plain.peak - 1)
    # A rescored recording trains nothing and records nothing: its scores alone.
    rescore = _check_audit_disk(
        cfg, None, chosen, tmp_path / "a", keep_recording=False, free=10**12, **kw
    )
    assert rescore.peak == rescore.scores < plain.scores + plain.replay


@pytest.mark.slow  # a whole audit, every attack (about 40 s)
def test_what_an_audit_writes_stays_within_its_estimate(tmp_path):
    """The estimate is a bound on each part an audit leaves on disk (measured on the audit
    itself: its kept recording, its scores, its replay's files)."""
    from attacks.audit import AuditConfig, audit, estimate_audit_disk

    # Every user observed: the least compressible scores (0.3 of their raw size was a
    # bound until such an audit wrote 0.5).
    cfg = TrainConfig(
        model="fedrap", synthetic_users=60, synthetic_items=600, rounds=2, client_fraction=1.0
    )
    out = tmp_path / "audit"
    result = audit(AuditConfig(train=cfg, canaries=10, keep_recording=True), out=out)
    chosen = [a["name"].removesuffix("-gender") for a in result.report["attacks"] if a["metrics"]]
    est = estimate_audit_disk(
        cfg, _shape(60, 600), canaries=10, attacks=chosen, keep_recording=True
    )

    def size(*paths):
        return sum(
            f.stat().st_size
            for p in paths
            for f in ([p] if p.is_file() else p.rglob("*"))
            if f.is_file()
        )

    recording = size(out / "run" / "audit")
    assert 0 < recording <= est.recording
    assert size(out / "scores.npz", out / "audit.json") <= est.scores
    assert size(*(p for p in (out / "run").iterdir() if p.is_file())) <= est.replay_kept
    assert size(out) <= est.kept


def test_a_report_that_cannot_fit_the_free_disk_is_refused_before_anything_is_written(
    tmp_path, monkeypatch
):
    """``securefed report`` stated its disk and ran: a sweep whose cells, their audits and
    pages exceed the free space stopped when the disk filled, cells half-written. It is
    refused in one line before any cell trains, nothing written."""
    from typer.testing import CliRunner

    from securefed.cli import app

    monkeypatch.setattr("securefed.costs._free_disk_for", lambda directory: 10**6)
    trained = []
    monkeypatch.setattr("securefed.training.build_model", lambda *a, **k: trained.append(1))
    out = tmp_path / "report"
    argv = ["report", "--models", "fedrap", "--references", "none", "--epsilons", "inf"]
    argv += ["--defenses", "none", "--seeds", "2", "--synthetic-users", "30"]
    argv += ["--synthetic-items", "300", "--rounds", "2", "--out", str(out)]
    res = CliRunner().invoke(app, argv)
    assert res.exit_code == 2, res.output
    (line,) = _errors(res.output)
    assert "this report needs about" in line and "2 cells to run" in line
    assert f"1.0 MB is free on the file system holding {tmp_path}" in line
    assert "Traceback" not in res.output
    assert not trained and not out.exists()
    # A report continued in its directory: nothing of it is touched either.
    out.mkdir()
    (out / "report.json").write_text("{}")
    res = CliRunner().invoke(app, argv)
    assert res.exit_code == 2 and len(_errors(res.output)) == 1
    assert [p.name for p in out.iterdir()] == ["report.json"]
    assert (out / "report.json").read_text() == "{}" and not trained


def test_the_report_disk_refusal_says_what_would_fit(tmp_path):
    import math

    from securefed.costs import InsufficientDisk
    from securefed.report import ReportConfig, check_sweep_disk, estimate_sweep, plan_cells

    cfg = ReportConfig(
        models=("fedrap",), references=(), epsilons=(math.inf,), defenses=("none",), seeds=2,
        dataset="synthetic", synthetic_users=30, synthetic_items=300, rounds=2, jobs=2,
    )  # fmt: skip
    cells, _ = plan_cells(cfg)
    est = estimate_sweep(cfg, [(c.name, c.train_config(cfg), True) for c in cells], speed=1.0)
    assert est.jobs == 2 and est.disk_peak_unaudited < est.disk_peak_with(1) < est.disk_peak
    check_sweep_disk(est, tmp_path, audited=True, free=est.disk_peak)
    with pytest.raises(InsufficientDisk, match="--jobs 1 would fit"):
        check_sweep_disk(est, tmp_path, audited=True, free=est.disk_peak_with(1))
    with pytest.raises(InsufficientDisk, match="--no-audit would fit"):
        check_sweep_disk(est, tmp_path, audited=True, free=est.disk_peak_unaudited)
    with pytest.raises(InsufficientDisk, match="free space on that file system"):
        check_sweep_disk(est, tmp_path, audited=True, free=est.disk_peak_unaudited - 1)
    # What the cells to run already hold (an interrupted cell's checkpoint) is replaced.
    check_sweep_disk(est, tmp_path, audited=True, free=est.disk_peak - 1000, replaced=1000)
