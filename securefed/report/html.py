"""``report.html`` and ``report.md``: one document, read top to bottom, in two renderings.

The content is built once as a list of blocks (heading, paragraph, list, table, figure) and
rendered to a self-contained HTML page (figures embedded as base64 PNG, no script, no network)
and to Markdown (figures linked from ``figures/``).
"""

from __future__ import annotations

import base64
import html
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from securefed import runs
from securefed.report.plots import FIGURES

__all__ = ["baseline_flags", "summarise", "write_documents"]


@dataclass(frozen=True)
class _Block:
    kind: str  # h1, h2, p, ul, table, figure, note
    text: str = ""
    items: tuple[Any, ...] = ()
    header: tuple[str, ...] = ()


def _eps(e: float) -> str:
    return "∞ (no DP)" if math.isinf(e) else f"{e:g}"


def _num(x: Any, digits: int = 4) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    if isinstance(x, float) and math.isinf(x):
        return "∞"
    if isinstance(x, float):
        return f"{x:.{digits}g}" if abs(x) >= 1e-3 or x == 0 else f"{x:.2e}"
    return str(x)


def _mean_range(values: Any, digits: int = 4) -> str:
    v = [float(x) for x in values if x == x]
    if not v:
        return "–"
    m = sum(v) / len(v)
    if len(v) == 1:
        return f"{m:.{digits}f}"
    return f"{m:.{digits}f} [{min(v):.{digits}f}, {max(v):.{digits}f}]"


_THREATS = {
    "upload-observer": "the server (or anyone on the wire before secure aggregation) sees each "
    "client's upload",
    "aggregate-observer": "the server sees only per-round sums (secure aggregation) and the "
    "released global model",
    "release-observer": "anyone who sees only the global model released after training",
}


def _threat_models(frame: Any) -> list[str]:
    seen: dict[str, str] = {}
    for col in frame.columns:
        if col.endswith(":threat_model"):
            for t in frame[col].dropna().unique():
                if t:
                    seen[str(t)] = _THREATS.get(str(t), str(t))
    return [f"{k}: {v}" for k, v in sorted(seen.items())]


#: (name in the baseline columns, words): the yardsticks a cell is compared with, in order.
_YARDSTICKS = (
    ("random", "random scores"),
    ("mostpop", "MostPop"),
    ("dp_mostpop", "DP-MostPop at the same ε"),
)


def _models_only(frame: Any) -> Any:
    """The rows of the compared models: centralized references are reported apart."""
    if "role" not in frame:
        return frame
    return frame[frame["role"] != "centralized"]


def _grouped(frame: Any) -> Any:
    cols = {
        "hr": ("test_hr@10", "mean"),
        "ndcg": ("test_ndcg@10", "mean"),
        "full_hr": ("test_full_hr@10", "mean"),
        "spent": ("epsilon_spent", "max"),
        "seconds": ("seconds", "mean"),
        "seeds": ("seed", "count"),
    }
    for name, _ in _YARDSTICKS:
        for short, metric in (("hr", "test_hr@10"), ("full_hr", "test_full_hr@10")):
            col = f"baseline_{name}_{metric}"
            if col in frame:
                cols[f"{name}_{short}"] = (col, "mean")
    g = frame.groupby(["model", "defense", "epsilon"], sort=False).agg(**cols).reset_index()
    return g


#: How far below a yardstick a mean over seeds must be to count as below it: hit rates are hit
#: counts over the users, so equal counts tie exactly, and their means over seeds differ only
#: by float rounding (79/943 against the mean of 77/943 and 81/943).
TIE_TOLERANCE = 1e-9


