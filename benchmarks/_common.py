"""Helpers shared by the benchmark scripts (not part of the product)."""

from __future__ import annotations

import statistics


def rounds_for(spec: str | int, model: str, fraction: float | None = None) -> int:
    """Rounds for ``model`` from ``"100"`` or a per-model ``"fedrap=40,fedrecgel=100"``.

    A key ``model@fraction`` (``"fedrecgel@1=10"``) overrides the model's value for that
    client fraction.
    """
    if "=" not in str(spec):
        return int(spec)
    table = dict(part.split("=") for part in str(spec).split(","))
    if fraction is not None and f"{model}@{fraction:g}" in table:
        return int(table[f"{model}@{fraction:g}"])
    return int(table[model])


def mean_sd(values: list[float]) -> str:
    """``mean ± sd`` of a list (just the value for one seed)."""
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{statistics.mean(values):.3f} ± {statistics.stdev(values):.3f}"
