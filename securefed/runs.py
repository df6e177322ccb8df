"""Run directories: resolved config, per-round metrics, checkpoints and summary.

Every file is written atomically (write to a temporary file in the same directory, fsync,
rename), so a run killed at any point — ``kill -9`` included — leaves either the old or the
new version of each file, never half of one.
"""

from __future__ import annotations

import io
import json
import math
import os
import pickle
import re
import tempfile
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, BinaryIO

import torch

from securefed import paging
from securefed.errors import ConfigError, IntegrityError

CONFIG_FILE = "config.toml"
METRICS_FILE = "metrics.jsonl"
CHECKPOINT_FILE = "checkpoint.pt"
SUMMARY_FILE = "summary.json"
LEDGER_FILE = "privacy_ledger.json"
#: What the run's data was: name, sizes and what loading did (a Flower server's: name and
#: sizes only, until the operator's command adds the rest; training.add_yardsticks).
DATA_FILE = "data.json"
BEST_FILE = "best_model.pt"
#: A finished run's released model: the shared parameters as the server holds them after the
#: last round (no client's private state); written when the run completes.
MODEL_FILE = "model.pt"


#: Held (``flock``) by the process that trains a run directory, removed when it ends.
LOCK_FILE = ".securefed-lock"


class RunLock:
    """An exclusive lock on a run directory for the process that trains it.

    Two processes training one directory (a ``--resume`` started while the run still went
    on) each wrote their own ledger over the other's: 14 releases, 13 events (found in a
    walkthrough). ``flock`` on :data:`LOCK_FILE`: the kernel releases it when the process
    ends, ``kill -9`` included, so a crashed run never leaves a stale lock; the file is
    removed on :meth:`release`. Where ``fcntl`` does not exist (not POSIX) there is no lock.
    """

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    @classmethod
    def acquire(cls, run_dir: Path, *, new: bool = False) -> RunLock | None:
        """Lock ``run_dir`` (which must exist). ``new``: for a new run (the message then
        asks for another folder rather than a resume). None where the file system has no
        ``flock`` (the run goes on unlocked, as before locks existed).

        Raises:
            ConfigError: another process holds the lock, or the lock file cannot be made
                (one line: which, and what to do).
        """
        try:
            import fcntl
        except ImportError:  # pragma: no cover - not POSIX
            return None
        path = Path(run_dir) / LOCK_FILE
        for _ in range(5):
            existed = path.exists()
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as exc:
                raise ConfigError(
                    f"cannot open {path} to lock the run directory ({exc.strerror}); check the "
                    "folder's permissions, or remove that file if no run uses the folder"
                ) from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:  # EWOULDBLOCK: held by another open file
                holder = os.read(fd, 32).decode(errors="replace").strip()
                os.close(fd)
                who = f"process {holder}" if holder.isdigit() else "another process"
                then = (
                    "choose another --out"
                    if new
                    else "wait for it to end (or stop it), then continue it with "
                    f"--resume {run_dir}"
                )
                raise ConfigError(f"{run_dir} is being trained by {who} now; {then}") from None
            except OSError:  # no flock on this file system (some network mounts): unlocked
                os.close(fd)
                if not existed:
                    path.unlink(missing_ok=True)
                return None
            try:
                same = os.fstat(fd).st_ino == os.stat(path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                os.ftruncate(fd, 0)
                os.write(fd, f"{os.getpid()}\n".encode())
                return cls(path, fd)
            os.close(fd)  # its holder removed the file as this process locked it: again
        raise ConfigError(f"{run_dir} is being trained by another process now; try again")

    def release(self) -> None:
        """Remove the lock file and unlock (idempotent)."""
        if self._fd is None:
            return
        try:
            self.path.unlink(missing_ok=True)  # still held: no other process has it
        finally:
            os.close(self._fd)
            self._fd = None


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see the old or the new file, never a mix."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically, as :func:`atomic_write_bytes`: readers
    see the old or the new file, never a mix; the folder is created if missing."""
    atomic_write_bytes(path, text.encode())


def write_json(path: Path, obj: Any, *, strict: bool = False) -> None:
    """Write ``obj`` as JSON atomically. ``strict``: a float that is not finite is written
    ``null`` (``NaN`` and ``Infinity`` are not JSON: ``jq`` and ``JSON.parse`` refuse them);
    otherwise as Python writes them, for files securefed reads back itself (a report's
    ``sweep.json`` records the no-DP column's epsilon as ``Infinity``)."""
    if strict:
        text = json.dumps(_finite_or_null(obj), indent=2, sort_keys=True, allow_nan=False)
    else:
        text = json.dumps(obj, indent=2, sort_keys=True, allow_nan=True)
    atomic_write_text(path, text + "\n")


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} to TOML")


def dumps_toml(config: Mapping[str, Any]) -> str:
    """TOML for a mapping of scalars and one level of tables; ``None`` values are omitted."""
    out = io.StringIO()
    tables = {k: v for k, v in config.items() if isinstance(v, Mapping)}
    for key, value in config.items():
        if value is None or isinstance(value, Mapping):
            continue
        out.write(f"{key} = {_toml_value(value)}\n")
    for name, table in tables.items():
        out.write(f"\n[{name}]\n")
        for key, value in table.items():
            if value is None:
                continue
            if isinstance(value, Mapping):
                raise TypeError("only one level of TOML tables is supported")
            out.write(f"{key} = {_toml_value(value)}\n")
    return out.getvalue()


def unused_path(base: Path) -> Path:
    """``base``, or ``base-2``, ``base-3``, ... the first that does not exist (two commands
    started the same second get two default directories)."""
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return path


def _metrics_line(record: Mapping[str, Any]) -> str:
    """One round's line, strict JSON: a value that is not a finite number (the loss of a
    round in which no client trained: an empty Poisson cohort) is ``null``, which every JSON
    reader takes (``NaN`` is not JSON: ``jq`` and ``JSON.parse`` refuse the line)."""
    return json.dumps(_finite_or_null(dict(record)), sort_keys=True, allow_nan=False) + "\n"


def _finite_or_null(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {k: _finite_or_null(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite_or_null(v) for v in value]
    return value


def append_metrics(run_dir: Path, record: Mapping[str, Any]) -> None:
    """Append one round's metrics line (:func:`_metrics_line`); flushed and fsynced so a
    crash keeps whole lines."""
    path = run_dir / METRICS_FILE
    # Owner-only, as every other file of the run (mkstemp's 0600): the lines hold cohort sizes
    # and clear losses, which no epsilon covers (docs/privacy.md).
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    with os.fdopen(fd, "a", encoding="utf-8") as fh:
        fh.write(_metrics_line(record))
        fh.flush()
        os.fsync(fh.fileno())


def nan_for_null(record: Mapping[str, Any]) -> dict[str, Any]:
    """A metrics line's record as the round held it: ``null`` (written for a number that was
    not finite, :func:`_metrics_line`) back to NaN."""
    return {k: math.nan if v is None else v for k, v in record.items()}


def read_metrics(run_dir: Path, *, upto_round: int | None = None) -> list[dict[str, Any]]:
    """Metrics lines of a run (a torn last line from a crash is ignored); a ``null`` value
    (written for a number that was not finite, :func:`_metrics_line`) reads back as NaN, as
    the round's record held it (older files hold ``NaN`` itself, read the same)."""
    path = run_dir / METRICS_FILE
    if not path.exists():
        return []
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            break
        if upto_round is not None and rec["round"] > upto_round:
            break
        records.append(nan_for_null(rec))
    return records


def rewrite_metrics(run_dir: Path, records: list[dict[str, Any]]) -> None:
    """Replace the run's ``metrics.jsonl`` with ``records``, one line each as
    :func:`append_metrics` writes them, atomically (a resume cuts it back to the rounds its
    checkpoint keeps; the selected round gains its full-ranking metrics)."""
    text = "".join(_metrics_line(r) for r in records)
    atomic_write_text(run_dir / METRICS_FILE, text)


def save_state(path: Path, state: Mapping[str, Any]) -> None:
    """``torch.save`` a mapping atomically, streaming to a temporary file (no in-memory copy:
    FedRAP's private views on MovieLens 1M are ~2.9 GB).

    Checkpoints are data, not code: the state may hold only tensors and plain Python values
    (dicts, lists, tuples, str, int, float, bool, None), which :func:`load_state` reads with
    ``torch.load(weights_only=True)``. A state holding anything else (numpy arrays,
    dataclasses, arbitrary objects) is refused here, before it replaces the previous file,
    so a run never writes a checkpoint it cannot resume from.

    Raises:
        TypeError: if the state holds an object ``weights_only`` loading refuses (a bug in
            the caller's ``state_dict``: convert it to tensors or plain values).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            owners = paging.paged_owners(dict(state))
            if owners:
                _save_streaming(dict(state), fh)
                for paged in owners:
                    paged.release()
            else:
                torch.save(dict(state), fh)
            fh.flush()
            os.fsync(fh.fileno())
        unsafe = torch.serialization.get_unsafe_globals_in_checkpoint(tmp)
        if unsafe:
            raise TypeError(
                f"state for {path.name} holds {', '.join(sorted(unsafe))}, which "
                "torch.load(weights_only=True) refuses; store tensors and plain Python values"
            )
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class _ReleasingWriter:
    """A binary file for ``torch.save`` whose writes release paged tensors' pages as they go
    (:func:`securefed.paging.write_releasing`)."""

    def __init__(self, fh: BinaryIO) -> None:
        self._fh = fh

    def write(self, data: bytes | memoryview) -> int:
        return paging.write_releasing(self._fh, data)

    def flush(self) -> None:
        self._fh.flush()


def _save_streaming(state: dict[str, Any], fh: BinaryIO) -> None:
    """``torch.save`` of a state holding paged tensors (FedRAP's ``views="paged"``), streamed
    so that they never become resident all at once. The zip records carry no CRC-32 here:
    torch computes it over a whole storage before writing any of it, which would read every
    page of a 2.9 GB paged tensor into memory first. Truncation is still detected (the zip's
    directory is written last); a flipped bit inside a paged tensor's record is not."""
    crc = torch.serialization.get_crc32_options()
    torch.serialization.set_crc32_options(False)
    try:
        torch.save(state, _ReleasingWriter(fh))  # type: ignore[arg-type]
    finally:
        torch.serialization.set_crc32_options(crc)


def load_state(path: str | Path) -> dict[str, Any] | None:
    """A mapping written by :func:`save_state`, or None when the file does not exist.

    Loads with ``torch.load(weights_only=True)``: tensors and plain Python values only, so a
    crafted file cannot run code. Nothing is written, so a refused file leaves the run
    directory as it was.

    Returns:
        The mapping, or None when nothing exists at ``path`` (a run that has not written
        that file: no error).

    Raises:
        ConfigError: ``path`` is a folder (a run directory given for one of its files).
        IntegrityError: one line naming the file when it is empty, truncated, corrupt, not a
            torch checkpoint, holds objects other than tensors and plain values (e.g. a
            pickle crafted to run code, or a checkpoint from before securefed saved data
            only), or is not a mapping.
    """
    path = Path(path)
    if not path.exists():
        return None
    if path.is_dir():  # not a damaged file: no advice to restore or delete it
        raise ConfigError(
            f"{path} is a folder; load_state reads a file of one (e.g. {path / MODEL_FILE} "
            f"or {path / CHECKPOINT_FILE})"
        )
    if path.stat().st_size == 0:
        raise _unreadable(path, "the file is empty")
    try:
        # Mapped, not read: a tensor's pages are read when used (a paged model copies its
        # 2.9 GB of views block by block, paging each block out again).
        mapped = zipfile.is_zipfile(path)  # torch maps its zip format only
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=mapped)
    except pickle.UnpicklingError as exc:
        match = re.search(r"(?:GLOBAL|global|function|class) ([\w.<>]+)", str(exc))
        what = f" ({match.group(1)[:80]})" if match else ""
        raise _unreadable(
            path, f"it holds an object other than tensors and plain values{what}"
        ) from None
    except (RuntimeError, EOFError, ValueError, OSError, zipfile.BadZipFile, KeyError) as exc:
        reason = " ".join(str(exc).split())[:120] or type(exc).__name__
        raise _unreadable(path, f"it is truncated or corrupt: {reason}") from None
    if not isinstance(state, dict):
        raise _unreadable(path, f"it holds a {type(state).__name__}, not a mapping")
    return state


def _unreadable(path: Path, reason: str) -> IntegrityError:
    return IntegrityError(
        f"cannot load {path}: {reason}; nothing was loaded or changed. Restore the file from "
        "a backup or delete it (a run resumed without its checkpoint starts over); never load "
        "checkpoints from an untrusted source"
    )


def read_summary(run_dir: Path) -> dict[str, Any] | None:
    """The run's ``summary.json`` (None when it has none yet, or it cannot be read)."""
    try:
        summary = json.loads((run_dir / SUMMARY_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return summary if isinstance(summary, dict) else None


def finished(run_dir: Path, rounds: int) -> dict[str, Any] | None:
    """The summary of a run that completed its ``rounds`` planned rounds, or stopped because
    its privacy budget was spent (``budget_spent``: no round can follow), else None.

    A run that diverged or was interrupted has not finished; nor has one whose
    ``config.toml`` now plans more rounds than its summary records.
    """
    summary = read_summary(run_dir)
    if summary is not None and summary.get("budget_spent") is True:
        return summary
    if summary is None or summary.get("stopped"):
        return None
    done = summary.get("rounds")
    if isinstance(done, bool) or not isinstance(done, int) or done < rounds:
        return None
    return summary


def save_checkpoint(run_dir: Path, state: Mapping[str, Any]) -> None:
    """Write the run's resume checkpoint (``checkpoint.pt``) with :func:`save_state`:
    atomically, tensors and plain values only; :func:`load_checkpoint` reads it back.

    Raises:
        TypeError: ``state`` holds an object ``torch.load(weights_only=True)`` refuses
            (the previous checkpoint is then kept).
    """
    save_state(run_dir / CHECKPOINT_FILE, state)


def load_checkpoint(run_dir: Path) -> dict[str, Any]:
    """The run's checkpoint (see :func:`load_state`); it must record a round count.

    Raises:
        FileNotFoundError: if the run has no checkpoint.
        IntegrityError: if it cannot be loaded or records no integer ``round`` >= 0.
    """
    path = run_dir / CHECKPOINT_FILE
    state = load_state(path)
    if state is None:
        raise FileNotFoundError(path)
    rounds = state.get("round")
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 0:
        raise _unreadable(path, f"it records no round count (round={rounds!r:.40})")
    return state
