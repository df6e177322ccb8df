"""The figures of a privacy-utility report (matplotlib, Agg backend), as PNG and SVG.

Each ``_draw_*`` function takes the results table (one row per cell, see
:func:`securefed.report.collect_results`) and returns a figure, or a note saying why there is
nothing to draw. :func:`draw_figures` saves every figure as ``<name>.png`` and ``<name>.svg``.

Epsilon is drawn on a categorical axis: the requested values in order, with ``inf`` (no DP) at
the right end, so the no-DP reference sits beside the private settings it is compared with.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["FIGURES", "draw_figures", "roc_curve"]

#: Figure names, in report order, with their titles.
FIGURES: dict[str, str] = {
    "frontier": "Privacy-utility frontier",
    "attacks": "Attack success vs epsilon",
    "epsilon_audit": "Empirical epsilon lower bound vs accounted epsilon",
    "roc": "ROC curves of the strongest attack",
    "secagg": "Secure aggregation cost and union leakage",
}

_STYLE = {
    "none": {"marker": "*", "linestyle": "none", "markersize": 11},
    "secagg": {"marker": "^", "linestyle": "none", "markersize": 8},
    "dp": {"marker": "o", "linestyle": "-", "markersize": 6},
    "dp+secagg": {"marker": "s", "linestyle": "--", "markersize": 6},
    "dp+prior": {"marker": "D", "linestyle": "-.", "markersize": 6},
    "dp+secagg+prior": {"marker": "P", "linestyle": ":", "markersize": 7},
}
_COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"]
#: One line style per model in figures that colour by epsilon (the union-leakage curves).
LINESTYLES: tuple[Any, ...] = ("-", "--", ":", "-.")


def _eps_text(e: float) -> str:
    return "∞\n(no DP)" if math.isinf(e) else f"{e:g}"


def _axis(frame: Any) -> tuple[list[float], dict[float, int]]:
    eps = sorted(set(frame["epsilon"].tolist()))
    return eps, {e: i for i, e in enumerate(eps)}


def _set_eps_ticks(ax: Any, eps: list[float]) -> None:
    ax.set_xticks(range(len(eps)))
    ax.set_xticklabels([_eps_text(e) for e in eps])
    ax.set_xlim(-0.5, len(eps) - 0.5)
    ax.set_xlabel("target epsilon (user-level)")
    ax.grid(True, alpha=0.3)


def _color(models: list[str], model: str) -> str:
    return _COLORS[models.index(model) % len(_COLORS)]


def _series(frame: Any, column: str, lo: str | None = None, hi: str | None = None) -> Any:
    """Mean over seeds per (model, defense, epsilon), with the spread as error bars.

    The error bar spans min..max over seeds, widened to the per-cell 95 % intervals when
    ``lo``/``hi`` columns are given (a single seed then shows its own interval).
    """
    import pandas as pd

    cols = [column] + [c for c in (lo, hi) if c is not None and c in frame]
    sub = frame.dropna(subset=[column])
    if sub.empty:
        return pd.DataFrame()
    g = sub.groupby(["model", "defense", "epsilon"])
    agg = g[cols].mean().rename(columns={column: "mean"})
    agg["low"] = g[column].min()
    agg["high"] = g[column].max()
    if lo is not None and lo in frame:
        agg["low"] = np.fmin(agg["low"], g[lo].min())
    if hi is not None and hi in frame:
        agg["high"] = np.fmax(agg["high"], g[hi].max())
    agg["seeds"] = g[column].count()
    return agg.reset_index()


_OFFSET = {
    "none": -0.06,
    "dp": -0.03,
    "dp+prior": -0.015,
    "dp+secagg": 0.03,
    "dp+secagg+prior": 0.015,
    "secagg": 0.06,
}


def _plot_lines(
    ax: Any, agg: Any, models: list[str], index: dict[float, int], **extra: Any
) -> None:
    for (model, defense), part in agg.groupby(["model", "defense"], sort=False):
        part = part.sort_values("epsilon")
        # Small offsets keep settings that land on the same value (none and secagg) apart.
        shift = _OFFSET.get(defense, 0.0) + 0.12 * (models.index(model) - (len(models) - 1) / 2)
        x = [index[e] + shift for e in part["epsilon"]]
        y = part["mean"].to_numpy()
        err = np.vstack([y - part["low"].to_numpy(), part["high"].to_numpy() - y])
        ax.errorbar(
            x,
            y,
            yerr=np.clip(err, 0, None),
            color=_color(models, model),
            capsize=3,
            label=f"{model} · {defense}",
            **{**_STYLE.get(defense, {}), **extra},
        )


def _legend(fig: Any, axes: Any, **kwargs: Any) -> None:
    """One figure legend with every labelled artist of every panel, once."""
    seen: dict[str, Any] = {}
    for ax in np.ravel(axes):
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            seen.setdefault(label, handle)
    labels = sorted(seen, key=lambda lbl: (lbl == "random guess", lbl))
    fig.legend([seen[lbl] for lbl in labels], labels, **kwargs)


_REF_STYLES = ("-.", (0, (5, 1, 1, 1, 1, 1)), (0, (1, 1)))


def _split_roles(frame: Any) -> tuple[Any, Any]:
    """(the compared models' rows, the centralized references' rows)."""
    if "role" not in frame:
        return frame, frame.iloc[0:0]
    central = frame["role"] == "centralized"
    return frame[~central], frame[central]


def _draw_baselines(ax: Any, frame: Any, refs: Any, col: str, index: dict[float, int]) -> None:
    """MostPop and random as horizontal lines, DP-MostPop as a curve over epsilon, and each
    centralized reference as a horizontal line, all on the same split as the models."""
    per_seed = frame.drop_duplicates(subset=["dataset", "seed"])
    for name, style, label in (
        ("mostpop", "--", "MostPop (same split)"),
        ("random", ":", "random scores"),
    ):
        values = per_seed.get(f"baseline_{name}_{col}")
        if values is not None and values.notna().any():
            ax.axhline(float(values.mean()), color="grey", linestyle=style, label=label)
    dp_col = f"baseline_dp_mostpop_{col}"
    if dp_col in frame and frame[dp_col].notna().any():
        dp = frame.dropna(subset=[dp_col]).drop_duplicates(subset=["dataset", "seed", "epsilon"])
        curve = dp.groupby("epsilon")[dp_col].mean().sort_index()
        ax.plot(
            [index[e] for e in curve.index if e in index],
            [float(v) for e, v in curve.items() if e in index],
            color="grey",
            marker="x",
            linestyle="-",
            linewidth=1.2,
            label="DP-MostPop at that ε",
        )
    for k, (model, part) in enumerate(refs.groupby("model", sort=True)):
        ax.axhline(
            float(part[col].mean()),
            color="black",
            linestyle=_REF_STYLES[k % len(_REF_STYLES)],
            linewidth=1.1,
            label=f"{model} (CENTRALIZED, all data)",
        )


def _draw_frontier(frame: Any) -> tuple[Any, str | None]:
    import matplotlib.pyplot as plt

    frame, refs = _split_roles(frame)
    if frame.empty:
        return None, "No utility frontier: only centralized references were run."
    eps, index = _axis(frame)
    models = sorted(set(frame["model"]))
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5), sharex=True, layout="constrained")
    panels = (
        ("test_hr@10", "HR@10, sampled (1 + 99 negatives)"),
        ("test_ndcg@10", "NDCG@10, sampled (1 + 99 negatives)"),
        ("test_full_hr@10", "HR@10, full ranking"),
        ("test_full_ndcg@10", "NDCG@10, full ranking"),
    )
    for ax, (col, title) in zip(axes.flat, panels, strict=True):
        _plot_lines(ax, _series(frame, col), models, index)
        _draw_baselines(ax, frame, refs, col, index)
        ax.set_title(title)
        ax.set_ylabel(col.replace("test_", "test "))
        _set_eps_ticks(ax, eps)
    _legend(fig, axes, loc="outside right center", title="model · defense; baselines")
    seeds = int(frame.groupby(["model", "defense", "epsilon"]).size().max())
    fig.suptitle(
        f"Utility vs privacy (mean over {seeds} seed{'s' if seeds > 1 else ''}; "
        "bars: min-max over seeds)"
    )
    return fig, None


def _attack_names(frame: Any) -> list[str]:
    names = []
    for col in frame.columns:
        if col.endswith(":auc") and frame[col].notna().any():
            names.append(col[: -len(":auc")])
    return names


def _draw_attacks(frame: Any) -> tuple[Any, str | None]:
    import matplotlib.pyplot as plt

    names = _attack_names(frame)
    if not names:
        return None, "No attack results: the cells were not audited."
    eps, index = _axis(frame)
    models = sorted(set(frame["model"]))
    metrics = (("auc", "AUC"), ("tpr@1%fpr", "TPR at 1% FPR"))
    ncols = min(4, len(names))
    nrows = 2 * math.ceil(len(names) / ncols)
    fig, axes = plt.subplots(
        nrows,
        ncols,
        figsize=(3.6 * ncols + 0.5, 2.9 * nrows + 0.6),
        squeeze=False,
        layout="constrained",
    )
    for ax in axes.flat:
        ax.set_visible(False)
    for j, name in enumerate(names):
        for i, (key, label) in enumerate(metrics):
            ax = axes[2 * (j // ncols) + i][j % ncols]
            col = f"{name}:{key}"
            if col not in frame or frame[col].isna().all():
                continue
            ax.set_visible(True)
            _plot_lines(ax, _series(frame, col, f"{col}:lo", f"{col}:hi"), models, index)
            base = frame.get(f"{col}:baseline")
            level = (
                float(base.dropna().mean())
                if base is not None and base.notna().any()
                else (0.5 if key == "auc" else 0.01)
            )
            ax.axhline(level, color="grey", linestyle=":", label="random guess")
            if key == "tpr@1%fpr":
                ax.set_yscale("symlog", linthresh=1e-3)
                ax.set_ylim(0, 1.05)
            ax.set_title(f"{name}: {label}", fontsize=9)
            ax.set_ylabel(label)
            _set_eps_ticks(ax, eps)
            ax.set_xlabel("")
            ax.tick_params(axis="x", labelsize=7)
    _legend(fig, axes, loc="outside lower center", ncol=5)
    fig.suptitle("Attack success vs epsilon (bars: seed range and 95% bootstrap intervals)")
    return fig, None


def _draw_epsilon_audit(frame: Any) -> tuple[Any, str | None]:
    import matplotlib.pyplot as plt

    if "epsilon_lower_bound" not in frame or frame["epsilon_lower_bound"].isna().all():
        return None, "No empirical epsilon lower bound: the cells were not audited with canaries."
    sub = frame.dropna(subset=["epsilon_lower_bound"])
    models = sorted(set(frame["model"]))
    fig, ax = plt.subplots(figsize=(7, 5.5), layout="constrained")
    finite = sub[np.isfinite(sub["epsilon_spent"])]
    top = float(finite["epsilon_spent"].max()) if not finite.empty else 1.0
    nodp_x = top * 1.25 if not finite.empty else 1.0
    for (model, defense), part in sub.groupby(["model", "defense"], sort=False):
        x = np.where(np.isfinite(part["epsilon_spent"]), part["epsilon_spent"], nodp_x)
        ax.scatter(
            x,
            part["epsilon_lower_bound"],
            color=_color(models, model),
            marker=str(_STYLE.get(defense, {}).get("marker", "o")),
            s=60,
            label=f"{model} · {defense}",
        )
    hi = max(nodp_x, float(sub["epsilon_lower_bound"].max())) * 1.05
    ax.plot([0, hi], [0, hi], color="black", linewidth=1, label="y = x (bound = accounted)")
    ax.axvline(top * 1.12, color="grey", linewidth=0.6, linestyle=":")
    ax.text(nodp_x, 0, "no DP\n(∞)", ha="center", va="bottom", fontsize=8, color="grey")
    ax.set_xlim(0, hi)
    ax.set_ylim(0, hi)
    ax.set_xlabel("accounted epsilon (spent)")
    conf = sub["audit_confidence"].dropna()
    level = f" ({float(conf.iloc[0]):.0%} confidence)" if not conf.empty else ""
    ax.set_ylabel(f"empirical epsilon lower bound{level}")
    ax.set_title("Audit: every point must lie below y = x for a correct accountant")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return fig, None


def roc_curve(scores: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(FPR, TPR) of scores (higher = member) for boolean labels; NaN scores are dropped."""
    s = np.asarray(scores, dtype=np.float64).ravel()
    y = np.asarray(labels, dtype=bool).ravel()
    keep = np.isfinite(s)
    s, y = s[keep], y[keep]
    order = np.argsort(-s, kind="stable")
    s, y = s[order], y[order]
    distinct = np.r_[np.nonzero(np.diff(s))[0], s.size - 1] if s.size else np.array([], int)
    tp = np.cumsum(y)[distinct]
    fp = np.cumsum(~y)[distinct]
    tpr = np.r_[0.0, tp / max(int(y.sum()), 1)]
    fpr = np.r_[0.0, fp / max(int((~y).sum()), 1)]
    return fpr, tpr


