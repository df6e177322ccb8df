"""Non-private fedals on a large population (Gowalla) next to MostPop from the same split.

    python benchmarks/fedals_large.py --dataset ../shared/data/gowalla/checkins.csv --seeds 0,1 \\
        --out /tmp/securefed-gowalla

One run per seed through the public API at the model's defaults (its regularisation rule,
docs/models.md, "fedals"), every client every round, the round selected on validation
HR@10; ``--param key=value`` overrides a setting as ``securefed train`` does. Full-ranking
evaluation of 30k users x 41k items dominates the cost, so it runs only every
``--full-eval-every`` rounds (the selected round always gets it, from a saved copy). Prints
one JSON line per seed and a summary line (mean of the test metrics, MostPop's beside them).
Finished runs under ``--out`` are read back, not rerun.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

KEYS = ("test_hr@10", "test_full_hr@10", "test_ndcg@10", "test_full_ndcg@10")


def _value(text: str) -> object:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--dataset", required=True)
    ap.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data"))
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--full-eval-every", type=int, default=20)
    ap.add_argument("--param", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default="/tmp/securefed-large")
    args = ap.parse_args()

    import torch

    from securefed.config import TrainConfig
    from securefed.models.registry import get_spec, params_from_flags
    from securefed.training import train

    torch.set_num_threads(args.threads)
    flags = dict(p.split("=", 1) for p in args.param)
    params = params_from_flags(get_spec("fedals"), {k: _value(v) for k, v in flags.items()})
    tag = "-".join(f"{k}{v}" for k, v in sorted(flags.items())) or "defaults"
    rows = []
    for seed in (int(s) for s in args.seeds.split(",")):
        run = Path(args.out) / f"fedals-{tag}-s{seed}"
        if (run / "summary.json").exists():
            summary = json.loads((run / "summary.json").read_text())
        else:
            cfg = TrainConfig(
                model="fedals",
                dataset=args.dataset,
                data_dir=args.data_dir,
                seed=seed,
                rounds=args.rounds,
                full_eval_every=args.full_eval_every,
                params=params,
            )
            summary = train(cfg, out=run).summary
        row = {
            "seed": seed,
            "run": str(run),
            "selected_round": summary["selected_round"],
            "seconds": round(summary["seconds"], 1),
            **{k: summary[k] for k in KEYS},
            **{f"mostpop_{k}": summary[f"baseline_mostpop_{k}"] for k in KEYS},
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    keys = [k for k in rows[0] if k.startswith(("test", "mostpop"))]
    mean = {k: statistics.mean(r[k] for r in rows) for k in keys}
    print(json.dumps({"seeds": len(rows), "params": flags, "mean": mean}), flush=True)


if __name__ == "__main__":
    main()
