"""Readers for the published rating files and generic interaction tables.

Every loader returns :class:`~securefed.data.types.Interactions` with dense ids and implicit
feedback (every rating, whatever its value, is one positive interaction). The cleaning steps
are the same for all formats and are counted in the :class:`~securefed.data.types.LoadReport`:

1. Duplicate ``(user, item)`` pairs keep one row: the one with the latest timestamp (ties:
   the first in file order) or, without timestamps, the first in file order.
2. Users with fewer than ``min_interactions`` interactions are dropped (one pass, no k-core
   iteration); items left without any interaction disappear with them.
3. Original ids are remapped to dense indices in ascending order of the original id.

A malformed file raises one :class:`~securefed.errors.DataError` that names the file, what is
wrong with it and what to do; pandas parser errors never reach the caller.
"""

from __future__ import annotations

import dataclasses
import io
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np
import pandas as pd

from securefed.data.types import Interactions, LoadReport
from securefed.errors import ConfigError, DataError

__all__ = [
    "AGE_BUCKET_EDGES",
    "TABLE_ROLES",
    "check_columns",
    "filter_min_interactions",
    "load_filmtrust",
    "load_ml100k",
    "load_ml1m",
    "load_table",
    "parse_columns",
]

# Lower edges of the MovieLens 1M age groups ("Under 18", "18-24", ..., "56+"); MovieLens 100K
# exact ages are put into the same groups so that both datasets share one ``age_bucket`` code.
AGE_BUCKET_EDGES = (0, 18, 25, 35, 45, 50, 56)


def _age_bucket(age: np.ndarray) -> np.ndarray:
    bucket = np.searchsorted(np.asarray(AGE_BUCKET_EDGES[1:]), age, side="right").astype(np.int64)
    return np.where(age < 0, -1, bucket)


#: Peak memory of loading one row of an interaction table, on top of the file's own bytes
#: (which are read whole): measured with ``load_table`` (peak RSS less the imports') at
#: 140 B a row on Gowalla's checkins.csv (923,508 ``user,item`` rows, 10.1 MB) and 180 B on
#: a million ``user,item,rating,timestamp`` rows (24.4 MB); 2026-12-06.
_LOAD_BYTES_PER_ROW = 200


def check_table_fits(path: Path, *, rows: float | None = None) -> None:
    """Refuse, before reading it, a table that loading would not fit in the memory available
    here (:func:`securefed.costs.available_memory`): the file's bytes plus
    :data:`_LOAD_BYTES_PER_ROW` a row, the rows counted from its first MiB's line length
    (or given: a Parquet file's metadata). The run's own estimate comes after the load; this
    is what keeps a file larger than memory from ending in an out-of-memory kill.

    Raises:
        InsufficientMemory: one line: the file, the estimate, what is available.
    """
    from securefed import costs

    try:
        size = path.stat().st_size
    except OSError:
        return  # the read says what is wrong
    available = costs.available_memory()
    if available is None:
        return
    if rows is None:
        try:
            with path.open("rb") as fh:
                head = fh.read(1 << 20)
        except OSError:
            return  # unreadable (a folder, no permission): the read says so in one line
        rows = size * max(head.count(b"\n"), 1) / max(len(head), 1)
    need = size + rows * _LOAD_BYTES_PER_ROW
    if need > available:
        raise costs.InsufficientMemory(
            f"{path} ({costs.format_bytes(size)}, about {rows:,.0f} rows) needs about "
            f"{costs.format_bytes(need)} of memory to load and {costs.format_bytes(available)} "
            "is available here; load a smaller extract of it (fewer users), or run where more "
            "memory is free"
        )