def _strongest_attack(frame: Any) -> str | None:
    """The attack with the highest mean AUC over the rows where it ran."""
    best, best_auc = None, -math.inf
    for name in _attack_names(frame):
        auc = float(frame[f"{name}:auc"].mean())
        if auc > best_auc:
            best, best_auc = name, auc
    return best


def _shade(cmap: Any, k: int, n: int) -> Any:
    return cmap(0.85 * k / max(1, n - 1))  # stop before viridis' pale yellow end


def _draw_roc(frame: Any) -> tuple[Any, str | None]:
    import matplotlib.pyplot as plt

    seed = frame["seed"].min()
    models = [
        m for m in sorted(set(frame["model"])) if _strongest_attack(frame[frame["model"] == m])
    ]
    if not models:
        return None, "No ROC curves: the cells were not audited."
    fig, axes = plt.subplots(
        1, len(models), figsize=(5.5 * len(models), 5), squeeze=False, layout="constrained"
    )
    cmap = plt.get_cmap("viridis")
    drawn = 0
    lo = 1e-4
    for ax, model in zip(axes[0], models, strict=True):
        rows = frame[frame["model"] == model]
        attack = _strongest_attack(rows)
        assert attack is not None
        sub = rows[rows[f"{attack}:auc"].notna() & (rows["seed"] == seed)]
        eps = sorted(set(sub["epsilon"]))
        for _, row in sub.sort_values(["epsilon", "defense"]).iterrows():
            curve = _load_scores(row["audit_file"], attack)
            if curve is None:
                continue
            fpr, tpr = curve
            k = eps.index(row["epsilon"])
            # FPR 0 cannot sit on a log axis: start every curve at the axis floor, so a
            # perfect attack still shows (as a line at TPR 1).
            ax.plot(
                np.maximum(fpr, lo),
                np.maximum(tpr, lo),
                color=_shade(cmap, k, len(eps)),
                linestyle="--" if row["secagg"] else "-",
                linewidth=3.0 - 1.8 * k / max(1, len(eps) - 1),  # identical curves stay visible
                label=f"ε {_eps_text(row['epsilon']).splitlines()[0]} · {row['defense']}",
            )
            drawn += 1
        ax.plot([lo, 1], [lo, 1], color="grey", linestyle=":", label="random guess")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(lo, 1)
        ax.set_ylim(lo, 1.6)
        ax.set_xlabel("false positive rate")
        ax.set_ylabel("true positive rate")
        ax.set_title(f"{model}: strongest attack {attack}")
        ax.grid(True, which="both", alpha=0.2)
        ax.legend(fontsize=7, loc="lower right")
    if drawn == 0:
        plt.close(fig)
        return None, "No ROC curves: the audits wrote no per-pair scores."
    fig.suptitle(f"ROC (log-log) of each model's strongest attack, per epsilon (seed {seed})")
    return fig, None


