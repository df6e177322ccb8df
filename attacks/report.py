"""Turn recorded attack statistics into scored results (metrics, intervals, baselines)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from attacks.attribute import attribute_inference
from attacks.canaries import Canaries, clopper_pearson_bound, one_run_bound
from attacks.metrics import binary_metrics, membership_report
from attacks.threat import ThreatModel
from protocols.seeding import numpy_generator

if TYPE_CHECKING:
    from securefed.audit import AttackResult, AuditConfig
    from securefed.data.types import Split
    from securefed.training import TrainConfig

__all__ = ["score_attacks", "membership_labels"]

_UP = ThreatModel.UPLOAD_OBSERVER.value
_AGG = ThreatModel.AGGREGATE_OBSERVER.value


def membership_labels(split: Split, n_real: int) -> np.ndarray:
    """``[users, n_real]`` booleans: True where the item is a training positive."""
    labels = np.zeros((split.n_users, n_real), dtype=bool)
    users = split.train_users()
    items = split.train_items
    keep = items < n_real
    labels[users[keep], items[keep]] = True
    return labels


def _per_round(total: np.ndarray, count: np.ndarray) -> np.ndarray:
    out = np.full(total.shape, np.nan, dtype=np.float32)
    seen = count > 0
    out[seen] = total[seen] / count[seen, None]
    return out


def _mean_ci(
    values: np.ndarray, rng: np.random.Generator, n_boot: int
) -> tuple[float, list[float]]:
    v = values[np.isfinite(values)]
    if v.size == 0:
        return float("nan"), [float("nan"), float("nan")]
    boots = [float(v[rng.integers(0, v.size, v.size)].mean()) for _ in range(n_boot)]
    lo, hi = np.percentile(boots, [2.5, 97.5])
    return float(v.mean()), [float(lo), float(hi)]


def score_attacks(
    *,
    chosen: list[str],
    acc: dict[str, np.ndarray],
    union_by_k: dict[int, dict[str, Any]],
    targets: list[int],
    record_dir: Path,
    split: Split,
    n_real: int,
    n_real_users: int,
    train_cfg: TrainConfig,
    canaries: Canaries | None,
    cfg: AuditConfig,
    summary: dict[str, Any],
    observes: dict[str, str],
) -> tuple[list[AttackResult], dict[str, np.ndarray], dict[str, Any] | None]:
    """Score every chosen attack and the canary audit.

    Returns:
        ``(results, score arrays for scores.npz, audit block or None)``.
    """
    from securefed.audit import AttackResult

    rng = numpy_generator(train_cfg.seed, "audit-bootstrap")
    # Real users only: canary clients (appended after them) are the audit's, not the data's.
    acc = {k: v if k == "canary_score" else v[:n_real_users] for k, v in acc.items() if v.ndim >= 1}
    labels = membership_labels(split, n_real)[:n_real_users]
    arrays: dict[str, np.ndarray] = {"labels": labels}
    results: list[AttackResult] = []
    nb = cfg.bootstrap
    observed = acc["observed"]

    def membership(name: str, scores: np.ndarray, threat: str, note: str, **extra: Any) -> None:
        metrics, ci, base = membership_report(scores, labels, rng=rng, n_boot=nb)
        metrics.update(extra)
        arrays[name] = scores.astype(np.float32)
        results.append(AttackResult(name, threat, metrics, ci, base, note))

    if "row-change" in chosen:
        membership(
            "row-change",
            acc["first_change"],
            _UP,
            "one upload (each user's first round): changed item rows are its positives and "
            "that round's negatives",
        )
    if "intersection" in chosen:
        frac = _per_round(acc["touched_count"], observed)
        mean_change = _per_round(acc["change_sum"], observed)
        tie = mean_change / (np.nanmax(mean_change) + 1e-30) * 1e-3
        membership(
            "intersection",
            frac + tie,
            _UP,
            "fraction of a user's observed rounds in which the row changed (positives every "
            "round, negatives resampled); ties broken by the mean row change",
            rounds_observed_mean=float(observed[observed > 0].mean())
            if (observed > 0).any()
            else 0.0,
        )
    if "gradient-ratio" in chosen:
        cos, cos_ci = _mean_ci(acc["cos_embedding"], rng, nb)
        dcos, dcos_ci = _mean_ci(acc["cos_direction"], rng, nb)
        all_rounds = binary_metrics(
            _per_round(acc["label_sum"], observed)[np.isfinite(acc["first_label"])],
            labels[np.isfinite(acc["first_label"])],
        )
        metrics, ci, base = membership_report(acc["first_label"], labels, rng=rng, n_boot=nb)
        metrics.update(
            {
                "embedding_cosine": cos,
                "direction_cosine": dcos,
                "membership_auc_all_rounds": all_rounds.auc,
                "membership_tpr@1%fpr_all_rounds": all_rounds.tpr_at_1,
            }
        )
        ci.update({"embedding_cosine": cos_ci, "direction_cosine": dcos_ci})
        base["embedding_cosine"] = 0.0
        arrays["gradient-ratio"] = acc["first_label"].astype(np.float32)
        results.append(
            AttackResult(
                "gradient-ratio",
                _UP,
                metrics,
                ci,
                base,
                "inversion from one upload: recovered items (signed projections) and the "
                "recovered private embedding (FedRAP: scorer w_u; FedRecGEL: GMF p_u); "
                "the truth is read from the model only to score",
            )
        )
    if "optimization" in chosen:
        results.append(_optimization(targets, record_dir, labels, n_real, rng, nb, arrays))
    if "attribute" in chosen:
        feats = _per_round(acc["label_sum"], observed)
        for attr in ("gender", "age_bucket"):
            if attr not in split.attributes:
                continue
            metrics, ci, base = attribute_inference(
                feats,
                np.asarray(split.attributes[attr])[:n_real_users],
                rng=rng,
                known_fraction=cfg.known_fraction,
            )
            results.append(
                AttackResult(
                    f"attribute-{attr}",
                    _UP,
                    metrics,
                    ci,
                    base,
                    f"logistic regression on the per-item profile recovered from the uploads, "
                    f"{cfg.known_fraction:.0%} of users' {attr} known to the attacker",
                )
            )
    if "union" in chosen:
        scores = _per_round(acc["union_sum"], acc["union_obs"])
        membership(
            "union",
            scores,
            _AGG,
            "row statistic of each round's aggregate, scored for every participant: the union "
            "of the cohort's changed rows; by_cohort_size simulates sums of k round-0 uploads",
            by_cohort_size={str(k): v for k, v in sorted(union_by_k.items())},
        )
    if "differencing" in chosen:
        membership(
            "differencing",
            acc["diff_change"],
            _AGG,
            "two sums differing by one client (round 0): their difference is that client's "
            "clipped upload plus two draws of the sum's noise; row-change test on it",
        )
    audit_block = None
    if canaries is not None:
        audit_block = _audit(acc["canary_score"], canaries, train_cfg, cfg, summary, rng)
        arrays["canary_scores"] = acc["canary_score"]
        arrays["canary_included"] = canaries.included
    results = [
        dataclasses.replace(
            r, observes=observes.get("upload" if r.threat_model == _UP else "aggregate", "")
        )
        for r in results
    ]
    return results, arrays, audit_block


def _optimization(
    targets: list[int],
    record_dir: Path,
    labels: np.ndarray,
    n_real: int,
    rng: np.random.Generator,
    nb: int,
    arrays: dict[str, np.ndarray],
) -> AttackResult:
    from attacks.inversion import invert_fedrecgel
    from securefed.audit import AttackResult

    scores = np.full(labels.shape, np.nan, dtype=np.float32)
    cos = np.full(labels.shape[0], np.nan)
    for u in targets:
        rec = torch.load(record_dir / f"target_{u}.pt", weights_only=True)
        out = invert_fedrecgel(rec, seed=u)
        row = np.full(rec["n_items"], -1e9, dtype=np.float32)  # unchanged rows: non-members
        row[out["items"].numpy()] = out["label_scores"].float().numpy()
        scores[u] = row[:n_real]
        truth = rec["truth_embedding"].float()
        cos[u] = float(torch.nn.functional.cosine_similarity(out["embedding"], truth, dim=0))
    metrics, ci, base = membership_report(scores, labels, rng=rng, n_boot=nb)
    c, c_ci = _mean_ci(cos, rng, nb)
    metrics["embedding_cosine"] = c
    ci["embedding_cosine"] = c_ci
    base["embedding_cosine"] = 0.0
    arrays["optimization"] = scores
    return AttackResult(
        "optimization",
        _UP,
        metrics,
        ci,
        base,
        f"gradient matching with L-BFGS on {len(targets)} target uploads (first round of each)",
    )


def _audit(
    scores: np.ndarray,
    canaries: Canaries,
    train_cfg: TrainConfig,
    cfg: AuditConfig,
    summary: dict[str, Any],
    rng: np.random.Generator,
) -> dict[str, Any]:
    alpha = 1.0 - cfg.confidence
    delta = train_cfg.privacy.delta if train_cfg.privacy.dp else 0.0
    cp = clopper_pearson_bound(scores, canaries.included, delta=delta, alpha=alpha / 2, rng=rng)
    one, detail = one_run_bound(scores, canaries.included, delta=delta, alpha=alpha / 2)
    auc = binary_metrics(scores, canaries.included).auc
    return {
        "epsilon_lower_bound": max(cp, one),
        "confidence": cfg.confidence,
        "method": (
            "max of Clopper-Pearson (Jagielski et al. 2020) and one-run (Steinke, Nasr, "
            "Jagielski 2023) bounds, each at confidence 1 - alpha/2 (Bonferroni)"
        ),
        "clopper_pearson": cp,
        "one_run": one,
        "one_run_guesses": detail,
        "canaries": canaries.size,
        "included": int(canaries.included.sum()),
        "canary_auc": auc,
        "threat_model": _AGG,
        "attack": (
            "known-others test on every round's released sum: subtract the other participants' "
            "clipped uploads, project the canary item's row on the direction its positive "
            "would push it"
        ),
        "accounted_epsilon": summary.get("epsilon"),
        "delta": delta,
    }
