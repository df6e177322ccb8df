"""Dataset resolution: names, paths, lookup order and the verified download."""

from __future__ import annotations

import dataclasses
import hashlib
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

import numpy as np
import pytest

from securefed.data import load_dataset, registry
from securefed.errors import DataError

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
_REAL_URLOPEN = urllib.request.urlopen
needs_shared = pytest.mark.skipif(
    not (SHARED / "ml-100k" / "u.data").is_file(),
    reason=f"reference data not found at {SHARED} (clone ../shared beside the repo)",
)


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    cache = tmp_path / "cache"
    monkeypatch.setenv("SECUREFED_CACHE_DIR", str(cache))
    monkeypatch.delenv("SECUREFED_DATA_DIR", raising=False)

    def offline(*args, **kwargs):
        raise urllib.error.URLError("network disabled in tests")

    monkeypatch.setattr(registry.urllib.request, "urlopen", offline)
    return cache


def _small_u_data(n_users: int = 4, n_items: int = 6) -> bytes:
    rows = [
        f"{u}\t{i}\t3\t{1000 * u + i}\n" for u in range(1, n_users + 1) for i in range(1, n_items)
    ]
    return "".join(rows).encode()


def _zip(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, payload in members.items():
            zf.writestr(name, payload)
    return path


def _serve(monkeypatch: pytest.MonkeyPatch, archive: Path, **changes) -> None:
    """Point ml-100k at a local zip (file:// through the real urlopen)."""
    monkeypatch.setattr(registry.urllib.request, "urlopen", _REAL_URLOPEN)
    source = dataclasses.replace(registry.DATASETS["ml-100k"], url=archive.as_uri(), **changes)
    monkeypatch.setitem(registry.DATASETS, "ml-100k", source)


def test_synthetic_by_name_is_seeded() -> None:
    a = load_dataset("synthetic", seed=1)
    b = load_dataset("synthetic", seed=1)
    assert a.report.synthetic and np.array_equal(a.items, b.items)


@needs_shared
@pytest.mark.parametrize("layout", ["nested", "flat", "env"])
def test_lookup_layouts(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, layout: str) -> None:
    if layout == "nested":
        data = load_dataset("ml-100k", data_dir=SHARED, download=False)
    elif layout == "flat":
        data = load_dataset("ml-100k", data_dir=SHARED / "ml-100k", download=False)
    else:
        monkeypatch.setenv("SECUREFED_DATA_DIR", str(SHARED))
        data = load_dataset("ml-100k", download=False)
    assert (data.n_users, data.n_items, len(data.users)) == (943, 1682, 100_000)
    assert "gender" in data.attributes


@needs_shared
def test_paths_dispatch_by_extension() -> None:
    assert load_dataset(str(SHARED / "ml-100k" / "u.data")).n_users == 943
    assert load_dataset(str(SHARED / "filmtrust" / "ratings.txt")).timestamps is None
    assert load_dataset(str(SHARED / "filmtrust")).name == "filmtrust"


def test_explicit_data_dir_wins_over_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    (first / "ml-100k").mkdir(parents=True)
    second.mkdir()
    (first / "ml-100k" / "u.data").write_bytes(_small_u_data(n_users=3))
    (second / "u.data").write_bytes(_small_u_data(n_users=5))
    monkeypatch.setenv("SECUREFED_DATA_DIR", str(second))
    assert load_dataset("ml-100k", data_dir=first).n_users == 3
    assert load_dataset("ml-100k").n_users == 5


def test_offline_without_copy_names_the_fix(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="--data-dir DIR.*SECUREFED_DATA_DIR") as info:
        load_dataset("ml-1m", data_dir=tmp_path)
    assert "network disabled" in str(info.value)
    with pytest.raises(DataError, match="--data-dir DIR.*SECUREFED_DATA_DIR"):
        load_dataset("filmtrust", data_dir=tmp_path, download=False)


def test_unknown_name_is_a_data_error() -> None:
    with pytest.raises(DataError, match="unknown dataset 'ml-10m'"):
        load_dataset("ml-10m")


def test_download_verifies_and_caches(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, _isolated: Path
) -> None:
    payload = _small_u_data()
    archive = _zip(tmp_path / "ml-100k.zip", {"ml-100k/u.data": payload, "ml-100k/README": b"x"})
    md5 = hashlib.md5(archive.read_bytes()).hexdigest()
    sha = {"u.data": hashlib.sha256(payload).hexdigest()}
    _serve(monkeypatch, archive, zip_md5=md5, sha256=sha)
    calls: list[tuple[str, int, int | None]] = []
    data = load_dataset("ml-100k", progress=lambda *a: calls.append(a))
    assert data.n_users == 4 and len(data.users) == 20
    assert (_isolated / "ml-100k" / "u.data").read_bytes() == payload
    assert sorted(p.name for p in _isolated.iterdir()) == ["ml-100k"]  # no temp leftovers
    assert calls and calls[-1][1] == archive.stat().st_size
    # Second call is served from the cache without the network.
    monkeypatch.setattr(registry.urllib.request, "urlopen", None)
    assert load_dataset("ml-100k").n_users == 4


@pytest.mark.parametrize("tamper", ["file-sha256", "zip-md5", "not-a-zip", "missing-member"])
def test_failed_verification_leaves_nothing_cached(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, _isolated: Path, tamper: str
) -> None:
    payload = _small_u_data()
    members = {"ml-100k/u.data": payload + (b"1\t9\t3\t5\n" if tamper == "file-sha256" else b"")}
    if tamper == "missing-member":
        members = {"ml-100k/u.item": payload}
    archive = _zip(tmp_path / "ml-100k.zip", members)
    if tamper == "not-a-zip":
        archive.write_bytes(b"<html>not found</html>")
    md5 = hashlib.md5(archive.read_bytes()).hexdigest()
    changes = {"sha256": {"u.data": hashlib.sha256(payload).hexdigest()}, "zip_md5": md5}
    if tamper == "zip-md5":
        changes["zip_md5"] = "0" * 32
    _serve(monkeypatch, archive, **changes)
    with pytest.raises(DataError, match="nothing was cached"):
        load_dataset("ml-100k")
    assert not _isolated.exists() or list(_isolated.iterdir()) == []


def test_pinned_digests_match_the_reference_files() -> None:
    for name, files in (("ml-100k", ("u.data", "u.user")), ("filmtrust", ("ratings.txt",))):
        for filename in files:
            path = SHARED / name / filename
            if not path.is_file():
                pytest.skip(f"reference data not found at {SHARED}")
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            assert registry.DATASETS[name].sha256[filename] == digest


def test_a_csv_table_named_txt_loads_as_a_table(tmp_path: Path) -> None:
    """A ``.txt`` file whose first line names ``user`` and ``item`` is a table, not
    FilmTrust's headerless ``ratings.txt`` (it was sent to the FilmTrust reader: '1 column(s)
    per line, expected 3', found in a walkthrough); a headerless one still goes there."""
    rows = "".join(f"{u},{i},{u * 10 + i}\n" for u in range(4) for i in range(110))
    table = tmp_path / "export.txt"
    table.write_text("User,Item,timestamp\n" + rows)
    data = load_dataset(str(table))
    assert (data.n_users, data.n_items) == (4, 110)
    plain = tmp_path / "ratings.txt"
    plain.write_text("".join(f"{u} {i} 3\n" for u in range(4) for i in range(5)))
    assert load_dataset(str(plain)).n_users == 4
