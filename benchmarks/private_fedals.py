"""Private fedals against DP-MostPop, with the ablation of its parts (docs/privacy.md).

Every cell is one ``securefed.train`` run with user-level DP at the cell's epsilon (delta
1e-5, PRV accountant, every client every round) on the project's split; DP-MostPop at the same
epsilon comes from the same run's summary (``securefed.baselines``: one Gaussian count
release, each user contributing at most 20 sampled items). Variants:

* ``fedals``: the private mode as shipped: the population rule (docs/privacy.md) picks the
  small or the large mode from ``N / sigma``. Small: one count round with each user's items
  weighted ``1/sqrt(n)``, then two co-occurrence rounds over the 400 items with the largest
  released counts (item factors from the leading eigenvectors of the averaged release),
  popularity prior in the scores; below 220 users per unit of noise (``N sqrt(R) / sigma``)
  the count-only rule makes every round a count round. Large: see ``large population``
  (with the tail ranked last);
* ``small population``: the small mode whatever the population (``population small``);
* ``no count-only rule``: the same with the rule off (``count_only_below 0``);
* ``no-prior``: the same without the prior in the scores (``prior_weight 0``);
* ``one co-occurrence round``: the count round and one co-occurrence round (``--rounds 2``;
  the count then has half the run's precision instead of a third);
* ``600 co-occurrence items``: ``gram_items 600``;
* ``400 co-occurrence items``: ``gram_items 400``, the large mode before its items followed
  the noise level (2026-12-05);
* ``ALS round (before)``: the small mode before the co-occurrence rounds (``ALS`` below: one
  ALS round on the items with a positive count, prior weight 0.3, 2 rounds); the next four
  variants change one thing of it:
* ``head z 3``: factors only for items whose released count clears 3 noise stds;
* ``k = 20 count``: the count round counts 20 sampled items per user (as DP-MostPop does)
  instead of weighting all of them;
* ``2 ALS rounds``: one count round, the ALS round, then one Newton round from the gradient
  rows (``--rounds 3``);
* ``large population``: factors only for items whose count clears 3 noise stds, then the ALS
  round and two Newton rounds, no prior in the scores (``--rounds 4 --param head_z=3 --param
  prior_weight=0``): the setting that doubles DP-MostPop on Gowalla (chosen there, see
  docs/privacy.md); on a population the rule calls large it also ranks items without a
  factor last (``tail_last``), as the rule's large mode does;
* ``large population 2 rounds``: the large mode at the private default of 2 rounds (count,
  ALS);
* ``large population, ALS (before)``: the large mode before the co-occurrence rounds
  (``population large``, ``gram_items 0``: count, ALS and two Newton rounds);
* ``count only``: the count round alone (``--rounds 1``): the prior by itself;
* ``DP-FedAvg``: the non-private fedals upload clipped and noised as FedRAP's is
  (``private false``, clip 10, 5 rounds);
* ``prior weight 0.3`` / ``0.5``: the count's weight in the scores (0.1 shipped);
* ``tail last``: items without a factor ranked below every item with one (``tail_last``);
* ``two count rounds``: two count rounds and one co-occurrence round (of the 3 rounds: the
  count gets two thirds of the run's precision instead of a third);
* ``tail counts``: the co-occurrence rounds also count each client's items without a factor,
  at the count round's weight, its pairs taking the rest of its unit norm (``tail_counts``);
* ``gram head z 2`` / ``3``: only those of the 400 most counted items whose count clears 2 (3)
  noise stds get co-occurrence pairs and factors (``gram_head_z``);
* ``count items 20``: the count round counts 20 sampled items per user at ``1/sqrt(20)`` (as
  DP-MostPop does) instead of all of them at ``1/sqrt(n)``.
* ``spectral shrinkage``: the co-occurrence release's eigenvalues shrunk to what they say
  without the noise, zero inside the noise's bulk (``gram_shrink``).

``--spectrum`` tabulates, instead of the variants, the leading eigenvalues of the shipped
mode's averaged co-occurrence release against the noise's bulk edge (seed 0, replay noise),
between the ``private-fedals-spectrum`` markers.

``--replay`` derives each run's DP noise from its seed (``--replay-from-seed``): the variants
of one seed then share their noise and split, and the table adds each variant's paired
difference from the first one listed (standard errors of 0.0003 to 0.003 over twenty seeds,
where with OS noise the spread between runs is about 0.006), and its difference from
DP-MostPop on the same split.

``--validation`` tabulates the validation metrics of each run's last round instead of the
test metrics (DP-MostPop's computed on the same split's validation items from the same noisy
counts as its test row; the last round, because a run's own validation metric is the best of
its rounds on that same number): the numbers a choice between variants may read. Its table
goes between the ``private-fedals-val`` markers unless ``--mark`` says otherwise.

    python benchmarks/private_fedals.py --datasets ml-100k,filmtrust --epsilons 1,2,4,8 \\
        --seeds 3 --write

writes the table between the ``private-fedals`` markers of docs/privacy.md. Cells are cached in
``--out`` (a finished cell's summary.json is reused).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import mean_se, write_between_markers  # benchmarks/ is the script's folder

#: The private small mode before the co-occurrence rounds (2026-12-05): one ALS round after the
#: count, prior weight 0.3, and the count-only rule at 300 users per unit of noise of one of
#: its two releases (``N / sigma_2 < 300`` is ``N sqrt(2) / sigma_2 < 300 sqrt(2)`` in the
#: rule's present terms). The ALS variants below start from it.
ALS = {"gram_items": 0, "prior_weight": 0.3, "count_only_below": 300.0 * math.sqrt(2.0)}

VARIANTS: dict[str, tuple[dict[str, Any], int | None, float | None]] = {
    # name: (fedals params, rounds (None: the model's default), clip)
    "fedals": ({}, None, None),
    "no count-only rule": ({"count_only_below": 0.0}, None, None),
    "no-prior": ({"prior_weight": 0.0}, None, None),
    "one co-occurrence round": ({}, 2, None),
    "600 co-occurrence items": ({"gram_items": 600}, None, None),
    "400 co-occurrence items": ({"gram_items": 400}, None, None),
    "one count round": ({"count_rounds": 1}, None, None),  # the large mode until 2026-12-05
    "ALS round (before)": (ALS, 2, None),
    "head z 3": ({**ALS, "head_z": 3.0}, 2, None),
    "k = 20 count": ({**ALS, "count_items": 20}, 2, None),
    "2 ALS rounds": (ALS, 3, None),
    "large population": ({**ALS, "head_z": 3.0, "prior_weight": 0.0}, 4, None),
    "small population": ({"population": "small"}, None, None),
    "large population 2 rounds": ({"population": "large"}, 2, None),
    "large population, ALS (before)": ({"population": "large", "gram_items": 0}, None, None),
    "count only": ({}, 1, None),
    "prior weight 0.3": ({"prior_weight": 0.3}, None, None),
    "prior weight 0.5": ({"prior_weight": 0.5}, None, None),
    "tail last": ({"tail_last": True}, None, None),
    "two count rounds": ({"count_rounds": 2}, None, None),
    "tail counts": ({"tail_counts": True}, None, None),
    "gram head z 2": ({"gram_head_z": 2.0}, None, None),
    "gram head z 3": ({"gram_head_z": 3.0}, None, None),
    "count items 20": ({"count_items": 20}, None, None),
    "no noise-limited head rule": ({"sparse_head_below": 0.0}, None, None),
    "gram head z 3 with tail counts": ({"gram_head_z": 3.0, "tail_counts": True}, None, None),
    "spectral shrinkage": ({"gram_shrink": True}, None, None),
    "DP-FedAvg": ({"private": False}, 5, 10.0),
}
METRICS = ("test_hr@10", "test_full_hr@10")
MARK = "private-fedals"


def _dp_mostpop_validation(dataset: str, seed: int, eps: float, args: argparse.Namespace) -> dict:
    """DP-MostPop's validation HR@10 (sampled, full) on the cell's split: the counts of its test
    row (``securefed.baselines.dp_mostpop_counts``, seeded by the run seed), scored on the
    validation items."""
    from securefed import TrainConfig
    from securefed.baselines import dp_mostpop_counts
    from securefed.evaluation import evaluate_splits
    from securefed.models.mostpop import CountScorer
    from securefed.training import load_split

    key = (dataset, seed)
    if key not in _SPLITS:
        cfg = TrainConfig(model="mostpop", dataset=dataset, data_dir=args.data_dir, seed=seed)
        _SPLITS[key] = load_split(cfg)
    split = _SPLITS[key]
    counts, _ = dp_mostpop_counts(split, epsilon=eps, delta=1e-5, privacy_unit="user", seed=seed)
    res = evaluate_splits(CountScorer(counts), split, which=("val",), k=10, full=True)["val"]
    return {"final_val_hr@10": res.hr, "final_val_full_hr@10": res.full_hr}


_SPLITS: dict[tuple[str, int], Any] = {}


def _cell(
    dataset: str, eps: float, seed: int, variant: str, args: argparse.Namespace
) -> dict | None:
    from securefed import PrivacyConfig, TrainConfig, get_spec, train

    params, rounds, clip = VARIANTS[variant]
    slug = re.sub(r"[^a-z0-9]+", "-", variant.lower())
    run = Path(args.out) / f"{Path(dataset).stem}-eps{eps:g}-{slug}-s{seed}"
    if (run / "summary.json").exists():
        import tomllib

        made = tomllib.loads((run / "config.toml").read_text()).get("privacy", {})
        if bool(made.get("replay", False)) != args.replay:
            raise SystemExit(
                f"{run} was run {'with' if made.get('replay') else 'without'} replay noise; "
                f"{'drop' if made.get('replay') else 'give'} --replay or use another --out"
            )
        return json.loads((run / "summary.json").read_text())
    if args.only_finished:
        return None
    if run.exists():
        import shutil

        shutil.rmtree(run)
    cfg = TrainConfig(
        model="fedals",
        dataset=dataset,
        data_dir=args.data_dir,
        seed=seed,
        rounds=rounds,
        params=get_spec("fedals").params(**params),
        privacy=PrivacyConfig(epsilon=eps, clip=clip, replay=args.replay),
    )
    return train(cfg, out=run).summary


def _spectrum(args: argparse.Namespace) -> str:
    """A table of the averaged co-occurrence release's leading eigenvalues against the noise's
    bulk edge, one shipped fedals run (seed 0, replay noise) per dataset and epsilon."""
    from securefed import PrivacyConfig, TrainConfig, train

    lines = [
        f"Written by `python benchmarks/private_fedals.py --spectrum --datasets {args.datasets} "
        f"--epsilons {args.epsilons} --write"
        f"{'' if args.mark == MARK else f' --mark {args.mark}'}` ({time.strftime('%Y-%m-%d')}); "
        "the private fedals as shipped, seed 0, noise from the seed; its last co-occurrence "
        "release averaged with the earlier one (`FedALS.cooc_spectrum`). `m`: the items with "
        "co-occurrence pairs; edge: `2 s sqrt(m)`, `s` the noise std of each averaged entry.",
        "",
        "| dataset | epsilon | m | edge | leading eigenvalues / edge (the private mode's 16) "
        "| above the edge |",
        "|---|---|---|---|---|---|",
    ]
    for dataset in (d for d in args.datasets.split(",") if d):
        for eps in (float(e) for e in args.epsilons.split(",")):
            cfg = TrainConfig(
                model="fedals",
                dataset=dataset,
                data_dir=args.data_dir,
                seed=0,
                privacy=PrivacyConfig(epsilon=eps, replay=True),
            )
            with tempfile.TemporaryDirectory() as tmp:
                model = train(cfg, out=Path(tmp) / "run").model
            found = model.cooc_spectrum()  # type: ignore[attr-defined]
            if found is None:
                lines.append(
                    f"| {Path(dataset).stem} | {eps:g} | - | - | no co-occurrence round | - |"
                )
                continue
            evals, edge = found
            ratios = (evals[:16] / edge).tolist()
            lines.append(
                f"| {Path(dataset).stem} | {eps:g} | {evals.shape[0]} | {edge:.1f} | "
                f"{', '.join(f'{r:.2f}' for r in ratios)} | {sum(r > 1.0 for r in ratios)} |"
            )
    return "\n".join(lines)


def _fmt(values: list[float]) -> str:
    import statistics

    if not values:
        return "-"
    mean = statistics.fmean(values)
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{mean:.3f} ± {sd:.3f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--datasets", default="ml-100k,filmtrust")
    ap.add_argument("--epsilons", default="1,2,4,8")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument(
        "--data-dir", default=str(Path(__file__).resolve().parents[2] / "shared" / "data")
    )
    ap.add_argument("--out", default="benchmarks/out/private_fedals")
    ap.add_argument("--write", action="store_true", help="write the table into docs/privacy.md")
    ap.add_argument(
        "--only-finished",
        action="store_true",
        help="tabulate cached cells only (a variant with none is marked not run); run nothing",
    )
    ap.add_argument(
        "--mark", default=MARK, help="the docs/privacy.md markers to write between (<!-- MARK -->)"
    )
    ap.add_argument(
        "--validation",
        action="store_true",
        help="validation metrics instead of test (what a choice between variants may read)",
    )
    ap.add_argument(
        "--replay",
        action="store_true",
        help="DP noise from each run's seed (--replay-from-seed): variants of one seed share "
        "their noise, so their difference is the variant's alone (a paired comparison)",
    )
    ap.add_argument(
        "--spectrum",
        action="store_true",
        help="tabulate the co-occurrence release's leading eigenvalues against the noise's "
        "bulk edge (seed 0) instead of the variants",
    )
    args = ap.parse_args()
    if args.spectrum:
        if args.mark == MARK:
            args.mark = MARK + "-spectrum"
        table = _spectrum(args)
        print(table)
        if args.write:
            write_between_markers(table, args.mark)
        return
    if args.validation and args.mark == MARK:
        args.mark = MARK + "-val"  # never over the test table
    # Validation: the last round's model (a run's val_hr@10 is the best of its rounds on that
    # same number, which DP-MostPop's single release does not get).
    metrics = ("final_val_hr@10", "final_val_full_hr@10") if args.validation else METRICS
    datasets = [d for d in args.datasets.split(",") if d]
    epsilons = [float(e) for e in args.epsilons.split(",")]
    variants = [v for v in args.variants.split(",") if v]
    started = time.time()
    rows = []
    selections: set[str] = set()  # how the runs chose the round they report
    for dataset in datasets:
        for eps in epsilons:
            found = {
                v: [_cell(dataset, eps, s, v, args) for s in range(args.seeds)] for v in variants
            }
            cells = {v: [c for c in found[v] if c is not None] for v in variants}
            selections.update(str(c.get("selection")) for v in variants for c in cells[v])
            base = max(cells.values(), key=len)
            if not base:
                continue
            # Every metric as {seed: value}: paired differences match seeds, not positions.
            if args.validation:
                seeds = [c["seed"] for c in base]
                found_dp = [_dp_mostpop_validation(dataset, s, eps, args) for s in seeds]
                dp_mp = {
                    k: dict(zip(seeds, (c[k] for c in found_dp), strict=True)) for k in metrics
                }
            else:
                dp_mp = {
                    k: {c["seed"]: c[f"baseline_dp_mostpop_{k}"] for c in base} for k in METRICS
                }
            rows.append((dataset, eps, "DP-MostPop (k = 20)", dp_mp, None))
            for v in variants:
                if not cells[v]:
                    rows.append((dataset, eps, v, None, None))
                    continue
                vals = {k: {c["seed"]: c[k] for c in cells[v]} for k in metrics}
                rows.append((dataset, eps, v, vals, [c["epsilon"] for c in cells[v]]))
            print(f"{dataset} eps {eps:g} done ({time.time() - started:.0f} s)", flush=True)
    lines = [
        f"Written by `python benchmarks/private_fedals.py --datasets {args.datasets} "
        f"--epsilons {args.epsilons} --seeds {args.seeds} --variants '{args.variants}' "
        f"--out {args.out}{' --only-finished' if args.only_finished else ''} --write"
        f"{'' if args.mark == MARK else f' --mark {args.mark}'}"
        f"{' --validation' if args.validation else ''}"
        f"{' --replay' if args.replay else ''}` ({time.strftime('%Y-%m-%d')}); mean ± "
        f"sd over seeds of the "
        + (
            "validation metrics of the last round"
            if args.validation
            else "test metrics at the round each run reports, as its summary's `selection` says: "
            + " / ".join(sorted(selections))
        )
        + "; user-level DP, delta 1e-5, every client every round"
        + (
            f"; noise from each run's seed (--replay-from-seed), so the variants of one seed "
            f"share it and the last column is the paired difference from `{variants[0]}`; "
            "the DP-MostPop column gives each variant's difference from the count on the same "
            "split (mean ± standard error over seeds)."
            if args.replay
            else "; OS noise."
        ),
        "",
        "| dataset | epsilon | variant | HR@10 sampled | HR@10 full | epsilon spent (max) | "
        "vs DP-MostPop (sampled / full) |"
        + (f" paired vs {variants[0]} (sampled / full) |" if args.replay else ""),
        "|---|---|---|---|---|---|---|" + ("---|" if args.replay else ""),
    ]
    import statistics

    Vals = dict[str, dict[int, float]]

    def paired_cell(vals: Vals, base: Vals | None) -> str:
        """``sampled / full`` differences ``vals - base`` over the seeds both have
        (mean ± s.e.)."""
        parts = []
        for k in metrics:
            seeds = sorted(set(vals[k]) & set(base[k])) if base is not None else []
            if base is None or len(seeds) < 2:
                parts.append("-")
                continue
            mean, se = mean_se([vals[k][s] - base[k][s] for s in seeds])
            parts.append(f"{mean:+.4f} ± {se:.4f}")
        return " / ".join(parts)

    ref: dict[tuple[str, float], dict[str, float]] = {}
    ref_vals: dict[tuple[str, float], Vals] = {}
    first: dict[tuple[str, float], Vals] = {}
    for dataset, eps, name, vals, spent in rows:
        if vals is None:
            lines.append(
                f"| {Path(dataset).stem} | {eps:g} | {name} | not run | | | |"
                + (" |" if args.replay else "")
            )
            continue
        paired = ""
        if args.replay:
            if spent is None:
                paired = " - |"
            elif name == variants[0]:
                first[(dataset, eps)] = vals
                paired = " - |"
            else:
                paired = f" {paired_cell(vals, first.get((dataset, eps)))} |"
        means = {k: statistics.fmean(v.values()) for k, v in vals.items()}
        if spent is None:
            ref[(dataset, eps)] = means
            ref_vals[(dataset, eps)] = vals
            versus = "-"
        else:
            r = ref[(dataset, eps)]
            versus = " / ".join(("above" if means[k] >= r[k] else "**below**") for k in metrics)
            if args.replay:
                versus += f" ({paired_cell(vals, ref_vals[(dataset, eps)])})"
        lines.append(
            f"| {Path(dataset).stem} | {eps:g} | {name} | "
            f"{_fmt(list(vals[metrics[0]].values()))} | {_fmt(list(vals[metrics[1]].values()))} | "
            f"{'-' if spent is None else f'{max(spent):.3f}'} | {versus} |{paired}"
        )
    table = "\n".join(lines)
    print(table)
    if args.write:
        write_between_markers(table, args.mark)


if __name__ == "__main__":
    main()
