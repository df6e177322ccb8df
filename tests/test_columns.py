"""A table of one's own whose header names its columns otherwise (``customer_id,product_sku``):
a ``columns`` mapping reads it as it is, and a mapping that does not fit is one clear error."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from securefed.data import load_dataset
from securefed.data.loaders import check_columns, load_table, parse_columns
from securefed.errors import ConfigError, DataError

COLUMNS = {"user": "customer_id", "item": "product_sku", "timestamp": "ts"}


def _rows(n_users: int = 40, n_items: int = 150, seed: int = 0) -> list[tuple[str, str, int]]:
    rng = np.random.default_rng(seed)
    rows = []
    for u in range(n_users):
        for t, i in enumerate(rng.choice(n_items, size=int(rng.integers(6, 12)), replace=False)):
            rows.append((f"c{u:03d}", f"sku-{i}", 1000 + 7 * t + u % 3))
    return rows


def _table(path: Path, header: str, rows=None) -> Path:
    """``rows`` as ``user,item,rating,timestamp`` columns under ``header``'s four names."""
    body = "".join(f"{u},{i},{1 + len(i) % 5},{t}\n" for u, i, t in rows or _rows())
    path.write_text(header + "\n" + body)
    return path


@pytest.fixture
def tables(tmp_path):
    """The same interactions under the roles' own names and under a shop's."""
    return (
        _table(tmp_path / "plain.csv", "user,item,rating,timestamp"),
        _table(tmp_path / "shop.csv", "customer_id,product_sku,stars,ts"),
    )


def _same_data(a, b) -> None:
    for key in ("users", "items", "timestamps", "user_ids", "item_ids"):
        assert np.array_equal(getattr(a, key), getattr(b, key)), key


def test_a_mapped_table_loads_as_the_same_table_under_the_roles_names(tables, tmp_path):
    plain, shop = tables
    reference = load_table(plain)
    _same_data(load_table(shop, columns=COLUMNS), reference)
    # Matched case-insensitively, as the roles' own names are; through load_dataset too.
    shouting = {"user": "CUSTOMER_ID", "item": "Product_Sku", "timestamp": "TS"}
    _same_data(load_dataset(str(shop), min_interactions=3, columns=shouting), reference)
    # Without the timestamp column the order is the file's: a mapping may leave it out.
    untimed = load_table(shop, columns={"user": "customer_id", "item": "product_sku"})
    assert untimed.timestamps is None and np.array_equal(untimed.items, reference.items)
    # A .txt table is read as a table once columns are given (FilmTrust's otherwise).
    txt = tmp_path / "shop.txt"
    txt.write_text(shop.read_text())
    _same_data(load_dataset(str(txt), min_interactions=3, columns=COLUMNS), reference)
    pd = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    pd.read_csv(shop).to_parquet(tmp_path / "shop.parquet")
    _same_data(load_table(tmp_path / "shop.parquet", columns=COLUMNS), reference)


def test_without_a_mapping_the_message_says_how_to_name_the_columns(tables):
    with pytest.raises(DataError, match="no column\\(s\\) user, item") as caught:
        load_table(tables[1])
    assert "--columns user=COLUMN,item=COLUMN" in str(caught.value)


@pytest.mark.parametrize(
    ("columns", "message"),
    [
        ({"user": "customer_id", "rating": "stars"}, "securefed reads no rating"),
        ({"user": "customer_id", "itme": "sku"}, "'itme', which is not a role"),
        ({"user": "customer_id", "item": "Customer_ID"}, "the user and the item ids from one"),
        ({"user": "item"}, "the user and the item ids from one column, 'item'; map user"),
        ({"user": "customer_id", "item": ""}, "name the item column with a non-empty string"),
        ({"user": 3}, "name the user column with a non-empty string"),
        ("user=customer_id", "columns must map roles to column names"),
    ],
)
def test_a_malformed_mapping_is_one_config_error(columns, message):
    with pytest.raises(ConfigError, match=message):
        check_columns(columns)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("user", "takes ROLE=COLUMN pairs separated by commas"),
        ("user=a,user=b", "names the user column twice"),
        (",", "got nothing"),
    ],
)
def test_the_flag_s_own_mistakes(text, message):
    with pytest.raises(ConfigError, match=message):
        parse_columns(text)


def test_the_flag_parses_to_the_mapping_in_role_order():
    assert parse_columns(["Item=product_sku , user= customer_id", "timestamp=ts"]) == COLUMNS
    assert list(parse_columns("timestamp=ts,item=b,user=a")) == ["user", "item", "timestamp"]
