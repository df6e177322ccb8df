"""Validation HR@10 of a prior mode with the log, linear or noise prior score, per weight.

The prior's released counts become scores on the log scale (log(1 + c) / max), the linear
one (c / max) or in units of the release's noise std (c / (sigma_p sqrt(k)))
(``ModelSpec.prior_scale``, docs/privacy.md "The prior's scale").
One run per (dataset, seed) of the model with ``--private-prior 0.9`` (10 rounds at client
fraction 0.1, replay), then its last model is scored on the VALIDATION items (no test
metric is read) with each scale and weight:

    python benchmarks/prior_scale.py --datasets ml-100k --seeds 0,1 --model fedrap

Prints one line per (dataset, seed, scale): sampled / full validation HR@10 at each weight.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from private_prior import _config  # noqa: E402

WEIGHTS = (0.3, 1.0, 3.0, 10.0, 30.0, 100.0, 1000.0)
#: ``scale="noise"``: the weight of one noise std of a count (a model score range of 1
#: overturns up to ``1 / w`` noise stds).
NOISE_WEIGHTS = (0.03, 0.1, 0.3, 1.0, 3.0)


def main() -> None:
    from securefed import train
    from securefed.evaluation import evaluate_splits

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--datasets", default="ml-100k")
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--model", default="fedrap")
    ap.add_argument("--epsilon", type=float, default=2.0)
    ap.add_argument(
        "--data-dir", default=str(Path(__file__).resolve().parents[2] / "shared" / "data")
    )
    ap.add_argument("--out", default="benchmarks/out/prior_scale")
    args = ap.parse_args()
    cfg_args = argparse.Namespace(
        data_dir=args.data_dir, rounds=10, fraction=0.1, share=0.9, weighting="capped"
    )
    for dataset in args.datasets.split(","):
        for seed in (int(s) for s in args.seeds.split(",")):
            run = Path(args.out) / f"{args.model}-{dataset}-eps{args.epsilon:g}-s{seed}"
            if run.exists():
                import shutil

                shutil.rmtree(run)
            cfg = _config(args.model, dataset, args.epsilon, seed, cfg_args)
            res = train(cfg, out=run)
            prior = res.model.prior
            for scale in ("log", "linear", "noise"):
                prior.scale = scale
                cells = []
                for w in NOISE_WEIGHTS if scale == "noise" else WEIGHTS:
                    prior.weight = w
                    val = evaluate_splits(res.model, res.split, which=("val",), k=10, full=True)
                    cells.append(f"w {w:g} {val['val'].hr:.3f}/{val['val'].full_hr:.4f}")
                print(f"{dataset} seed {seed} {scale}: " + "; ".join(cells), flush=True)


if __name__ == "__main__":
    main()
