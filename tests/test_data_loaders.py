"""Loaders on the real reference files and on malformed ones."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from securefed.data import filter_min_interactions
from securefed.data.loaders import load_filmtrust, load_ml1m, load_ml100k, load_table
from securefed.errors import ConfigError, DataError

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
needs_shared = pytest.mark.skipif(
    not (SHARED / "ml-100k" / "u.data").is_file(),
    reason=f"reference data not found at {SHARED} (clone ../shared beside the repo)",
)


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@needs_shared
def test_ml100k_real_counts_and_demographics() -> None:
    data = load_ml100k(SHARED / "ml-100k")
    assert (data.n_users, data.n_items, len(data.users)) == (943, 1682, 100_000)
    assert data.report.raw_rows == 100_000
    assert data.report.duplicate_rows == data.report.dropped_users == 0
    assert data.timestamps is not None and data.timestamps.dtype == np.float64
    assert data.users.dtype == data.items.dtype == np.int64
    assert data.users.max() == 942 and data.items.max() == 1681
    # u.user: user 1 is a 24-year-old man, user 2 a 53-year-old woman.
    assert data.user_ids[0] == 1 and data.user_ids[1] == 2
    assert data.attributes["gender"][:2].tolist() == [0, 1]
    assert data.attributes["age"][:2].tolist() == [24, 53]
    assert data.attributes["age_bucket"][:2].tolist() == [1, 5]  # 18-24, 50-55
    assert 0.25 < data.attributes["gender"].mean() < 0.33  # 273 of 943 are women


@needs_shared
def test_filmtrust_real_duplicates_and_filter() -> None:
    data = load_filmtrust(SHARED / "filmtrust" / "ratings.txt")
    assert data.timestamps is None
    assert data.report.raw_rows == 35_498
    assert data.report.duplicate_rows == 4
    assert any("duplicate" in note for note in data.report.notes)
    kept = data.report.raw_rows - data.report.duplicate_rows - data.report.dropped_interactions
    assert len(data.users) == kept
    assert np.bincount(data.users).min() >= 3
    strict = load_filmtrust(SHARED / "filmtrust", min_interactions=5)
    assert np.bincount(strict.users).min() >= 5
    assert strict.report.dropped_users > data.report.dropped_users > 0
    pairs = data.users * data.n_items + data.items
    assert len(np.unique(pairs)) == len(pairs)


def test_duplicates_keep_latest_timestamp(tmp_path: Path) -> None:
    path = _write(
        tmp_path / "u.data",
        "1\t10\t5\t100\n1\t11\t3\t50\n1\t10\t2\t300\n1\t12\t1\t200\n1\t10\t4\t300\n",
    )
    data = load_ml100k(path)
    assert data.report.duplicate_rows == 2
    assert len(data.users) == 3
    ts = dict(zip(data.item_ids[data.items].tolist(), data.timestamps.tolist(), strict=True))
    assert ts == {10: 300.0, 11: 50.0, 12: 200.0}


def test_min_interactions_drops_users_and_reindexes(tmp_path: Path) -> None:
    rows = ["7 1 1", "7 2 1", "7 3 1", "9 4 1", "9 1 1", "8 5 1", "8 1 1", "8 2 1"]
    data = load_filmtrust(_write(tmp_path / "ratings.txt", "\n".join(rows)))
    assert data.user_ids.tolist() == [7, 8]
    assert data.item_ids.tolist() == [1, 2, 3, 5]  # item 4 only had user 9
    assert data.report.dropped_users == 1 and data.report.dropped_interactions == 2
    assert data.n_users == 2 and data.n_items == 4
    again = filter_min_interactions(data, 3)
    assert again is data
    with pytest.raises(ConfigError, match="min_interactions"):
        filter_min_interactions(data, 0)


def test_ml1m_format_with_users(tmp_path: Path) -> None:
    ratings = "".join(f"{u}::{i}::4::{978300000 + i}\n" for u in (1, 2) for i in (5, 6, 7))
    _write(tmp_path / "ratings.dat", ratings)
    _write(tmp_path / "users.dat", "1::F::1::10::48067\n2::M::56::16::70072\n")
    data = load_ml1m(tmp_path)
    assert (data.n_users, data.n_items, len(data.users)) == (2, 3, 6)
    assert data.attributes["gender"].tolist() == [1, 0]
    assert data.attributes["age_bucket"].tolist() == [0, 6]


def test_csv_and_parquet_tables(tmp_path: Path) -> None:
    pd = pytest.importorskip("pandas")
    frame = pd.DataFrame(
        {"User": [3, 3, 3, 4, 4, 4], "item": [1, 2, 3, 1, 2, 2], "timestamp": [1, 2, 3, 4, 5, 6]}
    )
    csv = tmp_path / "log.csv"
    frame.to_csv(csv, index=False)
    data = load_table(csv)
    assert data.name == "log" and data.report.duplicate_rows == 1
    assert data.report.dropped_users == 1  # user 4 has 2 distinct items left
    pytest.importorskip("pyarrow")
    frame.to_parquet(tmp_path / "log.parquet")
    again = load_table(tmp_path / "log.parquet")
    assert np.array_equal(again.items, data.items)
    assert np.array_equal(again.timestamps, data.timestamps)


def test_a_table_with_string_ids_loads_each_distinct_string_as_one_id(tmp_path: Path) -> None:
    """Real logs name users and items by UUIDs or SKUs: a column that is not all numbers is
    read as strings (refused before 2026-12-07: 'user ids must be integer ids'), and the load
    report says so; a column of numbers stays integers."""
    rows = [("u-7f3a", "sku-1"), ("u-7f3a", "sku-2"), (" u-7f3a ", "sku-3"), ("42", "sku-1")]
    rows += [("42", "sku-2"), ("42", "9"), ("u-0b1c", "9"), ("u-0b1c", "sku-2"), ("u-0b1c", "7")]
    path = _write(tmp_path / "log.csv", "user,item\n" + "".join(f"{u},{i}\n" for u, i in rows))
    data = load_table(path)
    assert data.n_users == 3 and data.n_items == 5
    assert sorted(data.user_ids.tolist()) == ["42", "u-0b1c", "u-7f3a"]
    assert sorted(data.item_ids.tolist()) == ["7", "9", "sku-1", "sku-2", "sku-3"]
    assert np.array_equal(np.bincount(data.users), [3, 3, 3])
    notes = " ".join(data.report.notes)
    assert "user ids read as strings (line 2 is not a number)" in notes
    assert "item ids read as strings (line 2 is not a number)" in notes
    assert "u-7f3a" not in notes  # an id may be an e-mail address: the note names the line
    numbers = _write(
        tmp_path / "n.csv", "user,item\n" + "".join(f"{u},{i}\n" for u in (1, 2) for i in (3, 4, 5))
    )
    plain = load_table(numbers)
    assert plain.user_ids.dtype == np.int64 and not plain.report.notes


def test_a_parquet_tables_rows_are_rows_not_lines(tmp_path: Path) -> None:
    """Found in a walkthrough: a Parquet file of string ids was noted "line 0 is not a
    number"; a Parquet file has no lines (nor a header line), so its notes and errors name
    the row, counted from 1. A CSV's keep their line numbers (the header is line 1)."""
    pd = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    users = ["u-1", "u-1", "u-1", "u-2", "u-2", "u-2"]
    frame = pd.DataFrame({"user": users, "item": [1, 2, 3, 1, 2, 3]})
    frame.to_parquet(tmp_path / "s.parquet")
    notes = " ".join(load_table(tmp_path / "s.parquet").report.notes)
    assert "user ids read as strings (the user id of row 1 is not a number)" in notes, notes
    assert "line" not in notes
    frame.assign(timestamp=[1.0, 2.0, "x", 4.0, 5.0, 6.0]).astype({"timestamp": str}).to_parquet(
        tmp_path / "t.parquet"
    )
    with pytest.raises(
        DataError,
        match=r"t\.parquet row 3: timestamp 'x' is not a number, "
        r"but row 1 holds one",
    ):
        load_table(tmp_path / "t.parquet")
    frame.assign(item=[1, 2, 2.5, 1, 2, 3]).to_parquet(tmp_path / "f.parquet")
    with pytest.raises(DataError, match=r"f\.parquet row 3: item id '2\.5' is not an integer"):
        load_table(tmp_path / "f.parquet")


