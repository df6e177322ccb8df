"""Private FedRAP and FedRecGEL with the private popularity prior, against DP-MostPop.

Every cell is one ``securefed.train`` run with user-level DP at the cell's epsilon (delta
1e-5, PRV accountant, Poisson cohorts at ``--fraction``, ``--private-prior`` at ``--share``,
replay noise so the table reproduces); DP-MostPop at the same epsilon comes from the same
run's summary (``securefed.baselines``: one Gaussian count release, 20 sampled items per
user, the same split and seed). ``--tune`` instead chooses the prior weight on **validation**
(MovieLens 100K, epsilon 2, seed 0, the share grid and weight grid below), printing only
validation numbers; docs/privacy.md says what that choice costs in privacy.

    python benchmarks/private_prior.py --tune
    python benchmarks/private_prior.py --datasets ml-100k,filmtrust --epsilons 1,2,4,8 \\
        --seeds 3 --write

writes the table between the ``private-prior`` markers of docs/privacy.md. Cells are cached
in ``--out`` (a finished cell's summary.json is reused).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

METRICS = ("test_hr@10", "test_full_hr@10")
MARK = "private-prior"
WEIGHTS = (0.0, 0.1, 0.3, 1.0, 3.0, 10.0, 100.0)


def _config(model: str, dataset: str, eps: float, seed: int, args: argparse.Namespace, **kw: Any):
    from securefed import PrivacyConfig, TrainConfig

    return TrainConfig(
        model=model,
        dataset=dataset,
        data_dir=args.data_dir,
        seed=seed,
        rounds=args.rounds,
        client_fraction=args.fraction,
        checkpoint_every=args.rounds,
        privacy=PrivacyConfig(
            epsilon=eps,
            replay=True,
            prior_share=args.share,
            prior_weighting=args.weighting,
            **kw,
        ),
    )


def _cell(model: str, dataset: str, eps: float, seed: int, args: argparse.Namespace) -> dict | None:
    from securefed import train

    name = f"{model}-{Path(dataset).stem}-eps{eps:g}-s{seed}"
    for folder in [args.out, *filter(None, args.also.split(","))]:
        if (Path(folder) / name / "summary.json").exists():
            return json.loads((Path(folder) / name / "summary.json").read_text())
    if args.only_finished:
        return None
    run = Path(args.out) / name
    if run.exists():
        import shutil

        shutil.rmtree(run)
    return train(_config(model, dataset, eps, seed, args), out=run).summary


def tune(args: argparse.Namespace) -> None:
    """Validation HR@10 of the final model for each share and weight (no test metric read)."""
    from securefed import train
    from securefed.evaluation import evaluate_splits

    for model in args.models.split(","):
        for share in (float(s) for s in args.shares.split(",")):
            args.share = share
            run = Path(args.out) / f"tune-{model}-share{share:g}"
            if run.exists():
                import shutil

                shutil.rmtree(run)
            res = train(_config(model, "ml-100k", 2.0, 0, args), out=run)
            wrapped = res.model
            cells = []
            for w in WEIGHTS:
                wrapped.prior.weight = w
                val = evaluate_splits(wrapped, res.split, which=("val",), k=10, full=True)["val"]
                cells.append(f"w {w:g}: {val.hr:.3f}/{val.full_hr:.3f}")
            print(
                f"{model} share {share:g} (val sampled/full HR@10): " + "; ".join(cells), flush=True
            )


def _fmt(values: list[float]) -> str:
    mean = statistics.fmean(values)
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{mean:.3f} ± {sd:.3f}"


def _paired(cells: list[dict], key: str) -> str:
    """``mean ± standard error`` of the model's metric less DP-MostPop's on the same split
    and seed (:func:`_common.paired_difference`)."""
    from _common import paired_difference

    mean, se = paired_difference(cells, key)
    return f"{mean:+.4f} ± {se:.4f}"


def grid(args: argparse.Namespace) -> None:
    datasets = [d for d in args.datasets.split(",") if d]
    epsilons = [float(e) for e in args.epsilons.split(",")]
    models = [m for m in args.models.split(",") if m]
    started = time.time()
    lines = [
        f"Written by `python benchmarks/private_prior.py --datasets {args.datasets} "
        f"--epsilons {args.epsilons} --seeds {args.seeds} --models {args.models} --rounds "
        f"{args.rounds} --fraction {args.fraction:g} --share {args.share:g} "
        f"--weighting {args.weighting} --out {args.out}"
        f"{' --only-finished' if args.only_finished else ''} --write"
        f"{'' if args.mark == MARK else ' --mark ' + args.mark}` "
        f"({time.strftime('%Y-%m-%d')}); mean ± sd over seeds 0-{args.seeds - 1} of the test "
        "metrics at the round selected on validation; user-level DP, delta 1e-5, PRV, Poisson "
        f"cohorts at rate {args.fraction:g} (amplification as labelled for replay runs), "
        f"`--private-prior {args.share:g}` (`--prior-weighting {args.weighting}`: "
        + {
            "sqrt": "every item of a user at sqrt(20 / n_u)",
            "capped": "every item of a user at sqrt(20) min(1 / sqrt(n_u), sqrt(80) / n_u)",
            "sample": "20 sampled items per user",
        }[args.weighting]
        + "), the model's default clip and "
        "prior weight, `--replay-from-seed`. DP-MostPop: the same split and seed, the whole "
        "epsilon in one count release.",
        "",
        "| dataset | epsilon | model | rounds | sigma prior / model | HR@10 sampled | "
        "HR@10 full | epsilon spent (max) | s/run | vs DP-MostPop (sampled / full) | "
        "paired difference, mean ± se (sampled / full) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for dataset in datasets:
        for eps in epsilons:
            found = {
                m: [_cell(m, dataset, eps, s, args) for s in range(args.seeds)] for m in models
            }
            cells = {m: [c for c in found[m] if c is not None] for m in models}
            if not all(cells.values()):
                missing = [m for m in models if not cells[m]]
                lines.append(
                    f"| {Path(dataset).stem} | {eps:g} | {', '.join(missing)} | NOT RUN "
                    "(out of time on the shared machine) | | | | | | |"
                )
                models_here = [m for m in models if cells[m]]
            else:
                models_here = models
            if not models_here:
                continue
            base = max((cells[m] for m in models_here), key=len)
            ref = {k: [c[f"baseline_dp_mostpop_{k}"] for c in base] for k in METRICS}
            sigma = base[0].get("baseline_dp_mostpop_noise_multiplier", float("nan"))
            lines.append(
                f"| {Path(dataset).stem} | {eps:g} | DP-MostPop (k = 20) | 1 release | "
                f"{sigma:.2f} | {_fmt(ref['test_hr@10'])} | {_fmt(ref['test_full_hr@10'])} | "
                "- | - | - | - |"
            )
            for m in models_here:
                vals = {k: [c[k] for c in cells[m]] for k in METRICS}
                means = {k: statistics.fmean(v) for k, v in vals.items()}
                # DP-MostPop on the model's own seeds (the same split and seed per cell).
                ref_mean = {
                    k: statistics.fmean(c[f"baseline_dp_mostpop_{k}"] for c in cells[m])
                    for k in METRICS
                }
                versus = " / ".join(
                    "at or above"
                    if means[k] >= ref_mean[k]
                    else f"**BELOW** ({means[k]:.4f} < {ref_mean[k]:.4f})"
                    for k in METRICS
                )
                c0 = cells[m][0]
                seeds = (
                    f" ({len(cells[m])} of {args.seeds} seeds)"
                    if len(cells[m]) < args.seeds
                    else ""
                )
                lines.append(
                    f"| {Path(dataset).stem} | {eps:g} | {m} + prior{seeds} | {c0['rounds']} | "
                    f"{c0['prior_noise_multiplier']:.2f} / {c0['noise_multiplier']:.2f} | "
                    f"{_fmt(vals['test_hr@10'])} | {_fmt(vals['test_full_hr@10'])} | "
                    f"{max(c['epsilon'] for c in cells[m]):.3f} | "
                    f"{statistics.fmean(c['seconds'] for c in cells[m]):.0f} | {versus} | "
                    f"{_paired(cells[m], 'test_hr@10')} / {_paired(cells[m], 'test_full_hr@10')} |"
                )
            print(f"{dataset} eps {eps:g} done ({time.time() - started:.0f} s)", flush=True)
    table = "\n".join(lines)
    print(table)
    if args.write:
        from _common import write_between_markers

        write_between_markers(table, args.mark)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tune", action="store_true", help="choose the weight on validation")
    ap.add_argument("--shares", default="0.7,0.9", help="--tune: the shares tried")
    ap.add_argument("--datasets", default="ml-100k,filmtrust")
    ap.add_argument("--epsilons", default="1,2,4,8")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--models", default="fedrap,fedrecgel")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--fraction", type=float, default=0.1)
    ap.add_argument("--share", type=float, default=0.9)
    ap.add_argument(
        "--weighting",
        default="capped",
        choices=("sqrt", "capped", "sample"),
        help="--prior-weighting (cells are cached by name: give each weighting its own --out)",
    )
    ap.add_argument(
        "--data-dir", default=str(Path(__file__).resolve().parents[2] / "shared" / "data")
    )
    ap.add_argument("--out", default="benchmarks/out/private_prior_capped")
    ap.add_argument("--also", default="", help="more cache folders to read cells from")
    ap.add_argument(
        "--only-finished", action="store_true", help="tabulate cached cells only; run nothing"
    )
    ap.add_argument("--write", action="store_true", help="write the table into docs/privacy.md")
    ap.add_argument("--mark", default=MARK, help="--write: the markers the table goes between")
    args = ap.parse_args()
    if args.tune:
        tune(args)
    else:
        grid(args)


if __name__ == "__main__":
    main()
