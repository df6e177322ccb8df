"""Checkpoints are data, not code: weights-only loading, and one clear error for any file
that is empty, truncated, corrupt, crafted or not a checkpoint, with the run directory left
exactly as it was."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from securefed import runs
from securefed.errors import ConfigError, IntegrityError, SecureFedError

MARKER = "marker.txt"


class _WritesMarker:
    """Unpickling this runs ``exec``, which writes the marker file (an attacker's payload)."""

    def __init__(self, target: Path) -> None:
        self.target = target

    def __reduce__(self):
        return (exec, (f"open({str(self.target)!r}, 'w').write('code ran')",))


def _state() -> dict:
    return {
        "round": 4,
        "model": {"C": torch.randn(6, 3), "config": {"dim": 3, "lr": 0.1, "name": "fedrap"}},
        "aggregator": {"ledger": [{"round": 0, "sigma": 1.2, "kind": None}], "ids": (1, 2)},
        "seconds": 12.5,
    }


def _snapshot(run_dir: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(run_dir.iterdir()) if p.is_file()}


def _run_dir(tmp_path: Path) -> Path:
    run_dir = tmp_path / "run"
    runs.save_checkpoint(run_dir, _state())
    runs.write_json(run_dir / runs.SUMMARY_FILE, {"rounds": 4})
    runs.append_metrics(run_dir, {"round": 1, "loss": 0.5})
    return run_dir


def _refused(run_dir: Path) -> str:
    before = _snapshot(run_dir)
    with pytest.raises(IntegrityError) as err:
        runs.load_checkpoint(run_dir)
    assert _snapshot(run_dir) == before  # nothing written, renamed or deleted
    msg = str(err.value)
    assert isinstance(err.value, SecureFedError)
    assert "\n" not in msg
    assert str(run_dir / runs.CHECKPOINT_FILE) in msg
    assert "backup" in msg and "delete" in msg
    return msg


def test_round_trip_keeps_tensors_and_plain_values(tmp_path):
    run_dir = _run_dir(tmp_path)
    got = runs.load_checkpoint(run_dir)
    want = _state()
    assert got["round"] == 4 and got["seconds"] == 12.5
    assert got["model"]["config"] == want["model"]["config"]
    assert got["aggregator"] == {
        "ledger": [{"round": 0, "sigma": 1.2, "kind": None}],
        "ids": (1, 2),
    }
    assert got["model"]["C"].shape == (6, 3)
    assert runs.load_state(tmp_path / "missing.pt") is None
    with pytest.raises(ConfigError, match="is a folder; load_state reads a file of one") as err:
        runs.load_state(tmp_path)  # a run directory, not a corrupt file to delete
    assert "delete" not in str(err.value)


@pytest.mark.parametrize("legacy", [False, True], ids=["torch-zip", "raw-pickle"])
def test_a_checkpoint_crafted_to_run_code_does_not_run(tmp_path, legacy):
    run_dir = _run_dir(tmp_path)
    marker = tmp_path / MARKER
    evil = {"round": 5, "model": _WritesMarker(marker)}
    path = run_dir / runs.CHECKPOINT_FILE
    if legacy:
        path.write_bytes(pickle.dumps(evil))
    else:
        torch.save(evil, path)
    msg = _refused(run_dir)
    assert not marker.exists()
    assert "other than tensors and plain values" in msg
    # Positive control: the same file does run its payload under an unsafe load.
    if legacy:
        pickle.loads(path.read_bytes())
    else:
        with path.open("rb") as fh:
            torch.load(fh, weights_only=False)
    assert marker.read_text() == "code ran"


def test_best_model_and_node_state_files_are_loaded_weights_only_too(tmp_path):
    marker = tmp_path / MARKER
    path = tmp_path / runs.BEST_FILE
    torch.save({"round": 1, "model": _WritesMarker(marker)}, path)
    with pytest.raises(IntegrityError, match=str(path)):
        runs.load_state(path)
    assert not marker.exists()


@pytest.mark.parametrize("keep", [0.0, 0.02, 0.3, 0.5, 0.9, 0.999])
def test_truncated_and_empty_checkpoints_are_one_clear_error(tmp_path, keep):
    run_dir = _run_dir(tmp_path)
    path = run_dir / runs.CHECKPOINT_FILE
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])
    msg = _refused(run_dir)
    assert ("empty" in msg) if keep == 0.0 else ("truncated or corrupt" in msg)


def test_random_bytes_and_other_files_are_one_clear_error(tmp_path):
    run_dir = _run_dir(tmp_path)
    path = run_dir / runs.CHECKPOINT_FILE
    for junk in (np.random.default_rng(0).bytes(3000), b"not a checkpoint\n", b"PK\x03\x04"):
        path.write_bytes(junk)
        _refused(run_dir)


def test_a_checkpoint_that_is_not_a_mapping_or_has_no_round_is_refused(tmp_path):
    run_dir = _run_dir(tmp_path)
    path = run_dir / runs.CHECKPOINT_FILE
    torch.save([torch.zeros(2)], path)
    assert "not a mapping" in _refused(run_dir)
    for bad in ({"model": {}}, {"round": "3"}, {"round": -1}, {"round": True}):
        torch.save(bad, path)
        assert "round count" in _refused(run_dir)


