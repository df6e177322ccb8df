"""What the private fedals's noise-limited head rule (``sparse_head_below``, docs/privacy.md
"A noise-limited head") reads and decides: for each dataset and epsilon, the share of the
co-occurrence items (the ``gram_items`` most counted by the count round's release) whose
released count clears ``sparse_head_z`` noise stds, how many runs the rule fired in, and how
many items then kept a factor.

Each run is the private fedals as shipped at the cell's epsilon, noise from the seed
(replay), so the table reproduces. Prints one table::

    python benchmarks/noise_limited_head.py --epsilons 1,2,4,8 --seeds 5
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def cell(dataset: str, eps: float, seed: int, data_dir: str) -> tuple[float | None, bool, int]:
    """The rule's share, whether it fired and the number of items with a factor, for one run
    (share None: the rule did not apply, e.g. a count-only or large-population run)."""
    from _common import private_fedals_replay

    model, _ = private_fedals_replay(dataset, eps, seed, data_dir)
    return model.head_share, bool(model.sparse_head), int(model.head.sum())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--datasets", default="filmtrust,ml-100k")
    ap.add_argument("--epsilons", default="1,2,4,8")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data"))
    args = ap.parse_args()
    print(
        f"`python benchmarks/noise_limited_head.py --datasets {args.datasets} --epsilons "
        f"{args.epsilons} --seeds {args.seeds}` (seeds 0-{args.seeds - 1}, replay noise)\n"
    )
    print(
        "| dataset | epsilon | share of the co-occurrence items whose count clears the "
        "rule's noise stds (mean, min-max) | runs in which the rule fired | items with a "
        "factor (mean) |"
    )
    print("|---|---|---|---|---|")
    for dataset in args.datasets.split(","):
        for eps in (float(e) for e in args.epsilons.split(",")):
            runs = [cell(dataset, eps, s, args.data_dir) for s in range(args.seeds)]
            shares = [r[0] for r in runs if r[0] is not None]
            share = (
                f"{statistics.fmean(shares):.2f} ({min(shares):.2f}-{max(shares):.2f})"
                if shares
                else "not applied"
            )
            fired = sum(r[1] for r in runs)
            items = statistics.fmean(r[2] for r in runs)
            print(
                f"| {dataset} | {eps:g} | {share} | {fired} of {len(runs)} | {items:.0f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
