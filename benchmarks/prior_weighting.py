"""How to weight a user's items in a private popularity count (docs/privacy.md, "The prior's
weighting"): **validation** HR@10 of count rankings, each at the same L2 sensitivity.

Every estimator is a sum over users of a weighted item indicator whose L2 norm is at most 1,
released with Gaussian noise of std ``sigma`` (the noise multiplier of one release spending
the whole epsilon, delta 1e-5, PRV), so they compare at equal privacy cost:

* ``sampled k = 20``: DP-MostPop's count (20 items sampled per user, weight ``1/sqrt(20)``);
* ``fractional K``: every item at ``min(1/sqrt(n_u), sqrt(K)/n_u)``: DP-MostPop's expected
  weight for users with ``n_u >= K`` (``K = 20``) without its sampling variance, more for
  lighter users;
* ``sqrt``: every item at ``1/sqrt(n_u)`` (``K`` infinite): the private fedals count and the
  prior's ``--prior-weighting sqrt``;
* ``1/n``: every user weighted equally (``1/n_u`` per item, scaled to norm 1 for the user
  with fewest items).

Only validation items are ranked (``--which val``); the noise draws are seeded per draw.

    python benchmarks/prior_weighting.py --dataset ml-100k --epsilons 0,1,2 --draws 8
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np
import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--dataset", default="ml-100k")
    ap.add_argument("--epsilons", default="0,1,2", help="0: no noise")
    ap.add_argument("--draws", type=int, default=8)
    ap.add_argument("--which", default="val", choices=("val", "test"))
    ap.add_argument("--seed", type=int, default=0, help="the split's seed")
    ap.add_argument(
        "--data-dir", default=str(Path(__file__).resolve().parents[2] / "shared" / "data")
    )
    args = ap.parse_args()

    from protocols.dp import calibrate_noise_multiplier
    from securefed import TrainConfig
    from securefed.evaluation import evaluate_splits
    from securefed.models.mostpop import CountScorer, bounded_pairs
    from securefed.training import load_split

    split = load_split(
        TrainConfig(model="mostpop", dataset=args.dataset, data_dir=args.data_dir, seed=args.seed)
    )
    n_users, n_items = split.n_users, split.n_items
    items = np.asarray(split.train_items)
    n = np.diff(np.asarray(split.train_indptr))
    local = np.repeat(np.arange(n_users), n)

    def evaluate(counts: np.ndarray) -> tuple[float, float]:
        scorer = CountScorer(torch.as_tensor(counts, dtype=torch.float32))
        res = evaluate_splits(scorer, split, which=(args.which,), k=10, full=True)[args.which]
        assert res.full_hr is not None
        return res.hr, res.full_hr

    weights = {
        f"fractional K = {k}": np.minimum(1 / np.sqrt(n), math.sqrt(k) / n) for k in (20, 80)
    }
    weights["sqrt (1/sqrt(n_u))"] = 1 / np.sqrt(n)
    weights["1/n (equal users)"] = (1 / n) * math.sqrt(n.min())
    exact = {}
    for name, w in weights.items():
        assert float(np.sqrt(w * w * n).max()) <= 1 + 1e-9, name  # sensitivity <= 1
        exact[name] = np.bincount(items, weights=w[local], minlength=n_items)
    print(f"{args.dataset}: {n_users} users, {n_items} items; {args.which} HR@10 sampled / full")
    print("| epsilon | sigma | estimator | HR@10 sampled | HR@10 full |")
    print("|---|---|---|---|---|")
    for eps in (float(e) for e in args.epsilons.split(",")):
        sigma = 0.0
        if eps > 0:
            sigma = calibrate_noise_multiplier(
                epsilon=eps, delta=1e-5, sample_rate=1.0, steps=1, accountant="prv"
            )
        out: dict[str, list[tuple[float, float]]] = {"sampled k = 20": []}
        out.update({name: [] for name in exact})
        for d in range(args.draws):
            rng = np.random.default_rng([args.seed, d, int(eps * 1000)])
            gen = torch.Generator().manual_seed(int(rng.integers(2**62)))
            _, kept = bounded_pairs(
                torch.from_numpy(local), torch.from_numpy(items), n_users, 20, gen
            )
            sampled = np.bincount(kept.numpy(), minlength=n_items) / math.sqrt(20)
            out["sampled k = 20"].append(evaluate(sampled + rng.normal(0, sigma, n_items)))
            for name, counts in exact.items():
                out[name].append(evaluate(counts + rng.normal(0, sigma, n_items)))
        for name, values in out.items():
            a = np.asarray(values)
            se = a.std(0, ddof=1) / math.sqrt(len(a)) if len(a) > 1 else np.zeros(2)
            print(
                f"| {eps:g} | {sigma:.2f} | {name} | {a[:, 0].mean():.4f} ± {se[0]:.4f} | "
                f"{a[:, 1].mean():.4f} ± {se[1]:.4f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
