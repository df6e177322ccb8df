"""Helpers shared by the benchmark scripts (not part of the product)."""

from __future__ import annotations

import statistics


def rounds_for(spec: str | int, model: str, fraction: float | None = None) -> int:
    """A per-cell number (rounds, seeds) from ``"100"`` or ``"fedrap=40,fedrecgel=100"``.

    An entry without ``=`` is the default; a key ``model@fraction`` (``"fedrecgel@1=10"``)
    overrides the model's value for that client fraction.
    """
    parts = [p for p in str(spec).split(",") if p]
    table = dict(p.split("=") for p in parts if "=" in p)
    default = [p for p in parts if "=" not in p]
    if fraction is not None and f"{model}@{fraction:g}" in table:
        return int(table[f"{model}@{fraction:g}"])
    if model in table:
        return int(table[model])
    if default:
        return int(default[-1])
    raise SystemExit(f"no value for {model} in {spec!r}")


def mean_sd(values: list[float]) -> str:
    """``mean ± sd`` of a list (just the value for one seed)."""
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{statistics.mean(values):.3f} ± {statistics.stdev(values):.3f}"
