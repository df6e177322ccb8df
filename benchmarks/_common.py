"""Helpers shared by the benchmark scripts (not part of the product)."""

from __future__ import annotations

import statistics
from pathlib import Path

#: The docs page the privacy benchmarks write their tables into.
PRIVACY_DOC = Path(__file__).resolve().parents[1] / "docs" / "privacy.md"


def write_between_markers(table: str, mark: str, doc: Path = PRIVACY_DOC) -> None:
    """Put ``table`` between ``<!-- mark -->`` and ``<!-- /mark -->`` in ``doc`` (both
    appended at the end where the page has neither)."""
    text = doc.read_text()
    start, end = f"<!-- {mark} -->", f"<!-- /{mark} -->"
    block = f"{start}\n{table}\n{end}"
    if start in text and end in text:
        text = text[: text.index(start)] + block + text[text.index(end) + len(end) :]
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    doc.write_text(text)


def rounds_for(
    spec: str | int, model: str, fraction: float | None = None, default: int | None = None
) -> int:
    """A per-cell number (rounds, seeds) from ``"100"`` or ``"fedrap=40,fedrecgel=100"``.

    An entry without ``=`` is the default; a key ``model@fraction`` (``"fedrecgel@1=10"``)
    overrides the model's value for that client fraction; ``default`` answers for a model the
    spec does not name (else that is an error).
    """
    parts = [p for p in str(spec).split(",") if p]
    table = dict(p.split("=") for p in parts if "=" in p)
    fallback = [p for p in parts if "=" not in p]
    if fraction is not None and f"{model}@{fraction:g}" in table:
        return int(table[f"{model}@{fraction:g}"])
    if model in table:
        return int(table[model])
    if fallback:
        return int(fallback[-1])
    if default is not None:
        return default
    raise SystemExit(f"no value for {model} in {spec!r}")


def mean_se(diffs: list[float]) -> tuple[float, float]:
    """Mean and standard error of paired differences (nan for the error of one)."""
    se = statistics.stdev(diffs) / len(diffs) ** 0.5 if len(diffs) > 1 else float("nan")
    return statistics.fmean(diffs), se


def paired_difference(cells: list[dict], key: str) -> tuple[float, float]:
    """Mean and standard error over runs of a run's ``key`` less DP-MostPop's in the same
    run's summary (same split and seed, so the spread between splits cancels)."""
    return mean_se([c[key] - c[f"baseline_dp_mostpop_{key}"] for c in cells])


def mean_sd(values: list[float]) -> str:
    """``mean ± sd`` of a list (just the value for one seed)."""
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{statistics.mean(values):.3f} ± {statistics.stdev(values):.3f}"


def private_fedals_replay(dataset: str, eps: float, seed: int, data_dir: str) -> tuple:
    """``(model, split)`` of the private fedals as shipped at ``eps`` (user-level, delta
    1e-5) on ``dataset``'s split for ``seed``, noise from the seed (replay), trained in a
    temporary run directory."""
    import tempfile

    from securefed import PrivacyConfig, TrainConfig, train
    from securefed.training import load_split

    cfg = TrainConfig(
        model="fedals",
        dataset=dataset,
        data_dir=data_dir,
        seed=seed,
        privacy=PrivacyConfig(epsilon=eps, delta=1e-5, replay=True),
    )
    split = load_split(cfg)
    with tempfile.TemporaryDirectory() as run:
        return train(cfg, split=split, out=run).model, split


def mean_of(cell: str) -> float:
    """The mean of a ``mean ± sd`` table cell (or of a single value)."""
    return float(cell.split("±")[0].strip())
