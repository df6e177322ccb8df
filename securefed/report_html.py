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
from securefed.report_plots import FIGURES

__all__ = ["summarise", "write_documents"]


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


def _grouped(frame: Any) -> Any:
    cols = {
        "hr": ("test_hr@10", "mean"),
        "ndcg": ("test_ndcg@10", "mean"),
        "full_hr": ("test_full_hr@10", "mean"),
        "spent": ("epsilon_spent", "max"),
        "seconds": ("seconds", "mean"),
        "seeds": ("seed", "count"),
    }
    g = frame.groupby(["model", "defense", "epsilon"], sort=False).agg(**cols).reset_index()
    return g


def summarise(frame: Any, min_hr: float | None) -> tuple[list[str], dict[str, float]]:
    """Plain-language recommendations: per model, the lowest epsilon whose mean test HR@10
    (sampled) meets the floor. Without ``min_hr`` the floor is 90 % of the model's no-DP HR@10.

    Returns:
        ``(sentences, {model: floor used})``.
    """
    g = _grouped(frame)
    sentences: list[str] = []
    floors: dict[str, float] = {}
    for model, part in g.groupby("model", sort=True):
        nodp = part[part["defense"].isin(["none", "secagg"])]
        ref = float(nodp["hr"].max()) if not nodp.empty else float(part["hr"].max())
        if min_hr is not None:
            floor, how = min_hr, f"HR@10 ≥ {min_hr:g} (--min-hr)"
        else:
            floor = 0.9 * ref
            how = f"HR@10 ≥ {floor:.4f} (90 % of its best no-DP HR@10, {ref:.4f}; set --min-hr)"
        floors[str(model)] = floor
        private = part[part["defense"].isin(["dp", "dp+secagg"])]
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
            sentences.append(
                f"{model}: the lowest epsilon that meets {how} is ε = {best['epsilon']:g} with "
                f"{best['defense']} (mean HR@10 {best['hr']:.4f} over {int(best['seeds'])} "
                f"seed(s), epsilon spent {best['spent']:.3g}){also}."
            )
        elif not private.empty:
            top = private.sort_values("hr", ascending=False).iloc[0]
            meets = nodp[nodp["hr"] >= floor]
            tail = (
                " Only the non-private setting(s) "
                + ", ".join(sorted(set(meets["defense"])))
                + " meet it."
                if not meets.empty
                else " No setting meets it."
            )
            sentences.append(
                f"{model}: no private setting meets {how}; the best private one is "
                f"{top['defense']} at ε = {top['epsilon']:g} (mean HR@10 {top['hr']:.4f}).{tail}"
            )
        else:
            sentences.append(f"{model}: no private setting was run, so no epsilon to recommend.")
    return sentences, floors


def _key_table(frame: Any) -> tuple[tuple[str, ...], list[tuple[str, ...]]]:
    """The key table: one row per (model, defense, epsilon), means over seeds."""
    attack_cols = [c for c in frame.columns if c.endswith(":auc") and frame[c].notna().any()]
    header: tuple[str, ...] = (
        "model",
        "defense",
        "target ε",
        "ε spent",
        "seeds",
        "HR@10",
        "NDCG@10",
        "HR@10 full",
        "NDCG@10 full",
        "best attack AUC",
        "ε lower bound",
        "s / round",
        "secagg s / round",
    )
    rows: list[tuple[str, ...]] = []
    for (model, defense, e), part in frame.groupby(["model", "defense", "epsilon"], sort=False):
        best_auc, best_name = math.nan, ""
        for c in attack_cols:
            v = float(part[c].mean())
            if v == v and not (v <= best_auc):
                best_auc, best_name = v, c[: -len(":auc")]
        lb = part.get("epsilon_lower_bound", [])
        rows.append(
            (
                str(model),
                str(defense),
                _eps(float(e)),
                _num(float(part["epsilon_spent"].max())),
                str(len(part)),
                _mean_range(part["test_hr@10"]),
                _mean_range(part["test_ndcg@10"]),
                _mean_range(part["test_full_hr@10"]),
                _mean_range(part["test_full_ndcg@10"]),
                f"{best_auc:.3f} ({best_name})" if best_name else "–",
                _mean_range(lb, 3) if len(lb) else "–",
                _num(float(part["seconds_per_round"].mean()), 3),
                _num(float(part["secagg_seconds_per_round"].mean()), 3),
            )
        )
    return header, rows


def _blocks(
    frame: Any,
    figures: dict[str, Path],
    skipped: list[Any],
    notes: list[str],
    sentences: list[str],
) -> list[_Block]:
    models = sorted(set(frame["model"]))
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
        "Target epsilons: " + ", ".join(_eps(e) for e in eps),
        "Defenses: " + ", ".join(sorted(set(frame["defense"]))) + " (none = no DP and no secure "
        "aggregation; dp = central Gaussian noise added by a trusted server; secagg = secure "
        "aggregation without DP; dp+secagg = distributed discrete Gaussian noise added by the "
        "clients inside secure aggregation)",
    ]
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
        "frontier": "Each point is the mean test metric over seeds at the round with the best "
        "validation HR@10; bars span the seeds. Top: the sampled protocol (the held-out item "
        "ranked against 99 sampled non-interacted items); bottom: full ranking over every item. "
        "Read it from right to left: how much utility each step down in epsilon costs. Points at "
        "∞ are the non-private references (none, and secagg, which adds no noise).",
        "attacks": "Each column is one attack, scored on which items each user trained on "
        "(membership), pooled over (user, item) pairs. Dotted grey: a random guess. Attacks "
        "that need per-client uploads are not run when secure aggregation hides them, so "
        "secagg cells appear only in the aggregate attacks. TPR at 1% FPR (log scale) is the "
        "number that matters for privacy: how many members an attacker finds while almost never "
        "being wrong. Central dp adds its noise at the server, after the uploads, so against an "
        "upload observer (the server itself) it protects nothing: per-client attacks on dp "
        "cells stay as strong as without DP. The epsilon guarantee holds against whoever sees "
        "only the released model or the noised sums.",
        "epsilon_audit": "Canary audit: the largest epsilon the observed attack success proves "
        "at the stated confidence. A point above the line would mean the accountant "
        "under-reports the privacy loss (a bug); far below the line is expected (the audit "
        "attack is not optimal). Non-private cells sit at the right as the positive control: "
        "their bound should be clearly above zero.",
        "roc": "ROC curves on log-log axes of the attack with the highest mean AUC, one curve "
        "per epsilon. Curves on the dotted diagonal leak nothing; the low-FPR corner shows "
        "confident identifications.",
        "secagg": "Left: wall-clock seconds per round, split into secure aggregation (key "
        "agreement, masking, unmasking) and the rest. Right (when audited): membership AUC of "
        "an observer who sees only the sum of k clients' updates; secure aggregation hides "
        "individual uploads but a small cohort's sum still leaks.",
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
    b += [
        _Block("h2", f"{len(FIGURES) + 2}. Summary: which settings meet the utility floor"),
        _Block("ul", items=tuple(sentences)),
        _Block(
            "p",
            "Utility is the mean over seeds with the [min, max] over seeds in brackets. "
            "Remember what each epsilon buys against which observer: dp trusts the server with "
            "the noise; dp+secagg does not, at the price of secure aggregation's cost and a "
            "slightly looser (RDP) accounting.",
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
