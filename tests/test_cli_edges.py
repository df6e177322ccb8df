"""Issue 15 point 9: user mistakes at the edges are one clear line and exit 2, never a
traceback, and leave nothing half written."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from typer.testing import CliRunner

from securefed.cli import app
from securefed.config import PrivacyConfig
from securefed.errors import ConfigError, DataError

SMALL = ["--synthetic-users", "60", "--synthetic-items", "400", "--rounds", "1"]
runner = CliRunner()


def _one_clear_line(res) -> None:
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    assert len([line for line in res.output.splitlines() if line.strip()]) <= 2, res.output


def test_account_with_a_trillion_rounds_answers_instead_of_running_out_of_memory():
    res = runner.invoke(
        app,
        ["account", "--noise-multiplier", "1", "--rounds", "1e12", "--client-fraction", "1e-6"],
    )
    assert res.exit_code == 0, res.output
    assert "1000000000000 rounds" in res.output


def test_account_says_a_secagg_run_calibrates_its_own_noise():
    # `account` computes the central Gaussian; a --secagg run's distributed discrete noise
    # needs a larger multiplier (several times larger with sampling), which it prints itself.
    res = runner.invoke(app, ["account", "--epsilon", "2", "--client-fraction", "0.1"])
    assert res.exit_code == 0 and "noise multiplier 2.26" in res.output, res.output
    assert "a --secagg run" in res.output and "calibrates its own" in res.output
    as_json = runner.invoke(app, ["account", "--epsilon", "2", "--json"])
    assert as_json.exit_code == 0 and "--secagg" not in as_json.output
    interaction = runner.invoke(
        app, ["account", "--epsilon", "2", "--privacy-unit", "interaction", "--rounds", "5"]
    )
    assert interaction.exit_code == 0 and "--secagg" not in interaction.output
    given = runner.invoke(app, ["account", "--noise-multiplier", "2", "--rounds", "5"])
    assert given.exit_code == 0 and "spends a larger epsilon" in given.output, given.output


@pytest.mark.parametrize("rounds", ["abc", "1.5", "0", "-3", "inf", "nan", "1e-3"])
def test_account_rejects_rounds_that_are_not_positive_integers(rounds):
    res = runner.invoke(app, ["account", "--epsilon", "1", "--rounds", rounds])
    _one_clear_line(res)
    assert "--rounds must be a positive integer" in res.output


@pytest.mark.parametrize("sigma", ["1e-300", "inf"])
def test_noise_multiplier_that_would_break_the_accountant_is_refused(sigma):
    res = runner.invoke(app, ["account", "--noise-multiplier", sigma, "--rounds", "10"])
    _one_clear_line(res)
    assert "noise multiplier" in res.output
    with pytest.raises(ConfigError, match="noise multiplier"):
        PrivacyConfig(noise_multiplier=float(sigma))


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through permission bits")
def test_unwritable_out_fails_before_the_data_loads_and_creates_nothing(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        res = runner.invoke(app, ["train", *SMALL, "--out", str(locked / "run")])
        _one_clear_line(res)
        assert "not writable" in res.output and "--out" in res.output
        assert not (locked / "run").exists()
    finally:
        locked.chmod(stat.S_IRWXU)


def test_out_under_a_file_is_one_line_and_creates_nothing(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    res = runner.invoke(app, ["train", *SMALL, "--out", str(blocker / "run")])
    _one_clear_line(res)
    assert "is a file, not a folder" in res.output
    assert blocker.read_text() == "x"


def _table(tmp_path: Path, rows: list[str]) -> Path:
    path = tmp_path / "log.csv"
    path.write_text("user,item,timestamp\n" + "\n".join(rows) + "\n")
    return path


def _rows(n_users: int = 4, n_items: int = 6) -> list[str]:
    return [f"{u},{i},{1000 + u * 10 + i}" for u in range(n_users) for i in range(n_items)]


def test_one_non_numeric_timestamp_names_its_line(tmp_path):
    rows = _rows()
    rows[5] = "0,5,yesterday"
    path = _table(tmp_path, rows)
    res = runner.invoke(app, ["train", "--dataset", str(path), "--out", str(tmp_path / "r")])
    _one_clear_line(res)
    assert "line 7" in res.output and "yesterday" in res.output
    assert not (tmp_path / "r").exists()


def test_an_impossible_date_time_names_its_line_and_far_dates_load(tmp_path):
    from securefed.data.loaders import load_table

    rows = [f"{u},{i},2020-01-0{1 + i}T00:00:00" for u in range(4) for i in range(6)]
    rows[3] = "0,3,2020-13-45T00:00:00"
    with pytest.raises(DataError, match="line 5.*2020-13-45"):
        load_table(_table(tmp_path, rows))
    rows[3] = "0,3,2262-06-01T00:00:00"  # past the nanosecond range of datetime64[ns]
    try:
        data = load_table(_table(tmp_path, rows))
    except DataError as exc:  # a pandas that parses only to nanoseconds: one clear line
        assert "line 5" in str(exc)
    else:
        assert data.timestamps is not None and float(data.timestamps.max()) > 9.2e9


@pytest.mark.parametrize("user", ["1e29", "100000000000000000000000000000", "-1e20"])
def test_user_ids_no_int64_holds_exactly_are_refused(tmp_path, user):
    from securefed.data.loaders import load_table

    rows = _rows()
    rows[2] = f"{user},2,1002"
    with pytest.raises(DataError, match="line 4.*out of range"):
        load_table(_table(tmp_path, rows))


@pytest.mark.parametrize("seed", [str(2**128), "-1"])
def test_a_seed_outside_what_the_derivation_hashes_is_one_line(tmp_path, seed):
    """Seeds are hashed as 16 bytes (protocols.seeding): 2**128 was a ValueError traceback."""
    args = ["train", "--seed", seed, "--rounds", "1", "--out", str(tmp_path / "r")]
    res = runner.invoke(app, args)
    _one_clear_line(res)
    assert "seed must be an integer in [0, 2**128)" in res.output
    assert not (tmp_path / "r").exists()


def test_first_hour_mistakes_found_in_review_are_one_line_each(tmp_path):
    """A folder or a binary file as --config, a file as an audit's or a report's --out, a
    non-boolean --param for a boolean setting and a delta below PRV's resolution were
    tracebacks (or, for the --param, silently read as true); a --min-interactions that drops
    every synthetic user failed after the run directory was written; an --epsilon cap that
    --noise-multiplier passes in round 1 trained nothing and exited 0."""
    binary = tmp_path / "bin.toml"
    binary.write_bytes(b"\xff\xfe\x00bad")
    afile = tmp_path / "afile.txt"
    afile.write_text("keep me")
    cases = [
        (["train", *SMALL, "--config", str(tmp_path)], "is a folder, not a config file"),
        (["train", *SMALL, "--config", str(binary)], "is not UTF-8 text"),
        (
            ["audit", *SMALL, "--canaries", "0", "--attacks", "row-change", "--out", str(afile)],
            "cannot create the audit directory",
        ),
        (
            [
                "report", "--models", "fedals", "--references", "none", "--defenses", "none",
                "--epsilons", "inf", "--seeds", "1", "--no-audit", *SMALL,
                "--out", str(afile / "x"),
            ],
            "cannot create the report directory",
        ),
        (
            ["train", *SMALL, "--epsilon", "2", "--param", "private=maybe",
             "--out", str(tmp_path / "p")],
            "fedals setting private is true or false, got 'maybe'",
        ),
        (
            ["train", *SMALL, "--min-interactions", "1000", "--out", str(tmp_path / "mi")],
            "synthetic data: no user has at least 1000 interactions",
        ),
        (
            ["train", *SMALL, "--epsilon", "2", "--noise-multiplier", "1",
             "--out", str(tmp_path / "cap")],
            "--noise-multiplier 1 spends epsilon 4.387 in round 1 alone, above the --epsilon 2",
        ),
        (["train", *SMALL, "--param", "dimm=8"], "--param dimm is not a setting of fedals"),
        (["train", *SMALL, "--lambda", "0.5"], "--lambda is not a setting of fedals"),
    ]  # fmt: skip
    for args, expected in cases:
        res = runner.invoke(app, args)
        _one_clear_line(res)
        assert expected in " ".join(res.output.split()), (args, res.output)
    assert afile.read_text() == "keep me"
    assert not any((tmp_path / name).exists() for name in ("p", "mi", "cap"))
    res = runner.invoke(app, ["account", "--epsilon", "2", "--delta", "1e-15"])
    assert res.exit_code == 0 and "delta 1e-15" in res.output, res.output


def test_a_report_refused_before_any_cell_leaves_nothing(tmp_path):
    """A report whose dataset is missing or empty, or whose grid has no cell (dp at epsilon
    inf), left a report.json behind (the second with "no finished run found in the given
    directories", though none were given)."""
    base = ["report", "--models", "fedals", "--references", "none", "--seeds", "1", "--no-audit"]
    res = runner.invoke(
        app, [*base, "--defenses", "none", "--epsilons", "inf", "--dataset", "nosuch.csv",
              "--out", str(tmp_path / "r1")],
    )  # fmt: skip
    _one_clear_line(res)
    res = runner.invoke(
        app, [*base, "--defenses", "dp", "--epsilons", "inf", *SMALL, "--out", str(tmp_path / "r2")]
    )
    _one_clear_line(res)
    assert "the grid has no cell to run" in " ".join(res.output.split())
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    res = runner.invoke(
        app, [*base, "--defenses", "none", "--epsilons", "inf", "--dataset", str(empty),
              "--out", str(tmp_path / "r3")],
    )  # fmt: skip
    _one_clear_line(res)  # refused by the first cell, after report.json was written
    assert not any((tmp_path / name).exists() for name in ("r1", "r2", "r3"))


@pytest.mark.parametrize("command", ["audit", "report"])
def test_audit_and_report_refuse_synthetic_data_too_big_before_generating_it(tmp_path, command):
    """`train` refused 2M x 500k synthetic data before generating it; `audit` and `report`
    generated it first and died in numpy (ArrayMemoryError, a traceback; report left its
    report.json)."""
    huge = ["--synthetic-users", "2000000", "--synthetic-items", "500000", "--rounds", "1"]
    extra = (
        ["--models", "fedals", "--references", "none", "--defenses", "none", "--epsilons",
         "inf", "--seeds", "1", "--no-audit"]
        if command == "report"
        else []
    )  # fmt: skip
    res = runner.invoke(app, [command, *extra, *huge, "--out", str(tmp_path / "o")])
    _one_clear_line(res)
    assert "mostly generating the synthetic data" in " ".join(res.output.split())
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["train", "--epslion", "2"], "No such option '--epslion'"),
        (["train", "--epsilon", "abc"], "'abc' is not a valid float; see securefed train --help"),
        (["trian"], "No such command 'trian'. Did you mean 'train'?; see securefed --help"),
        (["train", "--rounds"], "'--rounds' requires an argument; see securefed train --help"),
        (["account", "extra"], "unexpected extra argument (extra); see securefed account --help"),
        (["flower", "local", "--bogus"], "see securefed flower local --help"),
    ],
)
def test_a_command_line_that_does_not_parse_is_one_line(args, expected):
    """Click's usage box (five lines, a suggestion printed twice) was the one user mistake
    not refused in one line; it names the command whose help to read."""
    res = runner.invoke(app, args, prog_name="securefed")
    _one_clear_line(res)
    assert len(res.output.strip().splitlines()) == 1, res.output
    assert expected in " ".join(res.output.split()), res.output
    assert "Did you mean 'train'? Did you mean" not in res.output