def _below(row: Any) -> list[str]:
    """The yardsticks a grouped row's mean falls below (by more than float rounding), in
    words with the numbers."""
    out: list[str] = []
    for name, words in _YARDSTICKS:
        ref, ref_full = row.get(f"{name}_hr", math.nan), row.get(f"{name}_full_hr", math.nan)
        parts = []
        if ref == ref and row["hr"] < ref - TIE_TOLERANCE:
            parts.append(f"sampled HR@10 {row['hr']:.4f} < {ref:.4f}")
        full = row["full_hr"]
        if ref_full == ref_full and full == full and full < ref_full - TIE_TOLERANCE:
            parts.append(f"full HR@10 {row['full_hr']:.4f} < {ref_full:.4f}")
        if parts:
            label = words.replace("the same ε", f"ε = {row['epsilon']:g}")
            out.append(f"{label} ({', '.join(parts)})")
    return out


def _below_words(row: Any) -> str:
    below = _below(row)
    return "BELOW " + " and ".join(below) if below else ""


def _below_short(row: Any) -> str:
    """The key table's cell: which yardsticks the row is below (numbers in the list above)."""
    names = [b.split(" (", 1)[0] for b in _below(row)]
    return "BELOW " + ", ".join(names) if names else ""


def baseline_flags(frame: Any) -> list[str]:
    """One sentence per (model, defense, epsilon) whose mean over seeds falls below random,
    MostPop or DP-MostPop at its epsilon (sampled or full-ranking HR@10), on the same split."""
    g = _grouped(_models_only(frame))
    lines = []
    for _, row in g.iterrows():
        words = _below_words(row)
        if words:
            lines.append(
                f"{row['model']} · {row['defense']} · ε = {_eps(row['epsilon'])}: {words}."
            )
    return lines


def summarise(frame: Any, min_hr: float | None) -> tuple[list[str], dict[str, float]]:
    """Plain-language recommendations: per model, the lowest epsilon whose mean test HR@10
    (sampled) meets the floor. Without ``min_hr`` the floor is 90 % of the model's no-DP HR@10.

    A setting whose mean falls below random, MostPop or DP-MostPop at its epsilon is said to
    be BELOW them wherever it is named, and is never offered as "the best private one".
    Centralized references are not federated settings and get no sentence here.

    Returns:
        ``(sentences, {model: floor used})``.
    """
    g = _grouped(_models_only(frame))
    sentences: list[str] = []
    floors: dict[str, float] = {}
    for model, part in g.groupby("model", sort=True):
        nodp = part[part["defense"].isin(["none", "secagg"])]
        ref = float(nodp["hr"].max()) if not nodp.empty else float(part["hr"].max())
        if min_hr is not None:
            floor, how = min_hr, f"HR@10 ≥ {min_hr:g} (--min-hr)"
        else:
            floor = 0.9 * ref
            # Without a no-DP cell the reference is the best private one (it was labelled
            # "no-DP" all the same; found 2026-12-06).
            of = "no-DP" if not nodp.empty else "private (this grid has no no-DP cell)"
            # A reference below the count (in sampled HR@10, the floor's metric) makes the
            # floor a low bar: say so where it is set.
            top_ref = (nodp if not nodp.empty else part).sort_values("hr").iloc[-1]
            count = float(top_ref.get("mostpop_hr", math.nan))
            low = count == count and float(top_ref["hr"]) < count - TIE_TOLERANCE
            low_bar = f", itself below MostPop's {count:.4f}: a low bar" if low else ""
            how = (
                f"HR@10 ≥ {floor:.4f} (90 % of its best {of} HR@10, {ref:.4f}{low_bar}; "
                "set --min-hr)"
            )
        floors[str(model)] = floor
        private = part[part["defense"].str.startswith("dp")]
        ok = private[private["hr"] >= floor].sort_values(["epsilon", "hr"], ascending=[True, False])
        if not ok.empty:
            best = ok.iloc[0]
            others = ok[(ok["epsilon"] == best["epsilon"]) & (ok["defense"] != best["defense"])]
            also = (
                f" ({others.iloc[0]['defense']} also meets it at this epsilon, "
                f"HR@10 {others.iloc[0]['hr']:.4f})"
                if not others.empty
                else ""
            )
            below = _below_words(best)
            sentences.append(
                f"{model}: the lowest epsilon that meets {how} is ε = {best['epsilon']:g} with "
                f"{best['defense']} (mean HR@10 {best['hr']:.4f} over {int(best['seeds'])} "
                f"seed(s), epsilon spent {best['spent']:.3g}){also}."
                + (f" It is {below}: counting items does as well." if below else "")
            )
        elif not private.empty:
            meets = nodp[nodp["hr"] >= floor]
            tail = (
                " Only the non-private setting(s) "
                + ", ".join(sorted(set(meets["defense"])))
                + " meet it."
                if not meets.empty
                else " No setting meets it."
            )
            above = private[[not _below(r) for _, r in private.iterrows()]]
            if not above.empty:
                top = above.sort_values("hr", ascending=False).iloc[0]
                sentences.append(
                    f"{model}: no private setting meets {how}; the best private one above its "
                    f"baselines is {top['defense']} at ε = {top['epsilon']:g} (mean HR@10 "
                    f"{top['hr']:.4f}).{tail}"
                )
            else:
                top = private.sort_values("hr", ascending=False).iloc[0]
                sentences.append(
                    f"{model}: no private setting meets {how}, and every private setting is "
                    f"below a baseline: the highest, {top['defense']} at ε = {top['epsilon']:g} "
                    f"(mean HR@10 {top['hr']:.4f}), is {_below_words(top)}.{tail}"
                )
        else:
            sentences.append(f"{model}: no private setting was run, so no epsilon to recommend.")
    return sentences, floors


