"""A run directory is trained by one process at a time, on the data it started with.

Found in a new-user walkthrough: a ``--resume`` started while the run still trained left a
DP ledger with 13 events for 14 releases (each process wrote its own ledger over the
other's); a resume after the data file changed (same rows, other timestamps) trained on
another split, to test HR@10 0.98 (its earlier rounds had trained on its held-out items).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from securefed import runs
from securefed.errors import ConfigError
from securefed.training import PrivacyConfig, TrainConfig, split_fingerprint, train

SMALL = dict(model="fedals", synthetic_users=60, synthetic_items=300, checkpoint_every=1)


class Stop(Exception):
    pass


def _stop_at(n):
    def progress(record):
        if record.round == n:
            raise Stop

    return progress


def _files(run: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}


def test_a_resume_while_another_process_trains_is_refused_and_changes_nothing(tmp_path):
    run = tmp_path / "r"
    cfg = TrainConfig(rounds=3, privacy=PrivacyConfig(noise_multiplier=2.0), **SMALL)
    with pytest.raises(Stop):
        train(cfg, out=run, progress=_stop_at(2))
    assert not (run / runs.LOCK_FILE).exists()  # released when the run stopped
    held = runs.RunLock.acquire(run)  # as another process training it would hold it
    try:
        before = _files(run)
        with pytest.raises(ConfigError, match=r"is being trained by process \d+ now; wait"):
            train(resume=run)
        with pytest.raises(ConfigError, match="is being trained by .* now; choose another --out"):
            runs.RunLock.acquire(run, new=True)
        assert _files(run) == before
    finally:
        held.release()
    assert not (run / runs.LOCK_FILE).exists()
    resumed = train(resume=run)
    assert resumed.summary["rounds"] == 3
    assert len(json.loads((run / runs.LEDGER_FILE).read_text())["events"]) == 3
    assert not (run / runs.LOCK_FILE).exists()


def test_a_running_run_holds_its_directory(tmp_path):
    """While a run trains, a resume of its directory (as a second process would start) is
    refused; the lock goes with the run."""
    run = tmp_path / "r"
    seen = []

    def try_to_resume(record):
        if record.round == 1:
            assert (run / runs.LOCK_FILE).exists()
            with pytest.raises(ConfigError, match="is being trained by"):
                train(resume=run)
            seen.append(record.round)

    cfg = TrainConfig(rounds=2, privacy=PrivacyConfig(noise_multiplier=2.0), **SMALL)
    result = train(cfg, out=run, progress=try_to_resume)
    assert seen == [1] and result.summary["rounds"] == 2
    assert len(json.loads((run / runs.LEDGER_FILE).read_text())["events"]) == 2
    assert runs.LOCK_FILE not in {p.name for p in run.iterdir()}


def _table(path: Path, rows: list[tuple[int, int, int]]) -> Path:
    path.write_text("user,item,timestamp\n" + "".join(f"{u},{i},{t}\n" for u, i, t in rows))
    return path


def _rows(n_users=30, n_items=160, per_user=12):
    return [
        (u, (u * 7 + j * 3) % n_items, 1000 + u * 100 + j)
        for u in range(n_users)
        for j in range(per_user)
    ]


def _stopped_csv_run(tmp_path: Path, rows) -> tuple[Path, Path]:
    """(data file, run directory) of a 3-round fedals run on ``rows`` stopped after round 2."""
    data = _table(tmp_path / "log.csv", rows)
    run = tmp_path / "r"
    cfg = TrainConfig(model="fedals", dataset=str(data), rounds=3, checkpoint_every=1)
    with pytest.raises(Stop):
        train(cfg, out=run, progress=_stop_at(2))
    return data, run


@pytest.mark.parametrize("change", ["reversed-time", "fewer-items"])
def test_a_resume_on_changed_data_is_refused_and_changes_nothing(tmp_path, change):
    rows = _rows()
    data, run = _stopped_csv_run(tmp_path, rows)
    recorded = json.loads((run / runs.DATA_FILE).read_text())
    assert len(recorded["fingerprint"]) == 64
    if change == "reversed-time":  # same rows and sizes, another order in time
        _table(data, [(u, i, 10**6 - t) for u, i, t in rows])
        message = "same sizes, other interactions or order"
    else:
        _table(data, [r for r in rows if r[1] != 0])
        message = "items 160 -> 159"
    before = _files(run)
    with pytest.raises(ConfigError, match="started on other data") as err:
        train(resume=run)
    assert message in str(err.value)
    assert _files(run) == before
    _table(data, rows)  # the data the run started with: it resumes
    assert train(resume=run).summary["rounds"] == 3


def test_a_run_written_before_the_fingerprint_is_compared_by_its_sizes(tmp_path):
    rows = _rows()
    data, run = _stopped_csv_run(tmp_path, rows)
    recorded = json.loads((run / runs.DATA_FILE).read_text())
    del recorded["fingerprint"]
    runs.write_json(run / runs.DATA_FILE, recorded)
    _table(data, [r for r in rows if r[0] != 0])  # a user fewer: seen
    with pytest.raises(ConfigError, match="users 30 -> 29"):
        train(resume=run)
    _table(data, [(u, i, 10**6 - t) for u, i, t in rows])  # the same sizes: not seen
    assert train(resume=run).summary["rounds"] == 3


def test_a_finished_run_keeps_no_fingerprint_of_its_data(tmp_path):
    """The fingerprint is an exact function of the clear data: data.json holds it only
    while the run can resume (with --keep-private-state, as long as the checkpoint)."""
    data = _table(tmp_path / "log.csv", _rows())
    cfg = TrainConfig(model="fedals", dataset=str(data), rounds=2)
    done = train(cfg, out=tmp_path / "done").run_dir
    assert "fingerprint" not in json.loads((done / runs.DATA_FILE).read_text())
    kept = train(
        TrainConfig(model="fedals", dataset=str(data), rounds=2, keep_private_state=True),
        out=tmp_path / "kept",
    ).run_dir
    assert len(json.loads((kept / runs.DATA_FILE).read_text())["fingerprint"]) == 64


def test_the_fingerprint_follows_the_split(tmp_path):
    from securefed.training import load_split

    rows = _rows()
    a = load_split(TrainConfig(dataset=str(_table(tmp_path / "a.csv", rows))))
    b = load_split(TrainConfig(dataset=str(_table(tmp_path / "b.csv", list(reversed(rows))))))
    c = load_split(
        TrainConfig(dataset=str(_table(tmp_path / "c.csv", [(u, i, -t) for u, i, t in rows])))
    )
    assert split_fingerprint(a) == split_fingerprint(b)  # the file's row order is not data
    assert split_fingerprint(a) != split_fingerprint(c)


def test_a_file_system_without_flock_trains_unlocked_and_leaves_no_file(tmp_path, monkeypatch):
    """Only 'held by another' is a refusal: where flock itself fails (ENOLCK on some network
    mounts) the run goes on unlocked, as before locks, and leaves no hidden file that would
    make a retry's folder 'hold other files' (found in review)."""
    import errno
    import fcntl

    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    assert runs.RunLock.acquire(tmp_path) is None
    assert not (tmp_path / runs.LOCK_FILE).exists()
    run = tmp_path / "r"
    cfg = TrainConfig(rounds=1, **SMALL)
    assert train(cfg, out=run).summary["rounds"] == 1
    assert runs.LOCK_FILE not in {p.name for p in run.iterdir()}
