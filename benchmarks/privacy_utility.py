"""Utility of the federated models at each user-level epsilon, next to MostPop and DP-MostPop
at the same epsilon: writes a table into docs/privacy.md.

Grid: model x client fraction (1.0: everyone every round, no amplification; 0.1: Poisson
sampling) x epsilon (inf = no DP) x seed, central Gaussian noise, delta 1e-5, default clip.
Each cell is one run directory under ``--out``; finished cells are reused.

The table starts with the yardsticks on the same split and seeds: MostPop (the training
counts) and DP-MostPop at every epsilon of the grid (one Gaussian release of the counts,
:func:`securefed.baselines.baseline_metrics`, each user contributing at most 20 sampled
items); every model row ends with how it stands against DP-MostPop at its epsilon (MostPop
without DP).

    python benchmarks/privacy_utility.py --data-dir ../shared/data --write
    # baselines only, next to the model rows already in the page (no training):
    python benchmarks/privacy_utility.py --baselines-only --write
"""

# ruff: noqa: E501

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from _common import mean_of, mean_sd, rounds_for  # noqa: E402

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
    ap.add_argument(
        "--baselines-only",
        action="store_true",
        help="train nothing: keep the model rows of the current table and (re)compute the "
        "MostPop / DP-MostPop rows and the comparison column for its epsilons and seeds",
    )
    args = ap.parse_args()
    if args.baselines_only:
        kept, made_by = _table_rows()
        if not kept:
            raise SystemExit("docs/privacy.md has no utility table to keep; run the grid")
        eps = sorted({float(r["epsilon"]) for r in kept})
        seeds = max(int(r["seeds"]) for r in kept)
        base = _baselines(args, eps, seeds)
        if args.write:
            _write(kept, base, args, made_by=made_by)
        return
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
                rows.append(_cells(row))
                print(json.dumps(row), flush=True)
    if args.write:
        eps = sorted({float(e) for e in args.epsilons.split(",")})
        seeds = max(int(r["seeds"]) for r in rows)
        made_by = (
            f"python benchmarks/privacy_utility.py --rounds {args.rounds} --seeds {args.seeds} "
            f"--models {args.models} --fractions {args.fractions} --epsilons {args.epsilons} "
            f"{'--only-finished ' if args.only_finished else ''}--write",
            time.strftime("%Y-%m-%d"),
        )
        _write(rows, _baselines(args, eps, seeds), args, made_by=made_by)


COLUMNS = (
    "model", "fraction", "rounds", "seeds", "epsilon", "sigma", "spent", "HR@10 sampled",
    "NDCG@10 sampled", "HR@10 full", "NDCG@10 full", "s/run",
)  # fmt: skip
AGAINST = "against DP-MostPop at this epsilon (MostPop at inf)"


def _cells(r: dict) -> dict[str, str]:
    """A measured row as the table's text cells."""
    spent = [x for x in r["spent"] if x is not None]
    return {
        "model": r["model"],
        "fraction": f"{r['fraction']:g}",
        "rounds": str(r["rounds"]),
        "seeds": str(r["seeds"]),
        "epsilon": f"{r['epsilon']:g}",
        "sigma": "-" if r["sigma"] is None else f"{r['sigma']:.2f}",
        "spent": f"{statistics.mean(spent):.3f}" if spent else "-",
        "HR@10 sampled": mean_sd(r["test_hr@10"]),
        "NDCG@10 sampled": mean_sd(r["test_ndcg@10"]),
        "HR@10 full": mean_sd(r["test_full_hr@10"]),
        "NDCG@10 full": mean_sd(r["test_full_ndcg@10"]),
        "s/run": f"{statistics.mean(r['seconds']):.0f}",
    }


def _table_rows() -> tuple[list[dict[str, str]], tuple[str, str]]:
    """The model rows of the current table and the command (and date) that wrote them."""
    text = (ROOT / "docs" / "privacy.md").read_text()
    if START not in text or END not in text:
        return [], ("", "")
    table = text.split(START, 1)[1].split(END, 1)[0]
    found = re.search(r"(?:Model rows w|W)ritten by `([^`]+)` \((\d{4}-\d{2}-\d{2})", table)
    made_by = (found.group(1), found.group(2)) if found else ("", "")
    rows = []
    for line in table.splitlines():
        if not line.startswith("| ") or line.startswith("| model "):
            continue
        cells = dict(
            zip(COLUMNS, (c.strip() for c in line.strip().strip("|").split("|")), strict=False)
        )
        if not cells["model"].startswith(("MostPop", "DP-MostPop")):
            rows.append(cells)
    return rows, made_by


def _baselines(args: argparse.Namespace, epsilons: list[float], seeds: int) -> dict[float, dict]:
    """MostPop (at inf) and DP-MostPop at every finite epsilon, per seed, on the grid's split."""
    from securefed.baselines import baseline_metrics
    from securefed.config import TrainConfig
    from securefed.training import load_split

    out: dict[float, dict] = {}
    for seed in range(seeds):
        cfg = TrainConfig(model="mostpop", dataset=args.dataset, data_dir=args.data_dir, seed=seed)
        split = load_split(cfg)
        # The contribution bound alone (no noise), sampled as DP-MostPop samples it.
        bounded = _bounded_mostpop(split, seed)
        rec = out.setdefault(BOUNDED, {k: [] for k in (*KEYS, "sigma")})
        for k in KEYS:
            rec[k].append(bounded[k])
        for eps in epsilons:
            b = baseline_metrics(
                split, seed=seed, epsilon=None if math.isinf(eps) else eps, delta=1e-5
            )
            name = "mostpop" if math.isinf(eps) else "dp_mostpop"
            rec = out.setdefault(eps, {k: [] for k in (*KEYS, "sigma")})
            for k in KEYS:
                rec[k].append(b[f"baseline_{name}_{k}"])
            rec["sigma"].append(b.get("baseline_dp_mostpop_noise_multiplier"))
    return out