def test_help_still_prints_without_a_command():
    for args in ([], ["flower"], ["train", "--help"]):
        res = runner.invoke(app, args, prog_name="securefed")
        assert res.exit_code == 0, (args, res.output)
        assert "Usage: securefed" in res.output, res.output


def test_flags_that_would_be_ignored_are_refused(tmp_path):
    """--clip without DP or secure aggregation bounded nothing; --dim beside --param dim
    trained with the --param value."""
    cases = [
        (["--clip", "2"], "this run has neither; add --epsilon or --noise-multiplier, or drop"),
        (["--dim", "16", "--param", "dim=8"], "--dim and --param dim set the same setting"),
        # DP-only and prior-only flags on a run without them (found 2026-12-06: ignored).
        (["--delta", "1e-6"], "this run has no DP; add --epsilon or --noise-multiplier"),
        (["--accountant", "rdp"], "drop --accountant"),
        (["--noise", "distributed"], "drop --noise"),
        (["--prior-items", "5"], "this run has none; add --private-prior SHARE"),
        (["--epsilon", "2", "--prior-weighting", "sqrt"], "drop --prior-weighting"),
    ]
    for extra, expected in cases:
        out = tmp_path / "r"
        res = runner.invoke(app, ["train", *SMALL, *extra, "--out", str(out)])
        _one_clear_line(res)
        assert expected in " ".join(res.output.split()), res.output
        assert not out.exists()
    with pytest.raises(ConfigError, match="drop --clip"):
        PrivacyConfig(clip=2.0)
    assert PrivacyConfig(clip=2.0, secagg=True).clip == 2.0  # the secure-aggregation bound
    assert PrivacyConfig(clip=2.0, epsilon=1.0).clip == 2.0


