"""The attack table: both models on MovieLens 100K under every defense, several seeds.

Defenses: none / DP (epsilon 1, 2, 8; central noise) / secure aggregation / both (secure
aggregation with distributed DP at epsilon 2). Columns: the upload observer's strongest
membership attack (intersection; "-" under secure aggregation, where it has no input) with
its TPR at 1 % FPR, IMIA's AUC (upload observer), the released-model attack's AUC, the
aggregate observer's union and differencing AUC, the gradient-ratio inversion cosine,
gender-inference AUC, and the canary audit's empirical epsilon lower bound next to the
accounted epsilon. Under central DP the upload observer is the trusted server:
DP does not protect the uploads from it, only the aggregates.

    python benchmarks/attacks_table.py --data-dir ../shared/data --rounds 100 --seeds 0 1 2
    python benchmarks/attacks_table.py --rounds 3 --seeds 0          # reduced scale
    python benchmarks/attacks_table.py --from-report report-ml100k   # a report's audits

Writes ``<out>/table.md`` and ``<out>/table.json`` and each cell's audit directory.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any

from attacks.audit import AuditConfig, audit
from securefed.training import PrivacyConfig, TrainConfig

DEFENSES: dict[str, dict[str, Any]] = {
    "none": {},
    "dp-eps1": {"epsilon": 1.0},
    "dp-eps2": {"epsilon": 2.0},
    "dp-eps8": {"epsilon": 8.0},
    "secagg": {"secagg": True},
    "secagg+dp-eps2": {"secagg": True, "epsilon": 2.0},
}


def _number(value: Any) -> float:
    """A number of ``audit.json``: ``null`` (not finite, since 2026-12-07) or absent is NaN."""
    return math.nan if value is None else float(value)


def _metric(report: dict[str, Any], attack: str, key: str) -> float:
    for a in report["attacks"]:
        if a["name"] == attack and a["metrics"]:
            return _number(a["metrics"].get(key))
    return math.nan


def run_cell(
    model: str, defense: str, seed: int, *, rounds: int, data_dir: str | None, out: Path
) -> dict[str, Any]:
    """Audit one (model, defense, seed) cell; an existing ``out/audit.json`` is re-read."""
    privacy = PrivacyConfig(**DEFENSES[defense])
    t0 = time.perf_counter()
    if (out / "audit.json").exists():
        rep = json.loads((out / "audit.json").read_text())
        recorded = rep.get("recorded_bytes", 0)
    else:
        cfg = TrainConfig(
            model=model,
            dataset="ml-100k",
            data_dir=data_dir,
            rounds=rounds,
            seed=seed,
            eval_every=rounds,
            checkpoint_every=rounds,
            privacy=privacy,
        )
        res = audit(AuditConfig(train=cfg, bootstrap=100, target_users=0), out=out)
        rep, recorded = res.report, res.bytes_recorded
    row = table_row(rep, defense=defense, seed=seed, rounds=rounds)
    row["seconds"] = round(time.perf_counter() - t0, 1)
    row["recorded_mib"] = round(recorded / 2**20, 1)
    return row


def table_row(rep: dict[str, Any], *, defense: str, seed: int, rounds: int) -> dict[str, Any]:
    """One table row from an ``audit.json`` report."""
    return {
        "model": rep["model"],
        "defense": defense,
        "seed": seed,
        "rounds": rounds,
        "upload_auc": _metric(rep, "intersection", "auc"),
        "upload_tpr@1%fpr": _metric(rep, "intersection", "tpr@1%fpr"),
        "imia_auc": _metric(rep, "imia", "auc"),
        "released_auc": _metric(rep, "released", "auc"),
        "union_auc": _metric(rep, "union", "auc"),
        "differencing_auc": _metric(rep, "differencing", "auc"),
        "inversion_cosine": _metric(rep, "gradient-ratio", "embedding_cosine"),
        "attribute_auc": _metric(rep, "attribute-gender", "auc"),
        "empirical_epsilon": _number(rep["audit"]["epsilon_lower_bound"])
        if rep["audit"]
        else math.nan,
        "accounted_epsilon": _number(rep["accounted_epsilon"]),
    }


def rows_from_report(report_dir: Path) -> list[dict[str, Any]]:
    """Table rows from the audited cells of a ``securefed report`` directory (no training).

    Every audited cell becomes a row; DP cells are named by their target epsilon
    (``dp-eps2``, ``secagg+dp-eps2``), so the table covers the report's whole epsilon grid.
    """
    rows = []
    for audit_file in sorted((report_dir / "cells").glob("*/audit/audit.json")):
        rep = json.loads(audit_file.read_text())
        secagg, eps = bool(rep["secagg"]), rep["epsilon"]
        if eps is None:
            defense = "secagg" if secagg else "none"
        else:
            defense = ("secagg+dp-eps" if secagg else "dp-eps") + f"{eps:g}"
        rounds = int(rep["rounds"])
        rows.append(table_row(rep, defense=defense, seed=int(rep["seed"]), rounds=rounds))
    return rows


def _defense_order(defense: str) -> tuple[int, float]:
    """none, DP by epsilon, secagg, secagg+DP by epsilon."""
    for rank, prefix in enumerate(("none", "dp-eps", "secagg+dp-eps", "secagg")):
        if defense.startswith(prefix):
            rest = defense[len(prefix) :]
            return (rank if prefix != "secagg" else 2, float(rest) if rest else -1.0)
    return (9, 0.0)


def _fmt(x: Any) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return "-" if math.isnan(x) else f"{x:.3f}"
    return str(x)


def _table(rows: list[dict[str, Any]]) -> str:
    cols = [
        "model",
        "defense",
        "seeds",
        "upload_auc",
        "upload_tpr@1%fpr",
        "imia_auc",
        "released_auc",
        "union_auc",
        "differencing_auc",
        "inversion_cosine",
        "attribute_auc",
        "empirical_epsilon",
        "accounted_epsilon",
    ]
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["model"], r["defense"]), []).append(r)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for (model, defense), rs in groups.items():
        cells = [model, defense, str(len(rs))]
        for key in cols[3:]:
            vals = [r[key] for r in rs if r[key] is not None and not math.isnan(r[key])]
            if not vals:
                cells.append("-")
            elif len(vals) == 1:
                cells.append(_fmt(vals[0]))
            else:
                mean = sum(vals) / len(vals)
                sd = math.sqrt(sum((v - mean) ** 2 for v in vals) / (len(vals) - 1))
                cells.append(f"{mean:.3f} ± {sd:.3f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--models", nargs="+", default=["fedrap", "fedrecgel"])
    parser.add_argument("--defenses", nargs="+", default=list(DEFENSES))
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/out/attacks"))
    parser.add_argument(
        "--existing-only", action="store_true", help="Only tabulate cells already audited."
    )
    parser.add_argument(
        "--from-report",
        type=Path,
        default=None,
        help="Tabulate the audited cells of a `securefed report` directory instead of training.",
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.from_report is not None:
        rows = sorted(
            rows_from_report(args.from_report),
            key=lambda r: (r["model"], _defense_order(r["defense"]), r["seed"]),
        )
        (args.out / "table.json").write_text(json.dumps(rows, indent=2) + "\n")
        (args.out / "table.md").write_text(_table(rows))
        print(_table(rows))
        return
    rows: list[dict[str, Any]] = []
    for model in args.models:
        for defense in args.defenses:
            for seed in args.seeds:
                cell = args.out / f"{model}-{defense}-s{seed}-r{args.rounds}"
                if args.existing_only and not (cell / "audit.json").exists():
                    continue
                row = run_cell(
                    model, defense, seed, rounds=args.rounds, data_dir=args.data_dir, out=cell
                )
                rows.append(row)
                print(json.dumps(row), flush=True)
                (args.out / "table.json").write_text(json.dumps(rows, indent=2) + "\n")
                (args.out / "table.md").write_text(_table(rows))
    print(_table(rows))


if __name__ == "__main__":
    main()