#: Key of the MostPop row with DP-MostPop's contribution bound and no noise.
BOUNDED = -1.0


def _bounded_mostpop(split, seed: int) -> dict[str, float]:
    """MostPop over at most DP_MAX_ITEMS items per user (DP-MostPop's sampling, no noise)."""
    from protocols.seeding import torch_generator
    from securefed.evaluation import evaluate_splits
    from securefed.models.mostpop import DP_MAX_ITEMS, CountScorer, dp_popularity_counts

    counts = dp_popularity_counts(
        split,
        noise_multiplier=0.0,
        max_items=DP_MAX_ITEMS,
        generator=torch_generator(seed, "baseline-dp-mostpop"),
    )
    res = evaluate_splits(CountScorer(counts), split, which=("test",), k=10, full=True)["test"]
    return {
        "test_hr@10": res.hr,
        "test_ndcg@10": res.ndcg,
        "test_full_hr@10": res.full_hr,
        "test_full_ndcg@10": res.full_ndcg,
    }


def _against(row: dict[str, str], base: dict[float, dict]) -> str:
    ref = base.get(float(row["epsilon"]))
    if ref is None:
        return "-"
    name = "MostPop" if math.isinf(float(row["epsilon"])) else "DP-MostPop"
    hr, full = mean_of(row["HR@10 sampled"]), mean_of(row["HR@10 full"])
    ref_hr, ref_full = statistics.mean(ref["test_hr@10"]), statistics.mean(ref["test_full_hr@10"])
    below = [
        f"{what} {v:.3f} < {r:.3f}"
        for what, v, r in (("sampled", hr, ref_hr), ("full", full, ref_full))
        if v < r
    ]
    if below:
        return f"BELOW {name}: " + ", ".join(below)
    return f"above {name} ({hr / ref_hr:.2f}x sampled, {full / ref_full:.2f}x full)"


def _write(
    rows: list[dict[str, str]],
    base: dict[float, dict],
    args: argparse.Namespace,
    *,
    made_by: tuple[str, str],
) -> None:
    today = time.strftime("%Y-%m-%d")
    seeds = len(next(iter(base.values()))["test_hr@10"]) if base else 0
    baseline_cmd = (
        f"python benchmarks/privacy_utility.py --baselines-only --dataset {args.dataset} --write"
        if args.baselines_only
        else made_by[0]
    )
    lines = [
        START,
        "",
        f"Model rows written by `{made_by[0]}` ({made_by[1]}, {args.dataset}); the MostPop and "
        f"DP-MostPop rows and the last column by `{baseline_cmd}` ({today}, seeds 0-{seeds - 1}, "
        "the same split and seeds as the model rows: on MovieLens 100K every user has at least 20 "
        "ratings, so the one min-interactions filter of 5 changes no split). "
        "User-level DP, central Gaussian noise, "
        "delta 1e-5, PRV accountant, default clip (FedRAP 10, FedRecGEL 1); mean ± sd over "
        "the row's seeds of the test metrics at the round with the best validation HR@10. "
        "Client fraction 1 = every client every round (no amplification); 0.1 = Poisson "
        "sampling. Sigma is calibrated for the row's rounds; spent = the accountant's epsilon "
        "at the end (mean over seeds). MostPop ranks items by their training count; DP-MostPop "
        "is one Gaussian release of the counts at the row's epsilon (each user contributes at "
        "most 20 items sampled on the device, L2 sensitivity sqrt(20); sigma for one release, "
        "sample rate 1), computed with `securefed.baselines.baseline_metrics`: a yardstick from "
        "the same data, not charged to any row's budget. The last column compares each row's "
        "mean with DP-MostPop's at the same epsilon (MostPop's without DP). The row *MostPop, at "
        "most 20 items per user, no noise* is DP-MostPop's contribution bound alone (the same "
        "sampled items, no noise): where DP-MostPop is above MostPop, the bound is why.",
        "",
        "| " + " | ".join(COLUMNS) + f" | {AGAINST} |",
        "|" + "---|" * (len(COLUMNS) + 1),
    ]
    for eps in sorted(base, key=lambda e: (e == BOUNDED, e)):
        ref = base[eps]
        sig = [x for x in ref["sigma"] if x is not None]
        name = "MostPop" if math.isinf(eps) else "DP-MostPop"
        cells = {
            "model": "MostPop, at most 20 items per user, no noise" if eps == BOUNDED else name,
            "fraction": "-",
            "rounds": "1 release",
            "seeds": str(len(ref["test_hr@10"])),
            "epsilon": "inf" if eps == BOUNDED else f"{eps:g}",
            "sigma": f"{statistics.mean(sig):.2f}" if sig else "-",
            "spent": "-",
            "HR@10 sampled": mean_sd(ref["test_hr@10"]),
            "NDCG@10 sampled": mean_sd(ref["test_ndcg@10"]),
            "HR@10 full": mean_sd(ref["test_full_hr@10"]),
            "NDCG@10 full": mean_sd(ref["test_full_ndcg@10"]),
            "s/run": "-",
        }
        lines.append("| " + " | ".join(cells[c] for c in COLUMNS) + " | baseline |")
    for r in rows:
        lines.append("| " + " | ".join(r[c] for c in COLUMNS) + f" | {_against(r, base)} |")
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