@pytest.mark.parametrize("command", ["train", "audit"])
def test_out_into_a_folder_holding_other_files_is_refused_and_they_stay(tmp_path, command):
    """A run or an audit wrote its files beside whatever the --out folder held."""
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "notes.txt").write_text("keep me")
    extra = ["--canaries", "0", "--attacks", "row-change"] if command == "audit" else []
    res = runner.invoke(app, [command, *SMALL, *extra, "--out", str(folder)])
    _one_clear_line(res)
    assert "already holds other files" in " ".join(res.output.split()), res.output
    assert sorted(p.name for p in folder.iterdir()) == ["notes.txt"]
    assert (folder / "notes.txt").read_text() == "keep me"
    empty = tmp_path / "empty"
    empty.mkdir()
    res = runner.invoke(app, ["train", *SMALL, "--out", str(empty)])
    assert res.exit_code == 0, res.output
    assert (empty / "config.toml").exists()


@pytest.mark.parametrize("command", ["train", "audit"])
def test_a_data_file_too_big_for_memory_is_refused_before_it_is_read(
    tmp_path, monkeypatch, command
):
    """A file dataset was read whole and parsed before any estimate: one larger than memory
    ended in an out-of-memory kill. Its size and rows are now checked against the memory
    available first (here 1 MB is made the whole machine's)."""
    import securefed.costs

    table = tmp_path / "big.csv"
    table.write_text("user,item\n" + "".join(f"{u},{u % 7}\n" for u in range(20000)))
    monkeypatch.setattr(securefed.costs, "available_memory", lambda: 1_000_000)

    read_bytes = Path.read_bytes

    def never_the_table(self: Path) -> bytes:
        if self == table:
            raise AssertionError("the table was read")
        return read_bytes(self)

    monkeypatch.setattr(Path, "read_bytes", never_the_table)
    out = tmp_path / "o"
    extra = ["--canaries", "0", "--attacks", "row-change"] if command == "audit" else []
    res = runner.invoke(app, [command, "--dataset", str(table), *extra, "--out", str(out)])
    _one_clear_line(res)
    line = " ".join(res.output.split())
    assert "about 20,0" in line and "rows) needs about" in line, line
    assert "1.0 MB is available here" in line, line
    assert not out.exists()