def _load_scores(audit_file: str, attack: str) -> tuple[np.ndarray, np.ndarray] | None:
    if not audit_file:
        return None
    path = Path(audit_file)
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
        scores_path = path.parent / report.get("scores_file", "scores.npz")
        with np.load(scores_path) as z:
            if attack not in z.files or "labels" not in z.files:
                return None
            return roc_curve(z[attack], z["labels"])
    except (OSError, ValueError, KeyError):
        return None


def _float_or_nan(value: Any) -> float:
    """A number of ``audit.json`` (``null``: not a finite number, or absent) as a float."""
    return math.nan if value is None else float(value)


def _union_curves(frame: Any) -> list[tuple[str, float, str, list[int], list[float]]]:
    curves = []
    for _, row in frame.iterrows():
        if not row.get("audited") or not row.get("audit_file"):
            continue
        try:
            report = json.loads(Path(row["audit_file"]).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        for a in report.get("attacks", []):
            by_k = (a.get("metrics") or {}).get("by_cohort_size")
            if a.get("name") == "union" and isinstance(by_k, dict) and by_k:
                ks = sorted(int(k) for k in by_k)
                aucs = [_float_or_nan(by_k[str(k)].get("auc")) for k in ks]
                curves.append((row["model"], row["epsilon"], row["defense"], ks, aucs))
    return curves


def _draw_secagg(frame: Any) -> tuple[Any, str | None]:
    import matplotlib.pyplot as plt

    sa = frame.dropna(subset=["secagg_seconds_per_round"])
    curves = _union_curves(frame[frame["seed"] == frame["seed"].min()])
    if sa.empty and not curves:
        return None, "No secure aggregation cells and no union-leak curve to draw."
    n = 1 + bool(curves) if not sa.empty else 1
    fig, axes = plt.subplots(1, n, figsize=(6.5 * n, 4.8), squeeze=False, layout="constrained")
    models = sorted(set(frame["model"]))
    k = 0
    if not sa.empty:
        ax = axes[0][k]
        k += 1
        groups = sa.groupby(["model", "defense", "epsilon"])
        labels, plain, secure = [], [], []
        for (model, defense, e), part in groups:
            labels.append(f"{model}\n{defense} ε={_eps_text(e).splitlines()[0]}")
            secure.append(float(part["secagg_seconds_per_round"].mean()))
            plain.append(
                float((part["seconds_per_round"] - part["secagg_seconds_per_round"]).mean())
            )
        x = np.arange(len(labels))
        ax.bar(x, plain, color="#bbbbbb", label="rest of the round (local training, server)")
        ax.bar(x, secure, bottom=plain, color="#1f77b4", label="secure aggregation")
        for xi, p, s in zip(x, plain, secure, strict=True):
            ax.text(
                xi,
                p + s,
                f"{s:.0f}s" if s >= 10 else f"{s:.2g}s",
                ha="center",
                va="bottom",
                fontsize=8,
            )
        ax.set_xticks(x)
        ax.set_xticklabels(labels, fontsize=7)
        ax.set_ylabel("seconds per round (mean over rounds and seeds)")
        ax.set_title("Cost of secure aggregation per round")
        ax.legend(fontsize=8)
        ax.grid(True, axis="y", alpha=0.3)
    if curves:
        ax = axes[0][k]
        eps_all = sorted({c[1] for c in curves})
        cmap = plt.get_cmap("viridis")
        for model, e, defense, ks, aucs in curves:
            ax.plot(
                ks,
                aucs,
                marker="o",
                color=_shade(cmap, eps_all.index(e), len(eps_all)),
                linestyle=LINESTYLES[models.index(model) % len(LINESTYLES)],
                label=f"{model} · {defense} ε={_eps_text(e).splitlines()[0]}",
            )
        ax.axhline(0.5, color="grey", linestyle=":", label="random guess")
        ax.set_xscale("log")
        ax.set_xlabel("clients summed (k)")
        ax.set_ylabel("membership AUC from the sum")
        ax.set_title("Union leak: what a sum of k uploads reveals")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    return fig, None


_DRAW: dict[str, Callable[[Any], tuple[Any, str | None]]] = {
    "frontier": _draw_frontier,
    "attacks": _draw_attacks,
    "epsilon_audit": _draw_epsilon_audit,
    "roc": _draw_roc,
    "secagg": _draw_secagg,
}


def draw_figures(frame: Any, folder: Path) -> tuple[dict[str, Path], list[str]]:
    """Draw every figure that the results allow into ``folder`` as PNG and SVG.

    Returns:
        ``({name: png path}, [notes on the figures that were left out and why])``.
    """
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    figures: dict[str, Path] = {}
    notes: list[str] = []
    with plt.rc_context({"font.size": 9, "svg.hashsalt": "securefed", "svg.fonttype": "none"}):
        models, _ = _split_roles(frame)
        for name, draw in _DRAW.items():
            # Centralized references have no uploads, audit or secure rounds: only the
            # frontier draws them (as reference lines).
            fig, note = draw(frame if name == "frontier" else models)
            if fig is None:
                if note:
                    notes.append(note)
                continue
            png = folder / f"{name}.png"
            fig.savefig(png, dpi=110)
            fig.savefig(folder / f"{name}.svg", metadata={"Date": None})
            plt.close(fig)
            figures[name] = png
    return figures, notes