def _pair(sampled: Any, full: Any) -> str:
    """``sampled / full`` means over seeds, or "–" where there is no value."""
    a = [float(x) for x in sampled if x == x]
    b = [float(x) for x in full if x == x]
    if not a:
        return "–"
    text = f"{sum(a) / len(a):.4f}"
    return text + (f" / {sum(b) / len(b):.4f}" if b else "")


def _col(part: Any, name: str) -> Any:
    return part.get(name, [])


def _label(model: str, role: str) -> str:
    if role == "centralized":
        return f"{model} (CENTRALIZED reference: the server sees all data)"
    return model


def _key_table(frame: Any) -> tuple[tuple[str, ...], list[tuple[str, ...]]]:
    """The key table: one row per (model, defense, epsilon), means over seeds, each next to
    its baselines on the same split; then the yardstick rows (random, MostPop) and the
    centralized references of every dataset."""
    from attacks.results import NO_SIGNAL

    attack_cols = [c for c in frame.columns if c.endswith(":auc") and frame[c].notna().any()]
    datasets = sorted(set(frame["dataset"]))
    many = len(datasets) > 1
    header: tuple[str, ...] = (
        *(("dataset",) if many else ()),
        "model",
        "defense",
        "target ε",
        "ε spent",
        "seeds",
        "HR@10",
        "NDCG@10",
        "HR@10 full",
        "NDCG@10 full",
        "MostPop HR@10 (sampled / full)",
        "DP-MostPop HR@10 at this ε (sampled / full)",
        "against the baselines",
        "best attack AUC",
        "ε lower bound",
        "s / round",
        "secagg s / round",
    )
    rows: list[tuple[str, ...]] = []
    roles = frame.get("role")
    keys = ["dataset", "model", "defense", "epsilon"]
    for (dataset, model, defense, e), part in frame.groupby(keys, sort=False):
        best_auc, best_name = math.nan, ""
        for c in attack_cols:
            verdict = part.get(f"{c[: -len(':auc')]}:verdict")
            scored = part[c] if verdict is None else part[c][verdict != NO_SIGNAL]
            v = float(scored.mean()) if len(scored) else math.nan
            if v == v and not (v <= best_auc):
                best_auc, best_name = v, c[: -len(":auc")]
        lb = part.get("epsilon_lower_bound", [])
        role = str(part["role"].iloc[0]) if roles is not None else "federated"
        means = {
            "hr": float(part["test_hr@10"].mean()),
            "full_hr": float(part["test_full_hr@10"].mean()),
            "epsilon": float(e),
        }
        for name, _ in _YARDSTICKS:
            for short, metric in (("hr", "test_hr@10"), ("full_hr", "test_full_hr@10")):
                col = f"baseline_{name}_{metric}"
                means[f"{name}_{short}"] = float(part[col].mean()) if col in part else math.nan
        verdict = _below_short(means)
        rows.append(
            (
                *((str(dataset),) if many else ()),
                _label(str(model), role),
                str(defense),
                _eps(float(e)),
                _num(float(part["epsilon_spent"].max())),
                str(len(part)),
                _mean_range(part["test_hr@10"]),
                _mean_range(part["test_ndcg@10"]),
                _mean_range(part["test_full_hr@10"]),
                _mean_range(part["test_full_ndcg@10"]),
                _pair(
                    _col(part, "baseline_mostpop_test_hr@10"),
                    _col(part, "baseline_mostpop_test_full_hr@10"),
                ),
                _pair(
                    _col(part, "baseline_dp_mostpop_test_hr@10"),
                    _col(part, "baseline_dp_mostpop_test_full_hr@10"),
                ),
                verdict or ("at or above all" if "baseline_mostpop_test_hr@10" in part else "–"),
                f"{best_auc:.3f} ({best_name})" if best_name else "–",
                _mean_range(lb, 3) if len(lb) else "–",
                _num(float(part["seconds_per_round"].mean()), 3),
                _num(float(part["secagg_seconds_per_round"].mean()), 3),
            )
        )
    for dataset in datasets:
        rows.extend(_yardstick_rows(frame[frame["dataset"] == dataset], str(dataset), many))
    return header, rows