def _read_text(path: Path, *, what: str) -> bytes:
    check_table_fits(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise DataError(f"{what} file not found: {path}") from None
    except OSError as exc:
        raise DataError(f"cannot read {what} file {path}: {exc.strerror or exc}") from None
    if not raw.strip():
        raise DataError(f"{path} is empty; expected {what} rows")
    return raw


def _read_columns(
    path: Path,
    raw: bytes,
    *,
    sep: str,
    names: tuple[str, ...],
    optional: int = 0,
    what: str,
) -> pd.DataFrame:
    """Parse a header-less table and check its column count.

    Args:
        path: The file (for messages only).
        raw: Its bytes (multi-character separators already replaced by ``sep``).
        sep: Single-character separator or ``r"\\s+"``.
        names: Column names; the last ``optional`` of them may be missing from the file.
        optional: How many trailing columns are optional.
        what: Human description of the expected layout, used in messages.
    """
    try:
        frame = pd.read_csv(io.BytesIO(raw), sep=sep, header=None, keep_default_na=False)
    except pd.errors.EmptyDataError:
        raise DataError(f"{path} is empty; expected {what}") from None
    except (pd.errors.ParserError, UnicodeDecodeError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DataError(
            f"{path} is not a valid {what} file ({first}); check the separator and that "
            f"every line has {len(names)} columns"
        ) from None
    n_cols = frame.shape[1]
    if not len(names) - optional <= n_cols <= len(names):
        raise DataError(
            f"{path} has {n_cols} column(s) per line, expected {len(names)} ({what}); "
            "check that this is the right file and separator"
        )
    frame.columns = list(names[:n_cols])
    empty = (frame.isna() | (frame == "")).to_numpy()
    if empty.any():
        row = int(np.nonzero(empty.any(axis=1))[0][0])
        raise DataError(
            f"{path} line {row + 1} has missing fields; expected {len(names)} columns ({what})"
        )
    return frame


#: Ids read as floats (a decimal point or an exponent somewhere in the column) must stay
#: below 2**53 in magnitude, where every integer is exact and distinct ids stay distinct.
_EXACT_FLOAT_INT = 2.0**53


def _place(row: int, offset: int | None) -> str:
    """Where row ``row`` (from 0) of a table is, for a message: ``line N`` of a text file
    whose row 0 is on line ``offset``, or ``row N`` (from 1) of a file without lines
    (Parquet: ``offset`` None; found in a walkthrough: its first row was "line 0")."""
    return f"row {row + 1}" if offset is None else f"line {row + offset}"


def _integer_column(
    values: pd.Series, *, path: Path, column: str, offset: int | None = 1
) -> np.ndarray:
    """Integer ids of a column, exact: a value that is not an integer, or that an int64 (or,
    written as a float, a float64) cannot hold exactly, is one DataError naming its line."""
    numeric = pd.to_numeric(values, errors="coerce")
    if pd.api.types.is_integer_dtype(numeric.dtype):
        ints = numeric.to_numpy()
        if ints.dtype == np.uint64:  # above the int64 range
            too_big = ints > np.iinfo(np.int64).max
            row = int(np.nonzero(too_big)[0][0]) if too_big.any() else -1
            if row >= 0:
                raise DataError(
                    _id_range_error(path, _place(row, offset), column, values.iloc[row])
                )
        return ints.astype(np.int64)
    arr = numeric.to_numpy(dtype=np.float64, na_value=np.nan)
    bad = ~np.isfinite(arr) | (arr != np.round(arr))
    if bad.any():
        row = int(np.nonzero(bad)[0][0])
        raise DataError(
            f"{path} {_place(row, offset)}: {column} '{values.iloc[row]}' is not an integer; "
            f"{column}s must be integer ids"
        )
    large = np.abs(arr) >= _EXACT_FLOAT_INT
    if large.any():
        row = int(np.nonzero(large)[0][0])
        raise DataError(_id_range_error(path, _place(row, offset), column, values.iloc[row]))
    return arr.astype(np.int64)


#: Memory string ids take beyond what :func:`check_table_fits` allowed, a row: the columns'
#: stripped copies and the factorisation (measured 2026-12-07: 400,000 rows of UUID users and
#: SKU items peaked 441 B a row above the imports, 185 B above that check's file size plus
#: 200 B a row; with a margin, asked of each string column).
_STRING_ID_BYTES_PER_ROW = 250


def _check_string_ids_fit(path: Path, rows: int) -> None:
    """Refuse, before it is parsed, a column of string ids the memory left cannot parse
    (the check before the read budgets integer ids).

    Raises:
        InsufficientMemory: one line: the file, the estimate, what is available.
    """
    from securefed import costs

    available = costs.available_memory()
    need = rows * _STRING_ID_BYTES_PER_ROW
    if available is not None and need > available:
        raise costs.InsufficientMemory(
            f"{path}: its string ids ({rows:,} rows) need about {costs.format_bytes(need)} more "
            f"memory to read and {costs.format_bytes(available)} is available here; map the ids "
            "to integers first, load a smaller extract, or run where more memory is free"
        )


#: The load notes that repeat a count of the report (``duplicate_rows``, ``dropped_users``):
#: :func:`_build`'s and :func:`filter_min_interactions`'s wording, which a printer of the
#: counts leaves out (``securefed.cli.progress.data_summary``).
COUNT_NOTE = re.compile(r"^[\d,]+ (duplicate \(user, item\)|user\(s\) with fewer than)")


#: Words a table may hold for "no value": an id spelled so is missing, not a user or item.
MISSING_WORDS = frozenset({"", "na", "n/a", "nan", "null", "none", "<na>"})


def _table_ids(
    values: pd.Series, *, path: Path, column: str, offset: int | None
) -> tuple[np.ndarray, np.ndarray | None, str | None]:
    """Ids of a user's own table: integers where every value is a number (as
    :func:`_integer_column`: ``005`` and ``5`` are one id, ``2.5`` is refused), else strings
    (UUIDs, SKUs: each distinct string, spaces around it stripped, is one id). Returns the
    ids (int64: the numbers, or the string's rank among the distinct strings), the distinct
    strings in that order (None for numbers) and a note saying the column was read as
    strings (naming the line, not the value: an id may be an e-mail address). A missing id
    (empty, ``NA``, ``null``, ...) is one DataError."""
    missing = values.isna().to_numpy().copy()
    if not missing.any() and pd.api.types.is_numeric_dtype(values.dtype):
        return _integer_column(values, path=path, column=column, offset=offset), None, None
    _check_string_ids_fit(path, len(values))
    text = values.astype(str).str.strip()
    missing |= text.str.lower().isin(MISSING_WORDS).to_numpy()
    if missing.any():
        row = int(np.nonzero(missing)[0][0])
        raise DataError(
            f"{path} {_place(row, offset)}: the {column} is missing ({str(values.iloc[row])!r})"
        )
    numeric = pd.to_numeric(text, errors="coerce").notna().to_numpy()
    if numeric.all():
        return _integer_column(text, path=path, column=column, offset=offset), None, None
    row = int(np.nonzero(~numeric)[0][0])
    where = f"line {row + offset} is" if offset is not None else f"the {column} of row {row + 1} is"
    note = (
        f"{column}s read as strings ({where} not a number): each distinct string is one "
        f"{column.split()[0]}"
    )
    # Codes, not a fixed-width string array: a log of UUIDs would take ~7x the memory the
    # load's check allows for (found in review).
    codes, labels = pd.factorize(text, sort=True)
    return codes.astype(np.int64), np.asarray(labels, dtype=object), note


def _id_range_error(path: Path, place: str, column: str, value: object) -> str:
    return (
        f"{path} {place}: {column} '{value}' is out of range; {column}s must be integers "
        "of magnitude below 2**53 (9007199254740992), or plain integers below 2**63 when "
        "the column has no decimal points or exponents; renumber the ids"
    )


def _float_column(
    values: pd.Series, *, path: Path, column: str, offset: int | None = 1
) -> np.ndarray:
    arr = pd.to_numeric(values, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    bad = ~np.isfinite(arr)
    if bad.any():
        row = int(np.nonzero(bad)[0][0])
        raise DataError(
            f"{path} {_place(row, offset)}: {column} '{values.iloc[row]}' is not a number"
        )
    return arr


def _build(
    *,
    name: str,
    source: Path | str,
    users: np.ndarray,
    items: np.ndarray,
    timestamps: np.ndarray | None,
    user_table: dict[str, dict[int, int]] | None,
    min_interactions: int,
    notes: tuple[str, ...] = (),
) -> Interactions:
    """Deduplicate, remap to dense ids, attach attributes and apply the user filter."""
    raw_rows = len(users)
    order = np.arange(raw_rows)
    if timestamps is not None:
        # Latest timestamp first, ties by file order, so the first row of each pair wins.
        order = np.lexsort((order, -timestamps))
    pair = pd.DataFrame({"u": users[order], "i": items[order]})
    keep = order[~pair.duplicated(keep="first").to_numpy()]
    keep.sort()  # back to file order
    duplicates = raw_rows - len(keep)
    users, items = users[keep], items[keep]
    if timestamps is not None:
        timestamps = timestamps[keep]
    user_ids, dense_users = np.unique(users, return_inverse=True)
    item_ids, dense_items = np.unique(items, return_inverse=True)

    attributes: dict[str, np.ndarray] = {}
    extra_notes: list[str] = []
    if user_table:
        missing = 0
        for key, mapping in user_table.items():
            values = np.array([mapping.get(int(u), -1) for u in user_ids], dtype=np.int64)
            missing = max(missing, int((values < 0).sum()))
            attributes[key] = values
        if missing:
            extra_notes.append(f"{missing} user(s) have no demographics row; attributes are -1")
    if duplicates:
        rule = "latest timestamp" if timestamps is not None else "first row in file order"
        extra_notes.append(f"{duplicates} duplicate (user, item) row(s) removed, kept the {rule}")

    data = Interactions(
        name=name,
        users=dense_users.astype(np.int64),
        items=dense_items.astype(np.int64),
        timestamps=None if timestamps is None else timestamps.astype(np.float64),
        n_users=len(user_ids),
        n_items=len(item_ids),
        user_ids=user_ids,
        item_ids=item_ids,
        attributes=attributes,
        report=LoadReport(
            source=str(source),
            raw_rows=raw_rows,
            duplicate_rows=duplicates,
            dropped_users=0,
            dropped_interactions=0,
            notes=(*notes, *extra_notes),
        ),
    )
    result = filter_min_interactions(data, min_interactions)
    if result.n_users == 0:
        raise DataError(
            f"{source}: no user has at least {min_interactions} interactions "
            f"({raw_rows:,} rows read); lower --min-interactions (min_interactions) or use a "
            "larger dataset"
        )
    return result


def filter_min_interactions(data: Interactions, min_interactions: int) -> Interactions:
    """Drop users with fewer than ``min_interactions`` interactions.

    Users and items are re-indexed densely when anything is dropped (items whose only
    interactions belonged to dropped users disappear); the report counts what was removed.
    Returns ``data`` itself when nothing is dropped.

    Args:
        data: Interactions without duplicate ``(user, item)`` pairs.
        min_interactions: Minimum interactions per kept user (at least 1). Leave-one-out
            needs 3; the FedRecGEL preprocessing uses 5.
    """
    if isinstance(min_interactions, bool) or not isinstance(min_interactions, int | np.integer):
        raise ConfigError(f"min_interactions must be an integer, got {min_interactions!r}")
    if min_interactions < 1:
        raise ConfigError(f"min_interactions must be at least 1, got {min_interactions!r}")
    counts = np.bincount(data.users, minlength=data.n_users)
    keep_user = counts >= min_interactions
    if keep_user.all():
        return data
    rows = keep_user[data.users]
    kept_users = np.nonzero(keep_user)[0]
    kept_items = np.unique(data.items[rows])
    user_map = np.full(data.n_users, -1, dtype=np.int64)
    user_map[kept_users] = np.arange(len(kept_users))
    item_map = np.full(data.n_items, -1, dtype=np.int64)
    item_map[kept_items] = np.arange(len(kept_items))
    dropped_users = int(data.n_users - len(kept_users))
    dropped_rows = int(len(rows) - rows.sum())
    report = dataclasses.replace(
        data.report,
        dropped_users=data.report.dropped_users + dropped_users,
        dropped_interactions=data.report.dropped_interactions + dropped_rows,
        notes=(
            *data.report.notes,
            f"{dropped_users} user(s) with fewer than {min_interactions} interactions dropped "
            f"({dropped_rows} interactions)",
        ),
    )
    return dataclasses.replace(
        data,
        users=user_map[data.users[rows]],
        items=item_map[data.items[rows]],
        timestamps=None if data.timestamps is None else data.timestamps[rows],
        n_users=len(kept_users),
        n_items=len(kept_items),
        user_ids=data.user_ids[kept_users],
        item_ids=data.item_ids[kept_items],
        attributes={k: v[kept_users] for k, v in data.attributes.items()},
        report=report,
    )


def _read_users(
    path: Path, *, sep: str, multi_sep: str | None, exact_age: bool
) -> dict[str, dict[int, int]]:
    """Read MovieLens demographics (``user|age|gender|...`` or ``user::gender::age::...``)."""
    raw = _read_text(path, what="MovieLens users")
    if multi_sep is not None:
        raw = raw.replace(multi_sep.encode(), sep.encode())
    if exact_age:
        names = ("user", "age", "gender", "occupation", "zip")
        layout = "user|age|gender|occupation|zip"
    else:
        names = ("user", "gender", "age", "occupation", "zip")
        layout = "UserID::Gender::Age::Occupation::Zip-code"
    try:
        frame = pd.read_csv(
            io.BytesIO(raw),
            sep=sep,
            header=None,
            dtype=str,
            keep_default_na=False,
            encoding="latin-1",
        )
    except (pd.errors.ParserError, ValueError) as exc:
        raise DataError(f"{path} is not a valid users file ({layout}): {exc}") from None
    if frame.shape[1] != len(names):
        raise DataError(
            f"{path} has {frame.shape[1]} column(s) per line, expected {len(names)} ({layout})"
        )
    frame.columns = list(names)
    users = _integer_column(frame["user"], path=path, column="user id")
    age = _integer_column(frame["age"], path=path, column="age")
    gender_raw = frame["gender"].str.strip().str.upper()
    bad = ~gender_raw.isin(["F", "M"])
    if bad.any():
        row = int(np.nonzero(bad.to_numpy())[0][0])
        raise DataError(
            f"{path} line {row + 1}: gender {frame['gender'].iloc[row]!r} is not 'F' or 'M'"
        )
    gender = (gender_raw == "F").to_numpy().astype(np.int64)
    return {
        "gender": dict(zip(users.tolist(), gender.tolist(), strict=True)),
        "age": dict(zip(users.tolist(), age.tolist(), strict=True)),
        "age_bucket": dict(zip(users.tolist(), _age_bucket(age).tolist(), strict=True)),
    }


def _resolve_file(path: str | Path, filename: str) -> Path:
    path = Path(path)
    return path / filename if path.is_dir() else path


def load_ml100k(path: str | Path, *, min_interactions: int = 3) -> Interactions:
    """Load MovieLens 100K (``u.data``; demographics from ``u.user`` beside it when present).

    Args:
        path: ``u.data`` itself or the folder that holds it.
        min_interactions: Users with fewer interactions are dropped.

    Returns:
        Interactions with timestamps and, when ``u.user`` exists, the attributes ``"gender"``
        (1 = F, 0 = M), ``"age"`` (years) and ``"age_bucket"`` (index into
        :data:`AGE_BUCKET_EDGES`).
    """
    data_path = _resolve_file(path, "u.data")
    raw = _read_text(data_path, what="MovieLens 100K ratings")
    frame = _read_columns(
        data_path,
        raw,
        sep="\t",
        names=("user", "item", "rating", "timestamp"),
        what="tab-separated 'user item rating timestamp' (MovieLens u.data)",
    )
    users_path = data_path.with_name("u.user")
    table = None
    if users_path.is_file():
        table = _read_users(users_path, sep="|", multi_sep=None, exact_age=True)
    return _build(
        name="ml-100k",
        source=data_path,
        users=_integer_column(frame["user"], path=data_path, column="user id"),
        items=_integer_column(frame["item"], path=data_path, column="item id"),
        timestamps=_float_column(frame["timestamp"], path=data_path, column="timestamp"),
        user_table=table,
        min_interactions=min_interactions,
    )


def load_ml1m(path: str | Path, *, min_interactions: int = 3) -> Interactions:
    """Load MovieLens 1M (``ratings.dat``; demographics from ``users.dat`` when present).

    Args:
        path: ``ratings.dat`` itself or the folder that holds it.
        min_interactions: Users with fewer interactions are dropped.

    Returns:
        Interactions with timestamps and, when ``users.dat`` exists, ``"gender"`` (1 = F),
        ``"age"`` (the MovieLens 1M age-group code: 1, 18, 25, ...) and ``"age_bucket"``.
    """
    data_path = _resolve_file(path, "ratings.dat")
    raw = _read_text(data_path, what="MovieLens 1M ratings").replace(b"::", b"\t")
    frame = _read_columns(
        data_path,
        raw,
        sep="\t",
        names=("user", "item", "rating", "timestamp"),
        what="'::'-separated 'UserID::MovieID::Rating::Timestamp' (MovieLens ratings.dat)",
    )
    users_path = data_path.with_name("users.dat")
    table = None
    if users_path.is_file():
        table = _read_users(users_path, sep="\t", multi_sep="::", exact_age=False)
    return _build(
        name="ml-1m",
        source=data_path,
        users=_integer_column(frame["user"], path=data_path, column="user id"),
        items=_integer_column(frame["item"], path=data_path, column="item id"),
        timestamps=_float_column(frame["timestamp"], path=data_path, column="timestamp"),
        user_table=table,
        min_interactions=min_interactions,
    )


def load_filmtrust(path: str | Path, *, min_interactions: int = 3) -> Interactions:
    """Load FilmTrust (LibRec ``ratings.txt``: space-separated ``user item rating``).

    The file has no timestamps, so :func:`~securefed.data.split.leave_one_out` orders each
    user's interactions by a seeded random permutation. The published file contains duplicate
    ``(user, item)`` rows; the first in file order is kept and the rest are counted.

    Args:
        path: ``ratings.txt`` itself or the folder that holds it.
        min_interactions: Users with fewer interactions are dropped.
    """
    data_path = _resolve_file(path, "ratings.txt")
    raw = _read_text(data_path, what="FilmTrust ratings")
    frame = _read_columns(
        data_path,
        raw,
        sep=r"\s+",
        names=("user", "item", "rating"),
        what="space-separated 'user item rating' (FilmTrust ratings.txt)",
    )
    return _build(
        name="filmtrust",
        source=data_path,
        users=_integer_column(frame["user"], path=data_path, column="user id"),
        items=_integer_column(frame["item"], path=data_path, column="item id"),
        timestamps=None,
        user_table=None,
        min_interactions=min_interactions,
    )


def _timestamp_column(ts: pd.Series, *, path: Path, offset: int | None) -> np.ndarray:
    """Seconds since the epoch from a column of numbers or of ISO 8601 date-times (one format
    for the whole column); anything else is one DataError naming the first bad line."""
    numeric = pd.to_numeric(ts, errors="coerce")
    is_number = numeric.notna().to_numpy()
    if is_number.all():
        return _float_column(ts, path=path, column="timestamp", offset=offset)
    if is_number.any():
        row = int(np.nonzero(~is_number)[0][0])
        first = int(np.nonzero(is_number)[0][0])
        raise DataError(
            f"{path} {_place(row, offset)}: timestamp {ts.iloc[row]!r} is not a number, but "
            f"{_place(first, offset)} holds one ({ts.iloc[first]!r}); give every timestamp as "
            "seconds or every one as an ISO 8601 date-time"
        )
    try:
        parsed = pd.to_datetime(ts, utc=True, format="ISO8601")
        # Microseconds since the epoch, whatever unit pandas parsed to (pandas 3 keeps
        # dates past 2262 at microsecond resolution; nanoseconds would overflow).
        micros = parsed.dt.tz_localize(None).to_numpy().astype("datetime64[us]").astype(np.int64)
        return micros.astype(np.float64) / 1e6
    except (ValueError, TypeError, OverflowError):  # OutOfBoundsDatetime is a ValueError
        pass
    bad_row = next((i for i, value in enumerate(ts) if not _is_datetime(value)), None)
    if bad_row is None:
        raise DataError(
            f"{path}: the timestamps parse one by one but not as one column (mixed formats or "
            "time zones?); give every timestamp in one ISO 8601 form, or as seconds"
        )
    raise DataError(
        f"{path} {_place(bad_row, offset)}: timestamp {ts.iloc[bad_row]!r} is neither a number "
        "nor an ISO 8601 date-time this pandas can represent"
    )


def _is_datetime(value: object) -> bool:
    """Whether one value parses as an ISO 8601 date-time in pandas' nanosecond range."""
    try:
        pd.to_datetime(value, utc=True, format="ISO8601")
    except (ValueError, TypeError, OverflowError):
        return False
    return True


TABLE_COLUMNS = ("user", "item", "rating", "timestamp")
#: What a table's columns are read as, in this order: the roles a ``columns`` mapping
#: (``--columns user=customer_id,item=product_sku``) may name a column for. ``rating`` is
#: not one: every row is one positive interaction, whatever its rating (implicit feedback).
TABLE_ROLES = ("user", "item", "timestamp")


def parse_columns(text: str | Iterable[str]) -> dict[str, str]:
    """A ``columns`` mapping from ``ROLE=COLUMN`` pairs separated by commas
    (``"user=customer_id,item=product_sku"``; several such strings, one per ``--columns``
    given, are one mapping), checked by :func:`check_columns`.

    Raises:
        ConfigError: A pair without ``=``, a role given twice, or what
            :func:`check_columns` refuses (one line each).
    """
    parts = [text] if isinstance(text, str) else list(text)
    out: dict[str, str] = {}
    for part in parts:
        for pair in str(part).split(","):
            role, sep, name = pair.partition("=")
            role, name = role.strip().lower(), name.strip()
            if not pair.strip():
                continue
            if not sep or not role or not name:
                raise ConfigError(
                    f"--columns takes ROLE=COLUMN pairs separated by commas (e.g. "
                    f"user=customer_id,item=product_sku), got {pair.strip()!r}"
                )
            if role in out:
                raise ConfigError(
                    f"--columns names the {role} column twice ({role}={out[role]} and "
                    f"{role}={name}); give it once"
                )
            out[role] = name
    if not out:
        raise ConfigError(
            "--columns takes ROLE=COLUMN pairs separated by commas (e.g. "
            "user=customer_id,item=product_sku), got nothing"
        )
    return check_columns(out)


def check_columns(columns: object) -> dict[str, str]:
    """A ``columns`` mapping checked and in :data:`TABLE_ROLES` order: which column of a
    table's header holds each role's values (``{"user": "customer_id", "item":
    "product_sku"}``); a role left out is read from the column named after it. Column names
    are matched case-insensitively, as the roles' own names are.

    Raises:
        ConfigError: Not a mapping of role names to non-empty strings, a role that is not
            one of :data:`TABLE_ROLES` (``rating`` included: ratings are never read), or two
            roles reading one column (one line each).
    """
    example = 'e.g. {"user": "customer_id", "item": "product_sku"} ([columns] in a config)'
    if not isinstance(columns, Mapping):
        raise ConfigError(f"columns must map roles to column names, {example}, got {columns!r}")
    out: dict[str, str] = {}
    for role, name in columns.items():
        if role == "rating":
            raise ConfigError(
                f"columns maps rating to {name!r}, and securefed reads no rating: every row "
                "is one positive interaction (implicit feedback); drop rating from the columns"
            )
        if role not in TABLE_ROLES:
            raise ConfigError(
                f"columns names a column for {role!r}, which is not a role securefed reads; "
                f"the roles are {', '.join(TABLE_ROLES)}"
            )
        if not isinstance(name, str) or not name.strip():
            raise ConfigError(
                f"columns must name the {role} column with a non-empty string, got {name!r}"
            )
    for role in TABLE_ROLES:
        if role in columns:
            out[role] = str(columns[role]).strip()
    # The columns each role reads (user and item always; an unmapped timestamp is optional
    # and checked against the header when the table is read).
    reads = {role: out.get(role, role) for role in ("user", "item")}
    if "timestamp" in out:
        reads["timestamp"] = out["timestamp"]
    seen: dict[str, str] = {}
    for role, name in reads.items():
        other = seen.setdefault(name.lower(), role)
        if other != role:
            mapped = role if role in out else other
            raise ConfigError(
                f"columns would read the {other} and the {role} ids from one column, "
                f"{name!r}; map {mapped} to another column"
                if role != "timestamp"
                else f"columns would read the {other} ids and the timestamps from one column, "
                f"{name!r}; map timestamp to another column"
            )
    return out


def _refuse_repeated_columns(
    path: Path, names: Iterable[object], hint: str, read: Iterable[str] = TABLE_COLUMNS
) -> None:
    """Refuse a header naming a column securefed reads twice (``user,User``, ``item,item``;
    ``read``: the names it reads, lower case).

    Which of the two would be read is an accident of the parser; pandas renames a repeated
    CSV name ``x`` to ``x.1``, so that suffix counts as the name it repeats.
    """
    lowered = [str(n).strip().lower() for n in names]
    present = set(lowered)
    base = [
        m.group(1) if (m := re.fullmatch(r"(.+)\.\d+", n)) and m.group(1) in present else n
        for n in lowered
    ]
    repeated = list(dict.fromkeys(c for c in read if base.count(c) > 1))
    if repeated:
        raise DataError(
            f"{path} names the column(s) {', '.join(repeated)} more than once in its header; "
            f"keep one of each; expected {hint}"
        )


def _table_columns(
    path: Path, frame: pd.DataFrame, columns: Mapping[str, str], hint: str, sep: str | None
) -> dict[str, object]:
    """Role -> the header's column holding it (``timestamp`` only where present), by the
    ``columns`` mapping (:func:`check_columns`) or the roles' own names.

    Raises:
        DataError: A column the mapping names, or ``user``/``item``, is not in the header; a
            mapped role's own name is in the header too, unread (which of the two holds
            the ids is ambiguous); a name read is in the header twice.
    """
    header = {str(c).strip().lower(): c for c in frame.columns}
    found = ", ".join(str(c) for c in frame.columns) or "none"
    read = [columns.get(role, role).lower() for role in TABLE_ROLES]
    _refuse_repeated_columns(path, frame.columns, hint, (*TABLE_COLUMNS, *read))
    absent = [(role, name) for role, name in columns.items() if name.lower() not in header]
    if absent:
        names = ", ".join(repr(name) for _, name in absent)
        pairs = ",".join(f"{role}={name}" for role, name in absent)
        raise DataError(
            f"{path} has no column {names} (--columns {pairs}; its header names {found}); "
            "map each role to a column of its header"
        )
    out: dict[str, object] = {}
    for role in TABLE_ROLES:
        name = columns.get(role, role).lower()
        if name in header:
            out[role] = header[name]
    claimed = {str(c).strip().lower() for c in out.values()}
    for role, name in columns.items():
        if role.lower() != name.lower() and role in header and role not in claimed:
            own = str(header[role])
            raise DataError(
                f"{path} has both {str(out[role])!r}, which --columns {role}={name} reads the "
                f"{role}s from, and a column {own!r}: which one holds the {role}s is "
                f"ambiguous; drop or rename {own!r} in the file, or drop {role}={name} to read "
                f"{own!r}"
            )
    if "timestamp" in out and "timestamp" not in columns:
        taken = [r for r in ("user", "item") if r in out and out[r] == out["timestamp"]]
        if taken:
            raise DataError(
                f"{path}: --columns {taken[0]}={columns[taken[0]]} reads the {taken[0]} ids "
                "from its timestamp column; map the timestamps to another column "
                "(timestamp=COLUMN) or the ids to another one"
            )
    missing = [role for role in ("user", "item") if role not in out]
    if missing:
        other = next((s for s in (";", "|", "\t", ",", " ") if s in found and s != sep), None)
        if sep is not None and len(frame.columns) == 1 and other is not None:
            hint += (
                f"; the header looks separated by {other!r}: securefed reads .csv files "
                "separated by commas and .tsv files by tabs"
            )
        else:
            hint += (
                "; if yours are named otherwise, name them with --columns "
                "user=COLUMN,item=COLUMN[,timestamp=COLUMN] ([columns] in a config)"
            )
        raise DataError(
            f"{path} has no column(s) {', '.join(missing)} (found: {found}); expected {hint}"
        )
    return out


def load_table(
    path: str | Path,
    *,
    min_interactions: int = 3,
    columns: Mapping[str, str] | None = None,
) -> Interactions:
    """Load a CSV or Parquet table with columns ``user``, ``item`` [, ``rating``, ``timestamp``].

    Column names are matched case-insensitively; other columns are ignored. Ids are integers
    where a column holds numbers only, else strings (each distinct string one id; a note
    says so). ``timestamp`` may be numeric (seconds) or ISO 8601 date-time strings.

    Args:
        path: A ``.csv`` / ``.tsv`` or ``.parquet`` / ``.pq`` file.
        min_interactions: Users with fewer interactions are dropped.
        columns: The header's names for the roles it names otherwise
            (``{"user": "customer_id", "item": "product_sku"}``; :func:`check_columns`);
            a role left out is read from the column named after it.

    Raises:
        ConfigError: ``columns`` is malformed (:func:`check_columns`).
        DataError: The file is malformed, or its header lacks a column the roles read.
    """
    columns = {} if columns is None else check_columns(columns)
    path = Path(path)
    suffix = path.suffix.lower()
    hint = "a table with a header row naming the columns user, item[, rating, timestamp]"
    sep: str | None = None  # a CSV's separator
    if suffix in (".parquet", ".pq"):
        if not path.is_file():
            raise DataError(f"interaction table not found: {path}")
        try:
            import pyarrow.parquet as pq

            check_table_fits(path, rows=float(pq.ParquetFile(path).metadata.num_rows))
            frame = pd.read_parquet(path)
        except ImportError:
            raise DataError(
                f"reading {path} needs pyarrow; install it with 'pip install securefed[parquet]'"
            ) from None
        except ConfigError:  # too big for memory (check_table_fits)
            raise
        except Exception as exc:  # pyarrow raises many unrelated types for a bad file
            raise DataError(
                f"{path} is not a readable Parquet file ({exc}); expected {hint}"
            ) from None
        offset: int | None = None  # rows, not lines, in messages (_place)
    else:
        raw = _read_text(path, what="interaction table")
        sep = "\t" if suffix == ".tsv" else ","
        try:
            frame = pd.read_csv(io.BytesIO(raw), sep=sep, keep_default_na=False)
        except (pd.errors.ParserError, UnicodeDecodeError, ValueError) as exc:
            first = str(exc).strip().splitlines()[0]
            raise DataError(f"{path} is not a valid table ({first}); expected {hint}") from None
        offset = 2  # line numbers in messages: header is line 1
    read = _table_columns(path, frame, columns, hint, sep)
    if len(frame) == 0:
        raise DataError(f"{path} has a header but no rows; expected {hint}")

    timestamps = None
    if "timestamp" in read:
        timestamps = _timestamp_column(frame[read["timestamp"]], path=path, offset=offset)
    users, user_labels, user_note = _table_ids(
        frame[read["user"]], path=path, column="user id", offset=offset
    )
    items, item_labels, item_note = _table_ids(
        frame[read["item"]], path=path, column="item id", offset=offset
    )
    data = _build(
        name=path.stem,
        source=path,
        users=users,
        items=items,
        timestamps=timestamps,
        user_table=None,
        min_interactions=min_interactions,
        notes=tuple(n for n in (user_note, item_note) if n),
    )
    if user_labels is None and item_labels is None:
        return data
    return dataclasses.replace(  # the original ids: user_ids[dense] == the file's string
        data,
        user_ids=data.user_ids if user_labels is None else user_labels[data.user_ids],
        item_ids=data.item_ids if item_labels is None else item_labels[data.item_ids],
    )
