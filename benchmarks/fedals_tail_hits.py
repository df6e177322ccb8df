"""Where the private fedals and DP-MostPop differ in sampled HR@10: validation hits split by
whether the held-out item is one of the co-occurrence items (the ``gram_items`` most counted
by fedals's own release, which get a factor) or not (scored by the count alone).

Validation only (what a design choice may read): each run is the private fedals as shipped
at the cell's epsilon with replay noise from the seed (so the table reproduces), scored with
its last round's model (the run's own metrics report the round selected on validation);
DP-MostPop is the count release of the run's summary (same split, same seed). Prints one
table::

    python benchmarks/fedals_tail_hits.py --dataset filmtrust --epsilons 2,8 --seeds 5
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _hits(scores, k: int = 10):
    """Sampled-protocol hits of ``[users, 1 + negatives]`` scores (the held-out item first):
    fewer than ``k`` negatives at or above it (``securefed.evaluation.rank_of_target``, ties
    against the held-out item, as the run's own metrics count them)."""
    from securefed.evaluation import rank_of_target

    return rank_of_target(scores[:, 0], scores[:, 1:]) < k


def cell(dataset: str, eps: float, seed: int, data_dir: str) -> dict[str, Any]:
    """Validation users and hits, on and off the co-occurrence items, for one run, and the
    count ranks (fedals's release, DP-MostPop's) of the held-out items DP-MostPop hits."""
    import numpy as np
    import torch
    from _common import private_fedals_replay

    from securefed.baselines import dp_mostpop_counts

    model, split = private_fedals_replay(dataset, eps, seed, data_dir)
    if model.count_only:
        raise SystemExit(f"{dataset} at epsilon {eps:g} is count-only: no co-occurrence items")
    counts, _ = dp_mostpop_counts(split, epsilon=eps, delta=1e-5, privacy_unit="user", seed=seed)
    pos = torch.as_tensor(np.asarray(split.val_items)).long()  # one per user (leave-one-out)
    items = torch.cat([pos[:, None], torch.as_tensor(np.asarray(split.val_negatives)).long()], 1)
    ours = _hits(model.score(torch.arange(split.n_users), items).double())
    count = torch.as_tensor(np.asarray(counts), dtype=torch.float64)
    theirs = _hits(count[items])
    head = model.head[pos]
    out: dict[str, Any] = {}
    for name, mask in (("head", head), ("tail", ~head)):
        out[f"{name} users"] = int(mask.sum())
        out[f"{name} fedals"] = int((ours & mask).sum())
        out[f"{name} dp-mostpop"] = int((theirs & mask).sum())
        # Where the two counts rank the held-out items DP-MostPop hits (1 = most counted).
        won = (theirs & mask).nonzero().reshape(-1)
        for who, c in (("fedals", model.prior.double()), ("dp-mostpop", count)):
            rank = torch.empty(len(c), dtype=torch.long)
            rank[torch.argsort(c, descending=True, stable=True)] = torch.arange(1, len(c) + 1)
            out[f"{name} ranks {who}"] = rank[pos[won]].tolist()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--dataset", default="filmtrust")
    ap.add_argument("--epsilons", default="2,8")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data"))
    args = ap.parse_args()
    print(
        f"`python benchmarks/fedals_tail_hits.py --dataset {args.dataset} --epsilons "
        f"{args.epsilons} --seeds {args.seeds}` (validation hits summed over seeds "
        f"0-{args.seeds - 1})\n"
    )
    print(
        "| dataset | epsilon | held-out item | users | fedals hits | DP-MostPop hits | "
        "difference | median count rank of DP-MostPop's hits (fedals's count / DP-MostPop's) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for eps in (float(e) for e in args.epsilons.split(",")):
        total: dict[str, Any] = {}
        for seed in range(args.seeds):
            for key, value in cell(args.dataset, eps, seed, args.data_dir).items():
                total[key] = total.get(key, 0 if isinstance(value, int) else []) + value
        for name, label in (("head", "a co-occurrence item"), ("tail", "any other item")):
            ours, theirs = total[f"{name} fedals"], total[f"{name} dp-mostpop"]
            ranks = " / ".join(
                f"{statistics.median(total[f'{name} ranks {who}']):g}"
                if total[f"{name} ranks {who}"]
                else "-"
                for who in ("fedals", "dp-mostpop")
            )
            print(
                f"| {args.dataset} | {eps:g} | {label} | {total[f'{name} users']} | {ours} | "
                f"{theirs} | {ours - theirs:+d} | {ranks} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
