"""Print the cost model's estimates for the rows of docs/benchmarks.md ("Estimates before a run"),
and, for run directories given on the command line, the estimate each recorded beside what it
measured (``estimate.json``).

    python benchmarks/estimates.py [RUN_DIR ...]

The estimates are at probe factor 1.0 (the development machine, quiet); no data is loaded and no
model is built (the dataset shapes are the ones the loaders produce).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from securefed.config import PrivacyConfig, TrainConfig  # noqa: E402
from securefed.costs import RunShape, estimate_run, format_bytes  # noqa: E402

ML100K = RunShape(users=943, items=1682, train_interactions=98_114)
# With the pairs of training items the users hold among the 400, 1,000 and all most counted
# items (RunShape.of counts them when the data is loaded; private fedals uploads them).
ML100K_PAIRS = RunShape(
    users=943,
    items=1682,
    train_interactions=98_114,
    head_pairs=((400, 4_322_795), (1000, 8_815_346), (1682, 9_853_235)),
)
SYNTHETIC = RunShape(
    users=3000,
    items=1682,
    train_interactions=303_530,
    synthetic=True,
    head_pairs=((400, 7_675_836), (1000, 20_847_622), (1682, 33_294_323)),
)
ML1M = RunShape(users=6040, items=3706, train_interactions=624_449, synthetic=True)
GOWALLA = RunShape(users=29_858, items=40_981, train_interactions=863_792)

ROWS = [
    ("fedrap", "ml-100k", ML100K, {"rounds": 100}),
    ("fedrecgel", "ml-100k, 10 %", ML100K, {"rounds": 100}),
    ("fedals", "ml-100k", ML100K, {"rounds": 100}),
    ("fedrap", "synthetic ml-1m", ML1M, {"rounds": 3}),
    ("fedrap", "gowalla, 10 %", GOWALLA, {"rounds": 5, "client_fraction": 0.1}),
    ("fedrecgel", "gowalla, 10 %", GOWALLA, {"rounds": 5, "client_fraction": 0.1}),
    ("fedals", "gowalla, 10 %", GOWALLA, {"rounds": 5, "client_fraction": 0.1}),
    ("fedrap", "ml-100k --secagg", ML100K, {"rounds": 3, "privacy": PrivacyConfig(secagg=True)}),
    ("fedals --epsilon 2", "ml-100k", ML100K_PAIRS, {"privacy": PrivacyConfig(epsilon=2.0)}),
    ("fedals --epsilon 2", "synthetic", SYNTHETIC, {"privacy": PrivacyConfig(epsilon=2.0)}),
]


def main() -> None:
    print("| model | dataset | peak memory | checkpoint | train s/round | full eval s |")
    print("|---|---|---|---|---|---|")
    for model, name, shape, kw in ROWS:
        est = estimate_run(TrainConfig(model=model.split()[0], **kw), shape, speed=1.0)
        print(
            f"| {model} | {name} | {format_bytes(est.peak_memory)} | "
            f"{format_bytes(est.checkpoint_bytes)} | {est.round_seconds:.3f} | "
            f"{est.full_eval_seconds:.3f} |"
        )
    for run in sys.argv[1:]:
        record = json.loads((Path(run) / "estimate.json").read_text())
        before, measured = record["before_run"], record.get("measured", {})
        print(
            f"{run}: peak {before['peak_memory']:,} B estimated, "
            f"{measured.get('peak_rss_bytes', 0):,} B measured; checkpoint "
            f"{before['checkpoint_bytes']:,} B estimated, "
            f"{measured.get('checkpoint_bytes', 0):,} B written"
        )


if __name__ == "__main__":
    main()