@pytest.mark.parametrize("command", ["local", "simulate"])
def test_flower_without_flower_installed_writes_nothing(tmp_path, monkeypatch, command):
    """It printed where the logs would go, made the run's folder and the app's files, and
    only then said that Flower is missing (found 2026-12-06)."""
    import sys

    monkeypatch.setitem(sys.modules, "flwr", None)  # import flwr raises ImportError
    monkeypatch.chdir(tmp_path)
    res = runner.invoke(app, ["flower", command, *SMALL, "--out", str(tmp_path / "run")])
    _one_clear_line(res)
    assert "Flower is not installed" in res.output
    assert list(tmp_path.iterdir()) == []


def test_relative_data_paths_are_recorded_absolute(tmp_path, monkeypatch):
    """config.toml recorded --dataset and --data-dir as typed, so a resume from another
    folder could not find the data, and --data-dir is refused beside --resume."""
    import tomllib

    import numpy as np

    rng = np.random.default_rng(0)
    users, items = rng.integers(0, 30, 600), rng.integers(0, 150, 600)
    rows = {(int(u), int(i)) for u, i in zip(users, items, strict=True)}
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "mine.csv").write_text(
        "user,item\n" + "".join(f"{u},{i}\n" for u, i in sorted(rows))
    )
    monkeypatch.chdir(tmp_path / "data")
    res = runner.invoke(
        app, ["train", "--model", "mostpop", "--dataset", "mine.csv", "--out", str(tmp_path / "r")]
    )
    assert res.exit_code == 0, res.output
    recorded = tomllib.loads((tmp_path / "r" / "config.toml").read_text())
    assert recorded["dataset"] == str(tmp_path / "data" / "mine.csv")
    monkeypatch.chdir(tmp_path)
    res = runner.invoke(app, ["train", "--resume", str(tmp_path / "r")])
    assert res.exit_code == 0 and "has finished" in res.output, res.output
    # A known name stays a name even where a folder of that name exists (review).
    (tmp_path / "synthetic").mkdir()
    res = runner.invoke(app, ["train", "--model", "mostpop", *SMALL, "--out", str(tmp_path / "s")])
    assert res.exit_code == 0, res.output
    assert tomllib.loads((tmp_path / "s" / "config.toml").read_text())["dataset"] == "synthetic"


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ('[privacy]\nepsilon = "two"\n', "[privacy] epsilon must be a number, got 'two'"),
        (
            '[privacy]\nepsilon = "2"\n',
            "[privacy] epsilon must be a number, got '2'; write 2 without quotes",
        ),
        ('[privacy]\nsecagg = "yes"\n', "[privacy] secagg must be true or false, got 'yes'"),
        ('[fedals]\ndim = "8"\n', "[fedals] dim must be a whole number, got '8'"),
        ('[fedals]\nshares = ["a", 0.3, 0.1]\n', "[fedals] shares must be a list of numbers"),
        ('seed = "3"\n', "seed must be a whole number, got '3'; write 3 without quotes"),
        ('client_fraction = "0.1"\n', "client_fraction must be a number, got '0.1'"),
        ("device = 3\n", "device must be a string, got 3"),
    ],
)
def test_a_config_value_of_the_wrong_type_names_its_key_and_the_kind(tmp_path, toml, message):
    """Found in a walkthrough: ``epsilon = "two"`` in [privacy] was "invalid [privacy]
    config: '>' not supported between instances of 'str' and 'int'" (``seed = "3"`` and
    ``device = 3`` the same, or a traceback)."""
    config = tmp_path / "c.toml"
    config.write_text(toml)
    res = runner.invoke(app, ["train", "--config", str(config), "--out", str(tmp_path / "r")])
    _one_clear_line(res)
    assert message in res.output and "not supported" not in res.output
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"epsilon": "2"}, "epsilon must be a number, got '2'; write 2 without quotes"),
        ({"noise_multiplier": "1"}, "noise_multiplier must be a number, got '1'"),
        ({"delta": None}, "delta must be a number, got None"),
        ({"secagg_scale_bits": 16.0}, "secagg_scale_bits must be a whole number, got 16.0"),
        ({"replay": "true"}, "replay must be true or false, got 'true'"),
    ],
)
def test_privacy_config_checks_types_before_comparing(kwargs, message):
    with pytest.raises(ConfigError) as err:
        PrivacyConfig(**kwargs)
    assert str(err.value).startswith(message), str(err.value)
    assert PrivacyConfig(epsilon=2).epsilon == 2  # a whole number is a number


