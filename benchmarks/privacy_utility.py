"""Utility of FedRAP and FedRecGEL at each user-level epsilon: writes a table into docs/privacy.md.

Grid: model x client fraction (1.0: everyone every round, no amplification; 0.1: Poisson
sampling) x epsilon (inf = no DP) x seed, central Gaussian noise, delta 1e-5, default clip.
Each cell is one run directory under ``--out``; finished cells are reused.

    python benchmarks/privacy_utility.py --data-dir ../shared/data --write
"""

# ruff: noqa: E501

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from _common import mean_sd, rounds_for  # noqa: E402

KEYS = ("test_hr@10", "test_ndcg@10", "test_full_hr@10", "test_full_ndcg@10")


def _cell(model: str, fraction: float, eps: float, seed: int, args: argparse.Namespace) -> dict:
    from securefed.training import PrivacyConfig, TrainConfig, train

    run = Path(args.out) / f"{model}-q{fraction}-eps{eps}-s{seed}"
    rounds = rounds_for(args.rounds, model, fraction)
    if (run / "summary.json").exists():
        summary = json.loads((run / "summary.json").read_text())
        if summary.get("rounds") == rounds:
            return summary
        raise SystemExit(
            f"{run} ran {summary.get('rounds')} rounds, not {rounds}: use another --out"
        )
    if (run / "config.toml").exists():
        return train(resume=run).summary
    privacy = PrivacyConfig() if math.isinf(eps) else PrivacyConfig(epsilon=eps, delta=1e-5)
    cfg = TrainConfig(
        model=model,
        dataset=args.dataset,
        data_dir=args.data_dir,
        rounds=rounds,
        seed=seed,
        client_fraction=fraction,
        checkpoint_every=10,
        privacy=privacy,
    )
    return train(cfg, out=run).summary


_fmt = mean_sd


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data"))
    ap.add_argument("--dataset", default="ml-100k")
    ap.add_argument("--out", default="/tmp/securefed-privacy-utility")
    ap.add_argument(
        "--rounds",
        default="100",
        help="one number, or fedrap=N,fedrecgel=M (a key model@fraction, e.g. fedrecgel@1=10, "
        "overrides one fraction)",
    )
    ap.add_argument(
        "--seeds",
        default="3",
        help="seeds per cell: one number, or with overrides as --rounds (3,fedrecgel@1=1)",
    )
    ap.add_argument("--models", default="fedrap,fedrecgel")
    ap.add_argument("--fractions", default="1.0,0.1")
    ap.add_argument("--epsilons", default="0.5,1,2,4,8,inf")
    ap.add_argument("--write", action="store_true")
    ap.add_argument(
        "--only-finished",
        action="store_true",
        help="tabulate only cells whose runs already finished (train nothing)",
    )
    args = ap.parse_args()
    rows = []
    for model in args.models.split(","):
        for fraction in (float(f) for f in args.fractions.split(",")):
            for eps in (float(e) for e in args.epsilons.split(",")):
                seeds = range(rounds_for(args.seeds, model, fraction))
                if args.only_finished and not all(
                    (
                        Path(args.out) / f"{model}-q{fraction}-eps{eps}-s{s}" / "summary.json"
                    ).exists()
                    for s in seeds
                ):
                    continue
                sums = [_cell(model, fraction, eps, s, args) for s in seeds]
                row = {
                    "model": model,
                    "fraction": fraction,
                    "epsilon": eps,
                    "rounds": sums[0]["rounds"],
                    "seeds": len(sums),
                }
                for key in KEYS:
                    row[key] = [s[key] for s in sums]
                row["sigma"] = sums[0].get("noise_multiplier")
                row["spent"] = [s.get("epsilon") for s in sums]
                row["seconds"] = [s["seconds"] for s in sums]
                rows.append(row)
                print(json.dumps(row), flush=True)
    if args.write:
        _write(rows, args)


def _write(rows: list[dict], args: argparse.Namespace) -> None:
    lines = [
        START,
        "",
        f"Written by `python benchmarks/privacy_utility.py --rounds {args.rounds} --seeds {args.seeds} "
        f"--models {args.models} --fractions {args.fractions} --epsilons {args.epsilons} "
        f"{'--only-finished ' if args.only_finished else ''}--write` "
        f"({time.strftime('%Y-%m-%d')}, {args.dataset}). User-level DP, central Gaussian noise, "
        "delta 1e-5, PRV accountant, default clip (FedRAP 10, FedRecGEL 1); mean ± sd over "
        "the row's seeds of the test metrics at the round with the best validation HR@10. "
        "Client fraction 1 = every client every round (no amplification); 0.1 = Poisson "
        "sampling. Sigma is calibrated for the row's rounds; spent = the accountant's epsilon "
        "at the end (mean over seeds).",
        "",
        "| model | fraction | rounds | seeds | epsilon | sigma | spent | HR@10 sampled | NDCG@10 sampled | HR@10 full | NDCG@10 full | s/run |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        sigma = "-" if r["sigma"] is None else f"{r['sigma']:.2f}"
        spent = [x for x in r["spent"] if x is not None]
        spent_s = f"{statistics.mean(spent):.3f}" if spent else "-"
        lines.append(
            f"| {r['model']} | {r['fraction']:g} | {r['rounds']} | {r['seeds']} | {r['epsilon']:g} | {sigma} | {spent_s} | "
            f"{_fmt(r['test_hr@10'])} | {_fmt(r['test_ndcg@10'])} | {_fmt(r['test_full_hr@10'])} | "
            f"{_fmt(r['test_full_ndcg@10'])} | {statistics.mean(r['seconds']):.0f} |"
        )
    lines.append(END)
    path = ROOT / "docs" / "privacy.md"
    text = path.read_text()
    if START in text and END in text:
        head, rest = text.split(START, 1)
        tail = rest.split(END, 1)[1]
    else:
        head, tail = text.rstrip("\n") + "\n\n## Utility at each epsilon\n\n", "\n"
    path.write_text(head + "\n".join(lines) + tail)


START = "<!-- privacy-utility:start -->"
END = "<!-- privacy-utility:end -->"


if __name__ == "__main__":
    main()
