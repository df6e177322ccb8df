"""A table of one's own whose header names its columns otherwise (``customer_id,product_sku``):
``columns`` / ``--columns user=customer_id,item=product_sku`` reads it as it is, through the
Python API, ``securefed train`` (``--dry-run``, ``--resume``), ``audit``, ``report`` and
Flower, and a mapping that does not fit the file is one clear line."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from securefed import runs
from securefed.cli import app
from securefed.config import TrainConfig
from securefed.data import load_dataset
from securefed.data.loaders import check_columns, load_table, parse_columns
from securefed.errors import ConfigError, DataError
from securefed.training import RunInterrupted, load_split, train

runner = CliRunner()
MAP = "user=customer_id,item=product_sku,timestamp=ts"
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
    with pytest.raises(ConfigError, match=message):
        TrainConfig(dataset="shop.csv", columns=columns)  # type: ignore[arg-type]


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


@pytest.mark.parametrize(
    ("header", "columns", "message"),
    [
        (
            "customer_id,product_sku,stars,ts",
            "user=customer_id,item=sku",
            "has no column 'sku' \\(--columns item=sku; its header names customer_id, "
            "product_sku, stars, ts\\)",
        ),
        (
            "customer_id,product_sku,stars,ts",
            "user=customer_id,item=product_sku,timestamp=time",
            "has no column 'time'",
        ),
        (
            "user,customer_id,product_sku,ts",
            "user=customer_id,item=product_sku",
            "has both 'customer_id', which --columns user=customer_id reads the users from, "
            "and a column 'user': which one holds the users is ambiguous",
        ),
        (
            "customer_id,product_sku,Customer_ID,ts",
            "user=customer_id,item=product_sku",
            "names the column\\(s\\) customer_id more than once",
        ),
        (
            "timestamp,product_sku,stars,when",
            "user=timestamp,item=product_sku",
            "--columns user=timestamp reads the user ids from its timestamp column",
        ),
        ("customer_id,item,stars,ts", "user=customer_id,rating=stars", "reads no rating"),
        ("customer_id,item,stars,ts", "user=customer_id,shop=x", "'shop', which is not a role"),
    ],
)
def test_a_mapping_that_does_not_fit_the_file_is_one_line_and_writes_nothing(
    tmp_path, header, columns, message
):
    data = _table(tmp_path / "t.csv", header)
    for extra in (["--dry-run"], ["--out", str(tmp_path / "run")]):
        res = runner.invoke(
            app,
            ["train", "--model", "mostpop", "--dataset", str(data), "--columns", columns, *extra],
        )
        assert res.exit_code == 2, res.output
        assert "Traceback" not in res.output
        assert len([line for line in res.output.splitlines() if line.strip()]) == 1, res.output
        assert _matches(message, res.output), res.output
    assert not (tmp_path / "run").exists()


def _matches(pattern: str, text: str) -> bool:
    import re

    return re.search(pattern, " ".join(text.split())) is not None


def test_columns_are_refused_for_the_built_in_datasets_and_headerless_files(tmp_path):
    for name in ("synthetic", "ml-100k"):
        with pytest.raises(ConfigError, match=f"{name} is a built-in dataset"):
            TrainConfig(dataset=name, columns={"user": "a"})
        with pytest.raises(ConfigError, match=f"{name} is a built-in dataset"):
            load_dataset(name, columns={"user": "a"}, download=False)
    udata = tmp_path / "u.data"
    udata.write_text("1\t2\t5\t100\n")
    with pytest.raises(DataError, match="read as a headerless MovieLens file; drop --columns"):
        load_dataset(str(udata), columns={"user": "a"})
    with pytest.raises(DataError, match="is a folder; drop --columns"):
        load_dataset(str(tmp_path), columns={"user": "a"})
    res = runner.invoke(app, ["train", "--columns", "user=a", "--dry-run"])
    assert res.exit_code == 2 and "synthetic is a built-in dataset" in res.output, res.output


def test_train_records_the_mapping_and_a_resume_reads_the_same_data(tables, tmp_path):
    plain, shop = tables
    reference = load_split(TrainConfig(dataset=str(plain), min_interactions=5))
    dry = runner.invoke(app, ["train", "--dataset", str(shop), "--columns", MAP, "--dry-run"])
    assert dry.exit_code == 0, dry.output
    assert f"{reference.n_users:,} users, {reference.n_items:,} items" in dry.output, dry.output
    # A run interrupted after round 2 (checkpointed), from the Python API ...
    run = tmp_path / "run"
    cfg = TrainConfig(dataset=str(shop), columns=COLUMNS, rounds=4, checkpoint_every=1)

    def stop(record):
        if record.round == 2:
            raise KeyboardInterrupt

    with pytest.raises(RunInterrupted):
        train(cfg, out=run, progress=stop)
    recorded = tomllib.loads((run / runs.CONFIG_FILE).read_text())
    assert recorded["columns"] == COLUMNS
    # ... resumes from the command line on the same data (the resume's data check passes),
    res = runner.invoke(app, ["train", "--resume", str(run)])
    assert res.exit_code == 0, res.output
    assert "resuming" in res.output and "started on other data" not in res.output
    summary = json.loads((run / runs.SUMMARY_FILE).read_text())
    assert (summary["users"], summary["items"], summary["rounds"]) == (
        reference.n_users,
        reference.n_items,
        4,
    )
    # and a mapping beside --resume is refused: the run reads its data as it recorded it.
    res = runner.invoke(app, ["train", "--resume", str(run), "--columns", "user=x"])
    assert res.exit_code == 2 and "drop --columns" in res.output, res.output


def test_a_config_file_s_columns_table_and_the_flag_over_it(tables, tmp_path):
    _, shop = tables
    config = tmp_path / "c.toml"
    config.write_text(
        f'dataset = "{shop}"\nmodel = "mostpop"\n\n[columns]\nuser = "customer_id"\n'
        'item = "wrong"\n'
    )
    res = runner.invoke(app, ["train", "--config", str(config), "--dry-run"])
    assert res.exit_code == 2 and "has no column 'wrong'" in res.output, res.output
    out = tmp_path / "run"
    res = runner.invoke(
        app,
        ["train", "--config", str(config), "--columns", "item=product_sku", "--out", str(out)],
    )
    assert res.exit_code == 0, res.output
    assert tomllib.loads((out / runs.CONFIG_FILE).read_text())["columns"] == {
        "user": "customer_id",
        "item": "product_sku",
    }


def test_audit_reads_the_mapped_table_and_audit_run_reads_it_as_recorded(tables, tmp_path):
    _, shop = tables
    args = ["audit", "--model", "mostpop", "--dataset", str(shop), "--columns", MAP]
    res = runner.invoke(app, [*args, "--canaries", "0", "--out", str(tmp_path / "a")])
    assert res.exit_code == 0, res.output
    recorded = tomllib.loads((tmp_path / "a" / "run" / runs.CONFIG_FILE).read_text())
    assert recorded["columns"] == COLUMNS
    run = tmp_path / "run"
    train(TrainConfig(dataset=str(shop), columns=COLUMNS, model="mostpop"), out=run)
    res = runner.invoke(
        app, ["audit", "--run", str(run), "--canaries", "0", "--out", str(tmp_path / "b")]
    )
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "b" / "audit.json").read_text())["dataset"] == str(shop)
    res = runner.invoke(app, ["audit", "--run", str(run), "--columns", MAP])
    assert res.exit_code == 2 and "drop --columns" in res.output, res.output


def test_report_cells_read_the_mapped_table(tables, tmp_path):
    from securefed.report import ReportConfig, run_report

    _, shop = tables
    config = ReportConfig(
        models=("mostpop",),
        references=(),
        dataset=str(shop),
        columns=COLUMNS,
        epsilons=(float("inf"),),
        defenses=("none",),
        seeds=1,
        audit=False,
    )
    run_report(config, out=tmp_path / "rep")
    (cell,) = (tmp_path / "rep" / "cells").iterdir()
    assert tomllib.loads((cell / runs.CONFIG_FILE).read_text())["columns"] == COLUMNS
    res = runner.invoke(
        app, ["report", "--from", str(tmp_path / "rep"), "--columns", MAP, "--no-audit"]
    )
    assert res.exit_code == 2 and "drop --columns" in res.output, res.output
    res = runner.invoke(
        app,
        ["report", "--models", "mostpop", "--references", "none", "--epsilons", "inf"]
        + ["--defenses", "none", "--seeds", "1", "--no-audit", "--dataset", str(shop)]
        + ["--columns", "user=customer_id,item=nope", "--out", str(tmp_path / "bad")],
    )
    assert res.exit_code == 2 and "has no column 'nope'" in res.output, res.output
    assert not (tmp_path / "bad").exists()


def test_flower_nodes_read_the_mapped_table_and_a_pin_compares_the_mapping(tables, tmp_path):
    pytest.importorskip("flwr")
    from securefed.cli.flower import _config
    from securefed.config import PrivacyConfig
    from securefed.errors import ProtocolError
    from securefed.flower.local import LocalTransport
    from securefed.flower.server import FederatedServer

    _, shop = tables
    # The operator's flags: a config whose [columns] every node reads.
    cfg = _config(
        None,
        model="fedals",
        rounds=1,
        seed=None,
        epsilon=None,
        synthetic_users=None,
        synthetic_items=None,
        dataset=str(shop),
        columns=[MAP],
    )
    assert cfg.columns == COLUMNS
    transport = LocalTransport(2, state_dir=tmp_path / "m")
    res = FederatedServer(cfg, run_dir=tmp_path / "ok", transport=transport).run()
    assert res.summary["users"] == load_split(cfg).n_users
    # A node pinned to the operator's config refuses a server that maps another column.
    pinned = tmp_path / "run.toml"
    pinned.write_text(runs.dumps_toml(cfg.to_dict()))
    transport = LocalTransport(2, state_dir=tmp_path / "n")
    for node_config in transport.node_configs.values():
        node_config["pin-config"] = str(pinned)
    other = TrainConfig(
        model="fedals",
        rounds=1,
        dataset=str(shop),
        columns={"user": "customer_id", "item": "product_sku"},  # no timestamps: other order
        privacy=PrivacyConfig(secagg=True),
    )
    with pytest.raises(ProtocolError, match="pinned config .* columns = "):
        FederatedServer(other, run_dir=tmp_path / "other", transport=transport).run()


def test_flower_init_writes_the_mapping(tables, tmp_path):
    pytest.importorskip("flwr")
    _, shop = tables
    path = tmp_path / "f.toml"
    res = runner.invoke(
        app, ["flower", "init", str(path), "--dataset", str(shop), "--columns", MAP]
    )
    assert res.exit_code == 0, res.output
    assert tomllib.loads(path.read_text())["columns"] == COLUMNS
    res = runner.invoke(
        app, ["flower", "init", str(tmp_path / "g.toml"), "--dataset", str(shop), "--columns", "x"]
    )
    assert res.exit_code == 2 and "takes ROLE=COLUMN pairs" in res.output, res.output
    assert not (tmp_path / "g.toml").exists()