def test_save_refuses_state_that_weights_only_loading_would_refuse(tmp_path):
    """Symmetric by construction: numpy arrays or arbitrary objects are refused when saving,
    before they replace the previous checkpoint, instead of failing the next resume."""
    run_dir = _run_dir(tmp_path)
    before = _snapshot(run_dir)
    for bad in (np.zeros(3), _WritesMarker(tmp_path / MARKER)):
        with pytest.raises(TypeError, match="weights_only"):
            runs.save_checkpoint(run_dir, {"round": 5, "model": {"x": bad}})
    assert _snapshot(run_dir) == before
    assert not any(p.name.endswith(".tmp") for p in run_dir.iterdir())
    assert runs.load_checkpoint(run_dir)["round"] == 4


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["best-truncated", "checkpoint-other-model", "no-model"])
def test_resume_with_a_damaged_run_directory_is_one_line_and_changes_nothing(tmp_path, damage):
    from typer.testing import CliRunner

    from securefed.cli import app

    runner = CliRunner()
    run_dir = tmp_path / "run"
    argv = ["--model", "fedrap", "--synthetic-users", "60", "--synthetic-items", "400"]
    argv.append("--keep-private-state")  # a finished run's checkpoint, to damage
    res = runner.invoke(app, ["train", *argv, "--rounds", "2", "--out", str(run_dir)])
    assert res.exit_code == 0, res.output
    if damage == "best-truncated":
        # Saved only when the best round was evaluated sampled-only: a torn write of it.
        runs.save_state(run_dir / runs.BEST_FILE, {"round": 1, "model": {"C": torch.ones(4)}})
        path = run_dir / runs.BEST_FILE
        path.write_bytes(path.read_bytes()[:100])
    else:
        state = runs.load_checkpoint(run_dir)
        if damage == "no-model":
            del state["model"]
        else:
            state["model"] = {"V": torch.zeros(3, 2)}  # another model's parameters
        runs.save_checkpoint(run_dir, state)
    before = _snapshot(run_dir)
    res = runner.invoke(app, ["train", "--resume", str(run_dir), "--rounds", "4"])
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    assert len([line for line in res.output.splitlines() if line.strip()]) == 1, res.output
    assert _snapshot(run_dir) == before


def test_default_directories_never_collide(tmp_path, monkeypatch):
    """Two commands started the same second get two default directories (train's runs/ and
    audit's audits/), never one that already holds something."""
    from datetime import datetime

    from securefed import training
    from securefed.training import TrainConfig, default_run_dir

    class Frozen:
        @staticmethod
        def now(tz):
            return datetime(2026, 12, 6, 7, 30, 0, tzinfo=tz)

    monkeypatch.setattr(training, "datetime", Frozen)
    monkeypatch.chdir(tmp_path)
    cfg = TrainConfig()
    first = default_run_dir(cfg)
    assert first == Path("runs/20261206-073000-fedals-synthetic")
    first.mkdir(parents=True)
    assert default_run_dir(cfg) == Path("runs/20261206-073000-fedals-synthetic-2")
    Path("runs/20261206-073000-fedals-synthetic-2").mkdir()
    assert default_run_dir(cfg) == Path("runs/20261206-073000-fedals-synthetic-3")
    assert default_run_dir(cfg, "audits") == Path("audits/20261206-073000-fedals-synthetic")
    assert runs.unused_path(tmp_path / "nothing-here") == tmp_path / "nothing-here"


def test_metrics_lines_are_strict_json_and_read_back_as_the_record_held_them(tmp_path):
    """An empty Poisson cohort's loss (NaN) was written as a bare NaN, which jq and
    JSON.parse refuse; it is null on disk and NaN again when securefed reads it back."""
    import json as _json
    import math as _math

    from securefed import runs as _runs

    _runs.append_metrics(tmp_path, {"round": 1, "loss": float("nan"), "hr": 0.5})
    _runs.rewrite_metrics(
        tmp_path,
        [
            {"round": 1, "loss": float("nan"), "hr": 0.5},
            {"round": 2, "loss": float("inf"), "stages": {"train": float("nan")}, "hr": 0.25},
        ],
    )
    for line in (tmp_path / "metrics.jsonl").read_text().splitlines():
        _json.loads(line, parse_constant=lambda c: pytest.fail(f"{c} is not JSON"))
    first, second = _runs.read_metrics(tmp_path)
    assert _math.isnan(first["loss"]) and first["hr"] == 0.5
    assert _math.isnan(second["loss"]) and second["stages"] == {"train": None}


def test_metrics_lines_are_owner_only_like_every_other_file_of_the_run(tmp_path):
    """Found in review: metrics.jsonl was appended with the umask's 0644 while every other
    run file is written 0600; it holds cohort sizes and clear losses."""
    import os as _os
    import stat as _stat

    from securefed import runs as _runs

    _runs.append_metrics(tmp_path, {"round": 1, "loss": 0.5})
    _runs.append_metrics(tmp_path, {"round": 2, "loss": 0.4})
    mode = _stat.S_IMODE(_os.stat(tmp_path / "metrics.jsonl").st_mode)
    assert mode == 0o600, oct(mode)
    assert [m["round"] for m in _runs.read_metrics(tmp_path)] == [1, 2]