def _yardstick_rows(frame: Any, dataset: str, many: bool) -> list[tuple[str, ...]]:
    """Random and MostPop as rows of their own (one value per seed of the dataset)."""
    rows: list[tuple[str, ...]] = []
    for name, label in (
        ("random", "random scores (expected, same split)"),
        ("mostpop", "MostPop (item counts, same split)"),
    ):
        cols = [
            f"baseline_{name}_{m}"
            for m in ("test_hr@10", "test_ndcg@10", "test_full_hr@10", "test_full_ndcg@10")
        ]
        if not all(c in frame for c in cols):
            continue
        per_seed = frame.dropna(subset=cols).drop_duplicates(subset=["seed"])
        if per_seed.empty:
            continue
        rows.append(
            (
                *((dataset,) if many else ()),
                label,
                "none",
                _eps(math.inf),
                "∞",
                str(len(per_seed)),
                *(_mean_range(per_seed[c]) for c in cols),
                "–",
                "–",
                "baseline",
                "–",
                "–",
                "–",
                "–",
            )
        )
    return rows


def private_mode_line(frame: Any) -> str | None:
    """The setup's line on rows that ran a model's private mode (a private popularity prior,
    ``prior_share`` set), or None when none did."""
    if "prior_share" not in frame or not frame["prior_share"].notna().any():
        return None
    prior = frame[frame["prior_share"].notna()]
    models = sorted(set(prior["model"]))
    shares = ", ".join(f"{x:g}" for x in sorted(set(prior["prior_share"])))
    line = (
        f"Private modes: the {', '.join(sorted(set(prior['defense'])))} rows ("
        f"{', '.join(models)}) run with a private popularity prior in their scores (share "
        f"{shares} of the budget on one count release before the model's) and their mode's "
        "rounds and Poisson cohorts (docs/privacy.md, 'Private FedRAP and FedRecGEL'), so they "
        "differ from the same model's other rows by more than the defense"
    )
    plain = frame[
        frame["model"].isin(models)
        & (frame["defense"] == "dp+secagg")
        & frame["prior_share"].isna()
    ]
    if not plain.empty:
        line += (
            "; their dp+secagg rows cannot take the prior (its release needs central noise) "
            "and run the model's uploads alone"
        )
    return line