def test_string_ids_too_big_for_the_memory_left_are_refused_in_one_line(tmp_path, monkeypatch):
    from securefed import costs

    path = _write(
        tmp_path / "log.csv",
        "user,item\n" + "".join(f"u{u},{i}\n" for u in range(4) for i in range(5)),
    )
    left = iter([10**9, 20 * 250 - 1])  # the read fits; its string ids one byte short
    monkeypatch.setattr(costs, "available_memory", lambda: next(left))
    with pytest.raises(costs.InsufficientMemory, match="string ids \\(20 rows\\) need about"):
        load_table(path)
    monkeypatch.setattr(costs, "available_memory", lambda: 10**9)
    assert load_table(path).n_users == 4


@pytest.mark.parametrize(
    ("filename", "text", "loader", "message"),
    [
        ("u.data", "1\t2\t3\n4\t5\t6\n", load_ml100k, "3 column"),
        ("u.data", "1\t2\t3\t4\nx\t5\t6\t7\n", load_ml100k, "line 2: user id 'x' is not an int"),
        ("u.data", "1\t2.5\t3\t4\n", load_ml100k, "item id '2.5' is not an integer"),
        ("u.data", "1\t2\t3\t4\n1\t2\n", load_ml100k, "missing fields"),
        ("u.data", "", load_ml100k, "is empty"),
        ("u.data", "\n\n", load_ml100k, "is empty"),
        ("u.data", "1\t2\t3\t4\n1\t3\t3\t5\n", load_ml100k, "no user has at least 3"),
        ("ratings.txt", "1 2 3 4 5\n", load_filmtrust, "5 column"),
        ("ratings.dat", "1,2,3,4\n", load_ml1m, "1 column"),
        ("t.csv", "a,b\n1,2\n", load_table, "no column\\(s\\) user, item"),
        ("t.csv", "user,item\n", load_table, "no rows"),
        ("t.csv", "user;item\n1;2\n", load_table, "looks separated by ';': securefed reads .csv"),
        ("t.tsv", "user,item\n1,2\n", load_table, "looks separated by ',': securefed reads"),
        ("t.csv", "user,item\n1,2\n1,2.5\n", load_table, "line 3: item id '2.5' is not an int"),
        ("t.csv", "user,item\n1,2\n1, \n", load_table, "line 3: the item id is missing"),
        ("t.csv", "user,item\nu1,2\n,3\n", load_table, "line 3: the user id is missing"),
        (
            "t.csv",
            "user,item\n1,2\nNA,3\n",
            load_table,
            "line 3: the user id is missing \\('NA'\\)",
        ),
        ("t.csv", "user,item\n1,2\n1,null\n", load_table, "line 3: the item id is missing"),
        ("t.csv", "user,item,User\n1,2,3\n", load_table, "names the column\\(s\\) user more"),
        ("t.csv", "user,item,item\n1,2,3\n", load_table, "names the column\\(s\\) item more"),
        ("t.tsv", "user\titem\trating\tRating \n1\t2\t3\t4\n", load_table, "\\(s\\) rating more"),
        ("t.parquet", "not parquet", load_table, "not a readable Parquet"),
    ],
)
def test_malformed_files_raise_one_clear_data_error(
    tmp_path: Path, filename: str, text: str, loader, message: str
) -> None:
    path = _write(tmp_path / filename, text)
    with pytest.raises(DataError, match=message) as info:
        loader(path)
    assert str(path) in str(info.value)


