"""Resolve a dataset name or path to :class:`~securefed.data.types.Interactions`.

Known names: ``synthetic``, ``ml-100k``, ``ml-1m``, ``filmtrust``. For a real dataset the
files are looked up, in this order, in

1. the explicit ``data_dir`` (``--data-dir DIR``),
2. the folder named by the environment variable ``SECUREFED_DATA_DIR``,
3. the user cache (``platformdirs.user_cache_dir("securefed")``; ``SECUREFED_CACHE_DIR``
   overrides it),

accepting both ``<dir>/<name>/<file>`` and ``<dir>/<file>``. If none has the files and
``download`` is true, the publisher's zip is downloaded, verified against pinned digests
(the extracted files' SHA-256 where known, the archive's GroupLens-published MD5 for
MovieLens), and moved atomically into the cache. Nothing unverified is ever left in the cache.

Anything else is read as a file path (``.csv``, ``.tsv``, ``.parquet``, ``u.data``-like
``.data``, ``ratings.dat``, ``ratings.txt``) or a folder holding one of those files.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import urllib.error
import urllib.request
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from securefed.data.loaders import (
    check_columns,
    filter_min_interactions,
    load_filmtrust,
    load_ml1m,
    load_ml100k,
    load_table,
)
from securefed.data.synthetic import make_synthetic
from securefed.data.types import Interactions
from securefed.errors import ConfigError, DataError

__all__ = ["DATASETS", "KNOWN_DATASETS", "ProgressCallback", "default_cache_dir", "load_dataset"]

ProgressCallback = Callable[[str, int, int | None], None]
"""``progress(description, bytes_done, bytes_total_or_None)``, called while downloading."""

_CHUNK = 1 << 20


@dataclass(frozen=True)
class _Source:
    """Where a published dataset comes from and how to check it."""

    name: str
    url: str
    files: tuple[str, ...]  # required, first one is what the loader is given
    optional: tuple[str, ...]
    loader: Callable[..., Interactions]
    sha256: dict[str, str] = field(default_factory=dict)  # of extracted files
    zip_md5: str | None = None  # as published by GroupLens next to the zip


DATASETS: dict[str, _Source] = {
    "ml-100k": _Source(
        name="ml-100k",
        url="https://files.grouplens.org/datasets/movielens/ml-100k.zip",
        files=("u.data",),
        optional=("u.user",),
        loader=load_ml100k,
        sha256={
            "u.data": "06416e597f82b7342361e41163890c81036900f418ad91315590814211dca490",
            "u.user": "f120e114da2e8cf314fd28f99417c94ae9ddf1cb6db8ce0e4b5995d40e90e62c",
        },
        zip_md5="0e33842e24a9c977be4e0107933c0723",
    ),
    "ml-1m": _Source(
        name="ml-1m",
        url="https://files.grouplens.org/datasets/movielens/ml-1m.zip",
        files=("ratings.dat",),
        optional=("users.dat",),
        loader=load_ml1m,
        zip_md5="c4d9eecfca2ab87c1945afe126590906",
    ),
    "filmtrust": _Source(
        name="filmtrust",
        url="https://guoguibing.github.io/librec/datasets/filmtrust.zip",
        files=("ratings.txt",),
        optional=(),
        loader=load_filmtrust,
        sha256={
            "ratings.txt": "977afa8d83c75736ba072f7938b1c345f7bd83455f07167ac1949d3198d61677",
        },
    ),
}
KNOWN_DATASETS = ("synthetic", *DATASETS)

_FIX = (
    "pass --data-dir DIR (a folder holding {name}/{file} or {file}) or set SECUREFED_DATA_DIR=DIR"
)


def default_cache_dir() -> Path:
    """The download cache: ``$SECUREFED_CACHE_DIR`` or ``user_cache_dir("securefed")``."""
    override = os.environ.get("SECUREFED_CACHE_DIR")
    if override:
        return Path(override).expanduser()
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("securefed"))


def _candidates(data_dir: str | Path | None) -> list[Path]:
    dirs = []
    if data_dir is not None:
        dirs.append(Path(data_dir).expanduser())
    env = os.environ.get("SECUREFED_DATA_DIR")
    if env:
        dirs.append(Path(env).expanduser())
    dirs.append(default_cache_dir())
    return dirs


def _find_local(source: _Source, dirs: list[Path]) -> Path | None:
    for base in dirs:
        for folder in (base / source.name, base):
            if (folder / source.files[0]).is_file():
                return folder
    return None


def _digest_file(path: Path, algorithm: str) -> str:
    h = hashlib.new(algorithm)
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(_CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def _fetch(url: str, dest: Path, progress: ProgressCallback | None, label: str) -> str:
    """Stream ``url`` into ``dest``; returns the MD5 hex digest of what was written."""
    md5 = hashlib.md5(usedforsecurity=False)
    with urllib.request.urlopen(url, timeout=60) as response, dest.open("wb") as out:
        length = response.headers.get("Content-Length") if response.headers else None
        total = int(length) if length and length.isdigit() else None
        done = 0
        if progress is not None:
            progress(label, 0, total)
        while chunk := response.read(_CHUNK):
            out.write(chunk)
            md5.update(chunk)
            done += len(chunk)
            if progress is not None:
                progress(label, done, total)
    return md5.hexdigest()


def _download(source: _Source, cache: Path, progress: ProgressCallback | None) -> Path:
    """Download, verify and install ``source`` into ``cache / source.name`` atomically."""
    cache.mkdir(parents=True, exist_ok=True)
    target = cache / source.name
    tmp_dir = Path(tempfile.mkdtemp(prefix=f".{source.name}-", dir=cache))
    try:
        archive = tmp_dir / "archive.zip"
        md5 = _fetch(source.url, archive, progress, f"downloading {source.name}")
        if source.zip_md5 is not None and md5 != source.zip_md5:
            raise DataError(
                f"{source.url} failed verification (MD5 {md5}, expected {source.zip_md5}); "
                "nothing was cached. Retry later or download it yourself and pass --data-dir"
            )
        staged = tmp_dir / source.name
        staged.mkdir()
        try:
            with zipfile.ZipFile(archive) as zf:
                members = {
                    Path(info.filename).name: info
                    for info in zf.infolist()
                    if not info.is_dir() and "__MACOSX" not in info.filename
                }
                for name in (*source.files, *source.optional):
                    info = members.get(name)
                    if info is None:
                        if name in source.files:
                            raise DataError(
                                f"{source.url} does not contain {name}; nothing was cached"
                            )
                        continue
                    # Copy the member by its base name only: archive paths are never trusted.
                    with zf.open(info) as src, (staged / name).open("wb") as dst:
                        shutil.copyfileobj(src, dst, _CHUNK)
        except zipfile.BadZipFile:
            raise DataError(
                f"{source.url} is not a valid zip archive; nothing was cached"
            ) from None
        for name, expected in source.sha256.items():
            path = staged / name
            if path.is_file() and _digest_file(path, "sha256") != expected:
                raise DataError(
                    f"{name} from {source.url} failed SHA-256 verification; nothing was "
                    "cached. Retry later or download it yourself and pass --data-dir"
                )
        if target.exists():
            shutil.rmtree(target)  # an incomplete earlier copy without the required file
        try:
            os.replace(staged, target)
        except OSError:
            if not (target / source.files[0]).is_file():  # not a concurrent download
                raise
        return target
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)


def _load_path(
    path: Path, min_interactions: int, columns: Mapping[str, str] | None = None
) -> Interactions:
    if columns:
        return _load_mapped(path, min_interactions, columns)
    if path.is_dir():
        for filename, loader in (
            ("u.data", load_ml100k),
            ("ratings.dat", load_ml1m),
            ("ratings.txt", load_filmtrust),
        ):
            if (path / filename).is_file():
                return loader(path / filename, min_interactions=min_interactions)
        raise DataError(
            f"{path} is a folder without u.data, ratings.dat or ratings.txt; pass a file path"
        )
    suffix = path.suffix.lower()
    if suffix in (".csv", ".tsv", ".parquet", ".pq"):
        return load_table(path, min_interactions=min_interactions)
    if path.name == "ratings.dat" or suffix == ".dat":
        return load_ml1m(path, min_interactions=min_interactions)
    if suffix == ".data":
        return load_ml100k(path, min_interactions=min_interactions)
    if suffix == ".txt":
        if _names_user_and_item(path):  # a CSV table named .txt (found in a walkthrough)
            return load_table(path, min_interactions=min_interactions)
        return load_filmtrust(path, min_interactions=min_interactions)
    # Unknown extension: sniff the first line.
    try:
        with path.open("rb") as fh:
            first = fh.readline()
    except OSError as exc:
        raise DataError(f"cannot read {path}: {exc.strerror or exc}") from None
    if b"::" in first:
        return load_ml1m(path, min_interactions=min_interactions)
    if b"\t" in first:
        return load_ml100k(path, min_interactions=min_interactions)
    if b"," in first:
        return load_table(path, min_interactions=min_interactions)
    return load_filmtrust(path, min_interactions=min_interactions)


def _load_mapped(path: Path, min_interactions: int, columns: Mapping[str, str]) -> Interactions:
    """A file given with a ``columns`` mapping: a table with a header row (a ``.txt`` or an
    unknown extension is read as a comma-separated one); the headerless formats are refused."""
    suffix = path.suffix.lower()
    if path.is_dir() or suffix in (".dat", ".data"):
        what = "a folder" if path.is_dir() else "read as a headerless MovieLens file"
        raise DataError(
            f"--columns names the columns of a CSV, TSV or Parquet table with a header row, and "
            f"{path} is {what}; drop --columns, or give the table's path"
        )
    return load_table(path, min_interactions=min_interactions, columns=columns)


def _names_user_and_item(path: Path) -> bool:
    """Whether the file's first line is a comma-separated header naming ``user`` and
    ``item`` (a table for :func:`load_table`, not FilmTrust's headerless ``ratings.txt``)."""
    try:
        with path.open("rb") as fh:
            first = fh.readline(1 << 16).decode("utf-8", errors="replace")
    except OSError:
        return False  # the loader says what is wrong
    names = {c.strip().strip('"').lower() for c in first.split(",")}
    return {"user", "item"} <= names


def refuse_columns_for(name: str) -> str:
    """Why a ``columns`` mapping is refused for the built-in dataset ``name``."""
    return (
        f"--columns names the columns of your own CSV or Parquet table, and {name} is a "
        "built-in dataset with a fixed layout; drop --columns (or the config's [columns])"
    )


def dataset_sha256(name_or_path: str) -> str | None:
    """SHA-256 of the interaction file a dataset path names (``sha256sum`` of it), of a
    folder's files (their names and contents, sorted), or None for ``synthetic`` and the
    known datasets (verified by their publishers' checksums when fetched).

    Raises:
        DataError: The path does not exist or cannot be read.
    """
    if name_or_path == "synthetic" or name_or_path in DATASETS:
        return None
    path = Path(name_or_path).expanduser()
    try:
        if path.is_file():
            return _digest_file(path, "sha256")
        if path.is_dir():
            h = hashlib.sha256()
            for f in sorted(p for p in path.rglob("*") if p.is_file()):
                h.update(f.relative_to(path).as_posix().encode() + b"\0")
                h.update(bytes.fromhex(_digest_file(f, "sha256")))
            return h.hexdigest()
    except OSError as exc:
        raise DataError(f"cannot read {path} ({exc.strerror or exc})") from None
    raise DataError(f"no such file or folder: {path}")


def load_dataset(
    name_or_path: str,
    *,
    data_dir: str | Path | None = None,
    min_interactions: int = 3,
    seed: int = 0,
    download: bool = True,
    progress: ProgressCallback | None = None,
    columns: Mapping[str, str] | None = None,
) -> Interactions:
    """Load a known dataset by name, or an interaction file by path.

    Args:
        name_or_path: ``synthetic``, ``ml-100k``, ``ml-1m``, ``filmtrust`` or a path.
        data_dir: Folder to look in first (see the module docstring for the order).
        min_interactions: Users with fewer interactions are dropped (3 is the least
            leave-one-out accepts; FedRecGEL's preprocessing uses 5).
        seed: Seed of the synthetic dataset (unused otherwise).
        download: Download a missing known dataset from its publisher.
        progress: Called as ``progress(description, done_bytes, total_bytes_or_None)``
            during a download; the library itself never prints.
        columns: For a table of your own: the header's names for the roles
            (``{"user": "customer_id", "item": "product_sku"}``;
            :func:`~securefed.data.loaders.check_columns`). A table given with it is read
            as one whatever its extension (comma-separated unless ``.tsv`` or Parquet).

    Raises:
        ConfigError: ``columns`` is malformed, or given for a known dataset.
        DataError: The dataset is not found and cannot be downloaded, fails verification,
            or is malformed; or ``columns`` names a column its header lacks.
    """
    if columns:
        columns = check_columns(columns)
        if name_or_path == "synthetic" or name_or_path in DATASETS:
            raise ConfigError(refuse_columns_for(name_or_path))
    if name_or_path == "synthetic":
        return filter_min_interactions(make_synthetic(seed=seed), min_interactions)
    source = DATASETS.get(name_or_path)
    if source is None:
        path = Path(name_or_path).expanduser()
        if not path.exists():
            raise DataError(
                f"unknown dataset {name_or_path!r}: not one of {', '.join(KNOWN_DATASETS)} "
                "and no such file or folder"
            )
        return _load_path(path, min_interactions, columns)

    dirs = _candidates(data_dir)
    folder = _find_local(source, dirs)
    if folder is None:
        fix = _FIX.format(name=source.name, file=source.files[0])
        searched = ", ".join(str(d) for d in dirs)
        if not download:
            raise DataError(f"{source.name} not found (searched {searched}); {fix}")
        try:
            folder = _download(source, default_cache_dir(), progress)
        except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
            reason = getattr(exc, "reason", exc)
            raise DataError(
                f"{source.name} not found (searched {searched}) and downloading {source.url} "
                f"failed ({reason}); {fix}"
            ) from None
        except OSError as exc:
            raise DataError(
                f"cannot write the {source.name} download into {default_cache_dir()} "
                f"({exc.strerror or exc}); {fix}"
            ) from None
    return source.loader(folder / source.files[0], min_interactions=min_interactions)