def _blocks(
    frame: Any,
    figures: dict[str, Path],
    skipped: list[Any],
    notes: list[str],
    sentences: list[str],
) -> list[_Block]:
    compared = _models_only(frame)
    models = sorted(set(compared["model"]))
    refs = sorted(set(frame["model"]) - set(models))
    datasets = sorted(set(frame["dataset"]))
    dp = frame[frame["dp"]]
    b: list[_Block] = [
        _Block("h1", f"Privacy-utility report: {', '.join(models)} on {', '.join(datasets)}")
    ]
    users = sorted(set(int(u) for u in frame["users"] if u >= 0))
    synthetic = bool(frame["synthetic"].any())
    eps = sorted(set(frame["epsilon"]))
    setup = [
        f"Dataset: {', '.join(datasets)}"
        + (f" ({', '.join(map(str, users))} users after filtering)" if users else "")
        + (" — SYNTHETIC data, not a real benchmark" if synthetic else ""),
        f"Models: {', '.join(models)}; rounds per run: "
        + ", ".join(str(r) for r in sorted(set(frame["rounds"]))),
        f"Seeds per setting: {int(frame.groupby(['model', 'defense', 'epsilon']).size().max())}; "
        f"cells run: {len(frame)}",
        "Baselines, on each row's own split and seed: random scores (expected value), MostPop "
        "(items ranked by training count) and, on DP rows, DP-MostPop (one Gaussian release of "
        "the counts at the row's epsilon; a reference not charged to the row's budget). Rows "
        "below any of them say so in words.",
        "Centralized references (CENTRALIZED: the server sees every interaction, no "
        "federation, no DP): " + (", ".join(refs) if refs else "none in these runs"),
        "Target epsilons: " + ", ".join(_eps(e) for e in eps),
        "Defenses: " + ", ".join(sorted(set(compared["defense"]))) + " (none = no DP and no secure "
        "aggregation; dp = central Gaussian noise added by a trusted server; secagg = secure "
        "aggregation without DP; dp+secagg = distributed discrete Gaussian noise added by the "
        "clients inside secure aggregation; +prior = the model's private mode, a private "
        "popularity count in its scores)",
    ]
    private = private_mode_line(frame)
    if private:
        setup.append(private)
    if not dp.empty:
        units = sorted(set(dp["privacy_unit"]) - {""})
        deltas = sorted(set(float(d) for d in dp["delta"] if d == d))
        acc = sorted(
            {f"{d}: {a}" for d, a in zip(dp["defense"], dp["accountant"], strict=True) if a}
        )
        setup += [
            f"Privacy unit: {', '.join(units) or 'user'}-level (neighbouring datasets differ by "
            "one user's whole data)",
            "delta: " + ", ".join(f"{d:g}" for d in deltas),
            "Accountant: " + "; ".join(acc),
        ]
    threats = _threat_models(frame)
    setup.append(
        "Threat models of the attacks: " + ("; ".join(threats) if threats else "no audit was run")
    )
    b += [_Block("h2", "1. Setup"), _Block("ul", items=tuple(setup))]
    if skipped:
        b.append(
            _Block(
                "p",
                "Combinations that were not run because they mean nothing:",
            )
        )
        b.append(
            _Block(
                "ul",
                items=tuple(
                    f"{s.model} · {s.defense} · ε = {_eps(s.epsilon)}: {s.reason}" for s in skipped
                ),
            )
        )
    captions = {
        "frontier": "Each point is the mean test metric over seeds at the round each run "
        "reports (the best validation HR@10; the last round for fedals's private mode); bars "
        "span the seeds. Top: the sampled protocol (the held-out item "
        "ranked against 99 sampled non-interacted items); bottom: full ranking over every item. "
        "Read it from right to left: how much utility each step down in epsilon costs. Points at "
        "∞ are the non-private references (none, and secagg, which adds no noise). Grey "
        "lines are the baselines on the same split: MostPop (dashed, an item count), "
        "DP-MostPop (a curve over epsilon: one noisy count at that epsilon) and random scores "
        "(dotted); black dash-dotted lines are the CENTRALIZED references, which see every "
        "interaction. A model under the MostPop line or the DP-MostPop curve is worse than "
        "counting.",
        "attacks": "Each column is one attack, scored on which items each user trained on "
        "(membership), pooled over (user, item) pairs. Dotted grey: a random guess. Attacks "
        "that need per-client uploads are not run when secure aggregation hides them, so "
        "secagg cells appear only in the aggregate attacks. TPR at 1% FPR (log scale) is the "
        "number that matters for privacy: how many members an attacker finds while almost never "
        "being wrong. Central dp adds its noise at the server, after the uploads, so against an "
        "upload observer (the server itself) it protects nothing: per-client attacks on dp "
        "cells stay as strong as without DP. The epsilon guarantee holds against whoever sees "
        "only the released model or the noised sums. A +prior row (a model's private mode) "
        "also runs its mode's rounds and cohorts, so its attacks differ from the other rows "
        "for more than the noise.",
        "epsilon_audit": "Canary audit: the largest epsilon the observed attack success proves "
        "at the stated confidence. A point above the line would mean the accountant "
        "under-reports the privacy loss (a bug); far below the line is expected (the audit "
        "attack is not optimal). Non-private cells sit at the right as the positive control: "
        "their bound should be clearly above zero.",
        "roc": "ROC curves on log-log axes of the attack with the highest mean AUC, one curve "
        "per epsilon. Curves on the dotted diagonal leak nothing; the low-FPR corner shows "
        "confident identifications.",
        "secagg": "Left (when secure aggregation ran): wall-clock seconds per round, split "
        "into secure aggregation (key agreement, masking, unmasking) and the rest. Right (when "
        "audited): membership AUC of an observer who sees only the sum of k clients' updates; "
        "secure aggregation hides individual uploads but a small cohort's sum still leaks.",
    }
    for i, (name, title) in enumerate(FIGURES.items(), start=2):
        b.append(_Block("h2", f"{i}. {title}"))
        if name in figures:
            b.append(_Block("figure", name, items=(str(figures[name]),)))
            b.append(_Block("p", captions[name]))
        else:
            why = [n for n in notes if n.lower().startswith(f"no {_NOTE_KEYS[name]}")]
            b.append(_Block("note", why[0] if why else "Not available for these runs."))
    header, rows = _key_table(frame)
    flags = baseline_flags(frame)
    b += [
        _Block("h2", f"{len(FIGURES) + 2}. Summary: which settings meet the utility floor"),
        _Block("ul", items=tuple(sentences)),
        _Block(
            "p",
            "Settings below a baseline (mean over seeds, same split): "
            + ("" if flags else "none; every setting beats random, MostPop and DP-MostPop."),
        ),
    ]
    if flags:
        b.append(_Block("ul", items=tuple(flags)))
    b += [
        _Block(
            "p",
            "Utility is the mean over seeds with the [min, max] over seeds in brackets. Each "
            "row stands next to MostPop and, when private, DP-MostPop at its epsilon (sampled "
            "/ full HR@10, means over the same seeds and split); the rows after the models are "
            "the yardsticks themselves and the CENTRALIZED references, which see every "
            "interaction and show what federation and privacy cost. Remember what each "
            "epsilon buys against which observer: dp trusts the server with the noise; "
            "dp+secagg does not, at the price of secure aggregation's cost and a slightly "
            "looser (RDP) accounting.",
        ),
        _Block("table", items=tuple(rows), header=header),
    ]
    other = [
        n for n in notes if not any(n.lower().startswith(f"no {k}") for k in _NOTE_KEYS.values())
    ]
    if other:
        b += [_Block("h2", "Notes"), _Block("ul", items=tuple(other))]
    b.append(
        _Block(
            "p",
            "Files: results.csv / results.parquet (one row per cell), figures/*.png and *.svg, "
            "and each cell's run directory (config.toml, metrics.jsonl, summary.json, "
            "privacy_ledger.json, audit/audit.json).",
        )
    )
    return b