@pytest.mark.parametrize(
    ("model", "kwargs", "message"),
    [
        ("fedals", {"shares": ("a", 1, 2)}, "shares must be a list of numbers"),
        ("fedals", {"dim": "8"}, "dim must be a whole number, got '8'; write 8 without quotes"),
        ("fedrap", {"lr_args": "0.1"}, "lr_args must be a number, got '0.1'"),
        ("fedrecgel", {"sam": 1}, "sam must be true or false, got 1"),
        ("ease", {"lam": "500"}, "lam must be a number, got '500'"),
        ("mostpop", {"max_items": 2.0}, "max_items must be a whole number, got 2.0"),
    ],
)
def test_model_settings_built_in_python_check_types_first(model, kwargs, message):
    """The model settings' own checks compared before they looked at types: FedALS's
    ``shares=("a", 1, 2)`` leaked Python's ValueError from inside (noted in the last
    closing note); each settings class now says which field and what it must be."""
    from securefed.models.registry import get_spec

    params = get_spec(model).params
    with pytest.raises(ConfigError) as err:
        params(**kwargs)
    assert str(err.value).startswith(message), str(err.value)


def test_a_config_table_for_another_model_is_refused_for_a_new_run(tmp_path):
    """Found in a walkthrough: ``model = "fedrap"`` with a ``[fedals]`` table trained FedRAP,
    the ``[fedals]`` settings silently unused. A run directory written before the registry
    (a table per model) still loads: only a config given for a new run is refused."""
    import tomllib

    from securefed.config import TrainConfig

    config = tmp_path / "c.toml"
    config.write_text('model = "fedrap"\n[fedals]\ndim = 8\n')
    want = "[fedals] in " + str(config) + " sets fedals's settings, but this run trains fedrap"
    for command in (["train"], ["flower", "local"], ["flower", "simulate"]):
        out = tmp_path / f"r-{command[-1]}"
        res = runner.invoke(app, [*command, *SMALL, "--config", str(config), "--out", str(out)])
        _one_clear_line(res)
        assert want in res.output, (command, res.output)
        assert not out.exists()
    # --model choosing another model than the file's table is the same mistake.
    config.write_text("[fedals]\ndim = 8\n")
    res = runner.invoke(
        app, ["train", *SMALL, "--model", "fedrap", "--config", str(config), "--out", "x"]
    )
    _one_clear_line(res)
    assert "[fedals] in" in res.output and "trains fedrap" in res.output
    # What runs write and read is unchanged: a run's own config.toml is a new run's config,
    # and a pre-registry run directory's config.toml (both tables) still loads.
    res = runner.invoke(
        app, ["train", *SMALL, "--config", str(config), "--out", str(tmp_path / "a")]
    )
    assert res.exit_code == 0, res.output
    written = tmp_path / "a" / "config.toml"
    res = runner.invoke(app, ["train", "--config", str(written), "--out", str(tmp_path / "b")])
    assert res.exit_code == 0, res.output
    legacy = {"model": "fedrap", "rounds": 1, "fedrap": {}, "fedrecgel": {}}
    assert TrainConfig.from_dict(legacy).model == "fedrap"
    assert tomllib.loads(written.read_text())["fedals"]["dim"] == 8


def test_python_dash_m_securefed_is_the_command():
    """``python -m securefed`` did not exist (found in a walkthrough): it runs the CLI."""
    import subprocess
    import sys

    res = subprocess.run(
        [sys.executable, "-m", "securefed", "--help"], capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0 and "train" in res.stdout and "audit" in res.stdout, res.stderr
