"""Attack metrics: ROC summaries, bootstrap intervals over users, random baselines.

Membership-style attacks give one score per (user, item) candidate; the ground truth is
whether the item is a training positive of the user. Metrics are pooled over all candidate
pairs of the evaluated users: AUC (Mann-Whitney, ties count one half), TPR at 1 % and 0.1 %
FPR (Carlini et al., "Membership Inference Attacks From First Principles", S&P 2022: the
low-FPR regime is what matters for privacy) and F1 at ``|P|`` (predict the top ``|P|`` pairs
as members, where ``|P|`` is the number of true members; precision = recall = F1 there).

95 % intervals resample *users* with replacement (the unit the privacy claim is about), so
the within-user correlation of the candidates is respected. The bootstrap works on per-user
histograms over global score quantiles, so each resample is one matrix product instead of a
sort of every pair.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = [
    "BinaryMetrics",
    "binary_metrics",
    "classification_metrics",
    "membership_baseline",
    "membership_report",
]

FPR_POINTS = (0.01, 0.001)


@dataclass(frozen=True)
class BinaryMetrics:
    """Point estimates of one attack over pooled (user, item) pairs."""

    auc: float
    tpr_at_1: float
    tpr_at_01: float
    f1: float
    positives: int
    negatives: int

    def as_dict(self) -> dict[str, float]:
        """The metrics as a plain mapping (what ``audit.json`` records)."""
        return {
            "auc": self.auc,
            "tpr@1%fpr": self.tpr_at_1,
            "tpr@0.1%fpr": self.tpr_at_01,
            "f1": self.f1,
        }


def _tpr_at(fpr: np.ndarray, tpr: np.ndarray, target: float) -> float:
    ok = fpr <= target + 1e-12
    return float(tpr[ok].max()) if bool(ok.any()) else 0.0


def binary_metrics(scores: np.ndarray, labels: np.ndarray) -> BinaryMetrics:
    """Exact AUC, TPR at low FPR and F1 at |P| of scores for binary labels (1 = member).

    Args:
        scores: Higher means "more likely a member"; any shape, NaN entries are skipped.
        labels: Booleans of the same shape.
    """
    s = np.asarray(scores).reshape(-1)
    y = np.asarray(labels, dtype=bool).reshape(-1)
    keep = np.isfinite(s)
    # float64 of the candidates only: a [users, items] float32 matrix is not copied whole
    # (9.8 GB at Gowalla's size); the same values either way.
    s, y = s[keep].astype(np.float64), y[keep]
    n_pos, n_neg = int(y.sum()), int((~y).sum())
    if n_pos == 0 or n_neg == 0:
        nan = float("nan")
        return BinaryMetrics(nan, nan, nan, nan, n_pos, n_neg)
    order = np.argsort(-s, kind="stable")
    s_sorted, y_sorted = s[order], y[order]
    # ROC points at distinct thresholds only (ties move together).
    distinct = np.r_[np.nonzero(np.diff(s_sorted))[0], s_sorted.size - 1]
    tps = np.cumsum(y_sorted)[distinct]
    fps = (distinct + 1) - tps
    tpr = np.r_[0.0, tps / n_pos]
    fpr = np.r_[0.0, fps / n_neg]
    auc = float(np.trapezoid(tpr, fpr))
    # F1 at |P|: the top n_pos pairs predicted members; ties at the cut are shared pro rata.
    cut_score = s_sorted[n_pos - 1]
    above = s > cut_score
    at = s == cut_score
    slots = n_pos - int(above.sum())
    tp = float((above & y).sum()) + slots * float((at & y).sum()) / max(int(at.sum()), 1)
    f1 = tp / n_pos
    return BinaryMetrics(
        auc=auc,
        tpr_at_1=_tpr_at(fpr, tpr, 0.01),
        tpr_at_01=_tpr_at(fpr, tpr, 0.001),
        f1=f1,
        positives=n_pos,
        negatives=n_neg,
    )


def membership_baseline(positives: int, negatives: int) -> dict[str, float]:
    """What a random guesser scores: AUC 1/2, TPR = FPR, F1 at |P| = the prevalence."""
    total = positives + negatives
    return {
        "auc": 0.5,
        "tpr@1%fpr": 0.01,
        "tpr@0.1%fpr": 0.001,
        "f1": positives / total if total else float("nan"),
    }


def _hist_metrics(pos: np.ndarray, neg: np.ndarray) -> np.ndarray:
    """AUC, TPR@1 %, TPR@0.1 %, F1@|P| from score histograms ``[R, B]`` (bins high -> low)."""
    n_pos = pos.sum(1, keepdims=True)
    n_neg = neg.sum(1, keepdims=True)
    cp = np.cumsum(pos, 1)
    cn = np.cumsum(neg, 1)
    tpr = np.concatenate([np.zeros_like(n_pos), cp / np.maximum(n_pos, 1)], 1)
    fpr = np.concatenate([np.zeros_like(n_neg), cn / np.maximum(n_neg, 1)], 1)
    auc = np.sum((fpr[:, 1:] - fpr[:, :-1]) * (tpr[:, 1:] + tpr[:, :-1]) / 2, axis=1)
    out = [auc]
    for target in FPR_POINTS:
        ok = fpr <= target + 1e-12
        out.append(np.where(ok, tpr, 0.0).max(1))
    # F1 at |P|: interpolate within the bin where the predicted count reaches n_pos.
    total = np.concatenate([np.zeros_like(n_pos), cp + cn], 1)
    tp = np.concatenate([np.zeros_like(n_pos), cp], 1)
    f1 = np.empty(pos.shape[0])
    for r in range(pos.shape[0]):
        k = int(np.searchsorted(total[r], n_pos[r, 0]))
        k = min(max(k, 1), total.shape[1] - 1)
        lo, hi = total[r, k - 1], total[r, k]
        frac = (n_pos[r, 0] - lo) / (hi - lo) if hi > lo else 1.0
        f1[r] = (tp[r, k - 1] + frac * (tp[r, k] - tp[r, k - 1])) / max(n_pos[r, 0], 1)
    out.append(f1)
    return np.stack(out, 1)


def membership_report(
    scores: np.ndarray,
    labels: np.ndarray,
    *,
    rng: np.random.Generator,
    n_boot: int = 200,
    n_bins: int = 2048,
) -> tuple[dict[str, float], dict[str, list[float]], dict[str, float]]:
    """Point metrics, 95 % user-bootstrap intervals and the random baseline of an attack.

    Args:
        scores: ``[users, items]`` scores; NaN marks pairs that are not candidates.
        labels: ``[users, items]`` booleans, True for training positives.
        rng: Draws the bootstrap resamples.
        n_boot: Bootstrap resamples.
        n_bins: Quantile bins of the bootstrap histograms (interval resolution).

    Returns:
        ``(metrics, ci95, baseline)``; metrics has ``auc``, ``tpr@1%fpr``, ``tpr@0.1%fpr``,
        ``f1``, ``users``, ``positives``, ``negatives``.
    """
    # Kept in its own dtype; each candidate converted to float64 where it is read (the same
    # values as converting the whole matrix, which at Gowalla's size is a 9.8 GB copy).
    s = np.asarray(scores)
    y = np.asarray(labels, dtype=bool)
    cand = np.isfinite(s)
    users = np.nonzero(cand.any(1))[0]
    flat = s[cand].astype(np.float64)
    point = binary_metrics(flat, y[cand])
    metrics: dict[str, float] = {**point.as_dict(), "users": int(users.size)}
    metrics["positives"] = point.positives
    metrics["negatives"] = point.negatives
    baseline = membership_baseline(point.positives, point.negatives)
    keys = ("auc", "tpr@1%fpr", "tpr@0.1%fpr", "f1")
    if users.size < 2 or point.positives == 0 or point.negatives == 0:
        return metrics, {k: [float("nan"), float("nan")] for k in keys}, baseline
    edges = np.unique(np.quantile(flat, np.linspace(0, 1, n_bins + 1)[1:-1]))
    # Bin index counted from the top score down, so cumulative sums walk the ROC.
    n_b = edges.size + 1
    pos_h = np.zeros((users.size, n_b))
    neg_h = np.zeros((users.size, n_b))
    for row, u in enumerate(users):
        su, yu = s[u, cand[u]].astype(np.float64), y[u, cand[u]]
        b = n_b - 1 - np.searchsorted(edges, su, side="right")
        pos_h[row] = np.bincount(b[yu], minlength=n_b)
        neg_h[row] = np.bincount(b[~yu], minlength=n_b)
    weights = rng.multinomial(users.size, np.full(users.size, 1.0 / users.size), size=n_boot)
    boot = _hist_metrics(weights @ pos_h, weights @ neg_h)
    # The resamples are scored on binned histograms, the point exactly; binning biases every
    # statistic the same way in every resample (ties within a bin count half, a bin that
    # straddles an FPR target is left out), so the bootstrap distribution is moved by the
    # full sample's binning error: the interval is then one for the exact statistic, around
    # the point it is printed with (an AUC of 1.000 with the interval [0.997, 0.998] was
    # the binned one's).
    binned = _hist_metrics(pos_h.sum(0, keepdims=True), neg_h.sum(0, keepdims=True))[0]
    exact = np.array([metrics[k] for k in keys])
    boot = np.clip(boot + (exact - binned), 0.0, 1.0)
    lo, hi = np.nanpercentile(boot, [2.5, 97.5], axis=0)
    ci = {k: [float(lo[j]), float(hi[j])] for j, k in enumerate(keys)}
    return metrics, ci, baseline


def _auc(scores: np.ndarray, labels: np.ndarray) -> float:
    return binary_metrics(scores, labels).auc


def _macro_f1(pred: np.ndarray, truth: np.ndarray, classes: np.ndarray) -> float:
    f1s = []
    for c in classes:
        tp = float(((pred == c) & (truth == c)).sum())
        fp = float(((pred == c) & (truth != c)).sum())
        fn = float(((pred != c) & (truth == c)).sum())
        f1s.append(2 * tp / (2 * tp + fp + fn) if tp + fp + fn > 0 else 0.0)
    return float(np.mean(f1s))


def classification_metrics(
    proba: np.ndarray,
    truth: np.ndarray,
    classes: np.ndarray,
    majority: int,
    *,
    rng: np.random.Generator,
    n_boot: int = 200,
) -> tuple[dict[str, float], dict[str, list[float]], dict[str, float]]:
    """AUC (one-vs-rest macro for more than two classes) and macro-F1, with bootstrap CIs.

    Args:
        proba: ``[n, k]`` predicted class probabilities (columns follow ``classes``).
        truth: ``[n]`` true class labels.
        classes: The ``k`` class labels.
        majority: The training set's majority class (the baseline always predicts it).
        rng: Draws the bootstrap resamples over users.
        n_boot: Bootstrap resamples.
    """

    def compute(idx: np.ndarray) -> tuple[float, float]:
        p, t = proba[idx], truth[idx]
        aucs = [_auc(p[:, j], t == c) for j, c in enumerate(classes) if 0 < (t == c).sum() < t.size]
        auc = float(np.mean(aucs)) if aucs else float("nan")
        pred = classes[np.argmax(p, 1)]
        return auc, _macro_f1(pred, t, classes)

    all_idx = np.arange(truth.size)
    auc, f1 = compute(all_idx)
    boots = np.array([compute(rng.integers(0, truth.size, truth.size)) for _ in range(n_boot)])
    lo, hi = np.nanpercentile(boots, [2.5, 97.5], axis=0)
    base_f1 = _macro_f1(np.full(truth.size, majority), truth, classes)
    metrics = {"auc": auc, "macro_f1": f1, "users": int(truth.size)}
    ci = {"auc": [float(lo[0]), float(hi[0])], "macro_f1": [float(lo[1]), float(hi[1])]}
    baseline = {"auc": 0.5, "macro_f1": base_f1, "note": "majority class of the labelled users"}
    return metrics, ci, baseline  # type: ignore[return-value]


def wilson_halfwidth(p: float, n: int, z: float = 1.96) -> float:
    """Half-width of a normal-approximation interval for a proportion (for docs and tests)."""
    return z * math.sqrt(max(p * (1 - p), 1e-12) / max(n, 1))