def test_missing_file_and_bad_users_file(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="not found"):
        load_ml100k(tmp_path / "nope" / "u.data")
    _write(tmp_path / "u.data", "".join(f"1\t{i}\t3\t{i}\n" for i in range(3)))
    _write(tmp_path / "u.user", "1|24|X|writer|00000\n")
    with pytest.raises(DataError, match="gender 'X'"):
        load_ml100k(tmp_path)


def test_a_parquet_table_too_big_for_memory_is_refused_from_its_metadata(tmp_path, monkeypatch):
    """The rows come from the file's metadata: the table is never decoded."""
    import securefed.costs
    from securefed.costs import InsufficientMemory

    frame = pd.DataFrame({"user": np.arange(20000) % 300, "item": np.arange(20000) % 7})
    frame.to_parquet(tmp_path / "big.parquet")
    monkeypatch.setattr(securefed.costs, "available_memory", lambda: 1_000_000)

    def never(*_args, **_kwargs):
        raise AssertionError("the table was decoded")

    monkeypatch.setattr(pd, "read_parquet", never)
    with pytest.raises(InsufficientMemory, match="about 20,000 rows"):
        load_table(tmp_path / "big.parquet")
    monkeypatch.setattr(securefed.costs, "available_memory", lambda: None)  # unknown: no check
    with pytest.raises(DataError, match="the table was decoded"):  # the check let it through
        load_table(tmp_path / "big.parquet")


def test_a_table_that_cannot_be_opened_is_still_one_data_error(tmp_path):
    """Found in review: the memory check opened the file before the read's own error handling,
    so a folder (or a file without permission) named as the table was a raw OSError."""
    folder = tmp_path / "table.csv"
    folder.mkdir()
    with pytest.raises(DataError, match="cannot read interaction table file"):
        load_table(folder)


def test_a_column_securefed_ignores_may_repeat(tmp_path: Path) -> None:
    # Only the columns securefed reads must be unique; "rating.1" without "rating" is a name.
    path = _write(
        tmp_path / "t.csv",
        "user,item,note,note,rating.1\n"
        + "".join(f"{u},{i},a,b,c\n" for u in range(2) for i in range(3)),
    )
    data = load_table(path)
    assert (data.n_users, data.n_items) == (2, 3)
