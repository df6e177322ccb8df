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
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

CONFIG_FILE = "config.toml"
METRICS_FILE = "metrics.jsonl"
CHECKPOINT_FILE = "checkpoint.pt"
SUMMARY_FILE = "summary.json"
LEDGER_FILE = "privacy_ledger.json"
BEST_FILE = "best_model.pt"


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
    atomic_write_bytes(path, text.encode())


def write_json(path: Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, allow_nan=True) + "\n")


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


def append_metrics(run_dir: Path, record: Mapping[str, Any]) -> None:
    """Append one round's metrics line; flushed and fsynced so a crash keeps whole lines."""
    path = run_dir / METRICS_FILE
    with path.open("a", encoding="utf-8") as fh:
        fh.write(json.dumps(dict(record), sort_keys=True, allow_nan=True) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def read_metrics(run_dir: Path, *, upto_round: int | None = None) -> list[dict[str, Any]]:
    """Metrics lines of a run (a torn last line from a crash is ignored)."""
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
        records.append(rec)
    return records


def rewrite_metrics(run_dir: Path, records: list[dict[str, Any]]) -> None:
    text = "".join(json.dumps(r, sort_keys=True, allow_nan=True) + "\n" for r in records)
    atomic_write_text(run_dir / METRICS_FILE, text)


def save_state(path: Path, state: Mapping[str, Any]) -> None:
    """``torch.save`` a mapping atomically, streaming to a temporary file (no in-memory copy:
    FedRAP's private views on MovieLens 1M are ~2.9 GB)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            torch.save(dict(state), fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_state(path: Path) -> dict[str, Any] | None:
    """A mapping written by :func:`save_state`, or None when the file does not exist."""
    if not path.exists():
        return None
    with path.open("rb") as fh:
        return torch.load(fh, map_location="cpu", weights_only=False)


def save_checkpoint(run_dir: Path, state: Mapping[str, Any]) -> None:
    save_state(run_dir / CHECKPOINT_FILE, state)


def load_checkpoint(run_dir: Path) -> dict[str, Any]:
    state = load_state(run_dir / CHECKPOINT_FILE)
    if state is None:
        raise FileNotFoundError(run_dir / CHECKPOINT_FILE)
    return state