_NOTE_KEYS = {
    "frontier": "utility",
    "attacks": "attack results",
    "epsilon_audit": "empirical epsilon",
    "roc": "roc",
    "secagg": "secure aggregation",
}

_CSS = """
body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;max-width:1100px;margin:2em auto;
padding:0 1em;color:#222;line-height:1.45}
h1{font-size:1.6em;border-bottom:2px solid #333;padding-bottom:.2em}
h2{font-size:1.25em;margin-top:1.8em;border-bottom:1px solid #ccc}
figure{margin:1em 0}figure img{max-width:100%;height:auto;border:1px solid #eee}
table{border-collapse:collapse;font-size:.82em;margin:1em 0}
th,td{border:1px solid #ccc;padding:.25em .5em;text-align:right}
th{background:#f3f3f3}td:nth-child(-n+3){text-align:left}
.note{background:#fff8e1;border-left:4px solid #f0b400;padding:.5em 1em}
"""


def _html(blocks: list[_Block]) -> str:
    e = html.escape
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{e(blocks[0].text)}</title><style>{_CSS}</style></head><body>",
    ]
    for blk in blocks:
        if blk.kind in ("h1", "h2"):
            parts.append(f"<{blk.kind}>{e(blk.text)}</{blk.kind}>")
        elif blk.kind == "p":
            parts.append(f"<p>{e(blk.text)}</p>")
        elif blk.kind == "note":
            parts.append(f'<p class="note">{e(blk.text)}</p>')
        elif blk.kind == "ul":
            parts.append("<ul>" + "".join(f"<li>{e(i)}</li>" for i in blk.items) + "</ul>")
        elif blk.kind == "table":
            head = "".join(f"<th>{e(h)}</th>" for h in blk.header)
            body = "".join(
                "<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>" for row in blk.items
            )
            parts.append(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
        elif blk.kind == "figure":
            png = Path(blk.items[0])
            data = base64.b64encode(png.read_bytes()).decode()
            title = FIGURES[blk.text]
            parts.append(
                f'<figure id="fig-{e(blk.text)}"><img alt="{e(title)}" '
                f'src="data:image/png;base64,{data}"></figure>'
            )
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|")


def _markdown(blocks: list[_Block], base: Path) -> str:
    lines: list[str] = []
    for blk in blocks:
        if blk.kind == "h1":
            lines += [f"# {blk.text}", ""]
        elif blk.kind == "h2":
            lines += [f"## {blk.text}", ""]
        elif blk.kind == "p":
            lines += [blk.text, ""]
        elif blk.kind == "note":
            lines += [f"> {blk.text}", ""]
        elif blk.kind == "ul":
            lines += [f"- {i}" for i in blk.items] + [""]
        elif blk.kind == "table":
            lines.append("| " + " | ".join(blk.header) + " |")
            lines.append("|" + "|".join("---" for _ in blk.header) + "|")
            lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in blk.items]
            lines.append("")
        elif blk.kind == "figure":
            rel = Path(blk.items[0]).relative_to(base).as_posix()
            lines += [f"![{FIGURES[blk.text]}]({rel})", ""]
    return "\n".join(lines)


def write_documents(
    frame: Any,
    out: Path,
    *,
    figures: dict[str, Path],
    skipped: list[Any],
    notes: list[str],
    min_hr: float | None,
) -> tuple[Path, Path]:
    """Write ``out/report.html`` and ``out/report.md``; return their paths."""
    sentences, floors = summarise(frame, min_hr)
    blocks = _blocks(frame, figures, skipped, notes, sentences)
    html_path, md_path = out / "report.html", out / "report.md"
    runs.atomic_write_text(html_path, _html(blocks))
    runs.atomic_write_text(md_path, _markdown(blocks, out))
    runs.write_json(
        out / "recommendations.json",
        {"recommendations": sentences, "floors": floors, "notes": notes, "min_hr": min_hr},
    )
    return html_path, md_path
