"""Turn recorded attack statistics into scored results (metrics, intervals, baselines)."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from attacks.attribute import attribute_inference
from attacks.canaries import Canaries, clopper_pearson_bound, one_run_bound
from attacks.imia import SHADOWS
from attacks.metrics import binary_metrics, membership_report
from attacks.registry import AttackSpec, RecorderGroup, ScoreContext, attack_names, get_attack
from attacks.released import FITS
from attacks.results import NO_SIGNAL, RELEASE_NOTE, RELEASED_FILE, AttackResult, AuditConfig
from attacks.rows import observer_hooks
from attacks.threat import ThreatModel
from protocols.seeding import numpy_generator

if TYPE_CHECKING:
    from securefed.config import TrainConfig
    from securefed.data.types import Split

__all__ = ["score_attacks", "membership_labels"]

# ThreatModel is a StrEnum: each member is its string too (AttackResult.threat_model).
_UP = ThreatModel.UPLOAD_OBSERVER
_AGG = ThreatModel.AGGREGATE_OBSERVER
_REL = ThreatModel.RELEASE_OBSERVER
_OBSERVES: dict[str, str] = {_UP: "upload", _AGG: "aggregate", _REL: "release"}


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


class _Recorded(dict[str, np.ndarray]):
    """The recorder's accumulators for the scorers: a ``[users, items]`` table the audit did
    not record is absent, and asking for it says which ``AttackSpec.reads`` records it (an
    attack that forgot to declare it scored empty tables as 'nothing to score', found in a
    walkthrough)."""

    def __missing__(self, key: str) -> np.ndarray:
        from attacks.recorder import RECORDER_TABLES

        group = next((g for g, tables in RECORDER_TABLES.items() if key in tables), None)
        if group is None:
            raise KeyError(f"the recorder keeps no statistic {key!r}")
        raise KeyError(
            f"{key!r} is not recorded in this audit: the recorder keeps it for attacks whose "
            f"AttackSpec.reads includes {group!r}"
        )


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
    prior_scores: np.ndarray | None = None,
) -> tuple[list[AttackResult], dict[str, np.ndarray], dict[str, Any] | None]:
    """Score every chosen attack and the canary audit.

    ``prior_scores`` are the canaries' statistics on the popularity prior's release
    (:mod:`attacks.prior`) when the run has one; the audit then bounds each release kind.

    Returns:
        ``(results, score arrays for scores.npz, audit block or None)``.
    """

    # The canary audit's bootstrap stream (each attack draws its own below).
    rng = numpy_generator(train_cfg.seed, "audit-bootstrap")
    # Real users only: canary clients (appended after them) are the audit's, not the data's.
    acc = _Recorded(
        (k, v if k == "canary_score" else v[:n_real_users])
        for k, v in acc.items()
        if v.ndim >= 1 and not (v.ndim == 2 and v.size == 0)  # a table no chosen attack reads
    )
    labels = membership_labels(split, n_real)[:n_real_users]
    arrays: dict[str, np.ndarray] = {"labels": labels}
    ctx = ScoreContext(
        acc=acc,
        labels=labels,
        rng=rng,
        arrays=arrays,
        record_dir=record_dir,
        split=split,
        n_real=n_real,
        n_real_users=n_real_users,
        targets=targets,
        union_by_k=union_by_k,
        train_cfg=train_cfg,
        cfg=cfg,
    )
    results: list[AttackResult] = []
    for name in attack_names():  # report order
        if name not in chosen:
            continue
        started = time.perf_counter()
        # Each attack's own bootstrap stream: its intervals do not depend on which other
        # attacks ran before it (found in a walkthrough: the same AUC, two intervals).
        own = dataclasses.replace(ctx, rng=numpy_generator(train_cfg.seed, "audit-bootstrap", name))
        scored = get_attack(name).score(own)
        if isinstance(scored, AttackResult):  # one result given as itself
            scored = [scored]
        share = (time.perf_counter() - started) / max(1, len(scored))
        results += [dataclasses.replace(r, seconds=share) for r in scored]
    audit_block = None
    if canaries is not None:
        audit_block = _audit(
            acc["canary_score"], canaries, train_cfg, cfg, summary, rng, prior_scores
        )
        arrays["canary_scores"] = acc["canary_score"]
        arrays["canary_included"] = canaries.included
        if prior_scores is not None:
            arrays["canary_prior_scores"] = prior_scores

    views = {"release": RELEASE_NOTE, **observes}
    results = [
        dataclasses.replace(r, observes=views.get(_OBSERVES[r.threat_model], "")) for r in results
    ]
    return results, arrays, audit_block


def _row_change(ctx: ScoreContext) -> list[AttackResult]:
    note = (
        "one upload (each user's first round): changed item rows are its positives and that "
        "round's negatives"
    )
    return [ctx.membership("row-change", ctx.acc["first_change"], _UP, note)]


def _intersection(ctx: ScoreContext) -> list[AttackResult]:
    acc, observed = ctx.acc, ctx.acc["observed"]
    frac = _per_round(acc["touched_count"], observed)
    mean_change = _per_round(acc["change_sum"], observed)
    tie = mean_change / (np.nanmax(mean_change) + 1e-30) * 1e-3
    return [
        ctx.membership(
            "intersection",
            frac + tie,
            _UP,
            "fraction of a user's observed rounds in which the row changed (positives every "
            "round, negatives resampled); ties broken by the mean row change",
            rounds_observed_mean=float(observed[observed > 0].mean())
            if (observed > 0).any()
            else 0.0,
        )
    ]


def _gradient_ratio(ctx: ScoreContext) -> list[AttackResult]:
    acc, labels, rng, nb = ctx.acc, ctx.labels, ctx.rng, ctx.n_boot
    observed = acc["observed"]
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
    ctx.arrays["gradient-ratio"] = acc["first_label"].astype(np.float32)
    return [
        AttackResult(
            "gradient-ratio",
            _UP,
            metrics,
            ci,
            base,
            "inversion from one upload (each user's first that carries its private "
            "direction; a fedals count round carries none): recovered items (signed "
            "projections) and the recovered private embedding (FedRAP: scorer w_u; "
            "FedRecGEL: GMF p_u; fedals: x_u); the truth is read from the model only to "
            "score",
        )
    ]


def _attribute(ctx: ScoreContext) -> list[AttackResult]:
    feats = _per_round(ctx.acc["label_sum"], ctx.acc["observed"])
    known = ctx.cfg.known_fraction
    out = []
    for attr in ("gender", "age_bucket"):
        if attr not in ctx.split.attributes:
            continue
        metrics, ci, base = attribute_inference(
            feats,
            np.asarray(ctx.split.attributes[attr])[: ctx.n_real_users],
            rng=ctx.rng,
            known_fraction=known,
        )
        note = (
            f"logistic regression on the per-item profile recovered from the uploads, "
            f"{known:.0%} of users' {attr} known to the attacker"
        )
        if metrics.get("constant_scores"):
            note += (
                f"; {NO_SIGNAL} (every user's profile gave the same prediction: the uploads "
                "carry no per-user profile to classify), so its AUC 0.500 measures nothing"
            )
        out.append(AttackResult(f"attribute-{attr}", _UP, metrics, ci, base, note))
    return out


def _union(ctx: ScoreContext) -> list[AttackResult]:
    scores = _per_round(ctx.acc["union_sum"], ctx.acc["union_obs"])
    return [
        ctx.membership(
            "union",
            scores,
            _AGG,
            "row statistic of each round's aggregate, scored for every participant: the union "
            "of the cohort's changed rows; by_cohort_size simulates sums of k round-0 uploads",
            by_cohort_size={str(k): v for k, v in sorted(ctx.union_by_k.items())},
        )
    ]


def _differencing(ctx: ScoreContext) -> list[AttackResult]:
    return [
        ctx.membership(
            "differencing",
            ctx.acc["diff_change"],
            _AGG,
            "two sums differing by one client (round 0): their difference is that client's "
            "clipped upload plus two draws of the sum's noise; row-change test on it",
        )
    ]


def _imia(ctx: ScoreContext) -> list[AttackResult]:
    """IMIA scores over every catalogue item of the attacked users: its shadow score on the
    rows the upload touched, below every touched row elsewhere (an untouched row is never a
    training positive)."""
    acc, labels, rng, nb = ctx.acc, ctx.labels, ctx.rng, ctx.n_boot
    raw = acc["imia_score"]  # NaN outside the attacked users' touched rows
    attacked = np.nonzero(acc["imia_round"] >= 0)[0]
    # Built from the attacked users' rows only: no [users, items] temporaries beside the
    # result (three 4.9 GB copies at Gowalla's size).
    sub = raw[attacked]
    touched = np.isfinite(sub)
    floor = float(np.nanmin(sub)) - 1.0 if touched.any() else 0.0
    scores = np.full(raw.shape, np.nan, dtype=np.float32)
    scores[attacked] = np.where(touched, sub, np.float32(floor))
    del sub, touched
    metrics, ci, base = membership_report(scores, labels, rng=rng, n_boot=nb)
    # The shadow's own contribution: telling positives from negatives among touched rows.
    within, within_ci, _ = membership_report(raw, labels, rng=rng, n_boot=nb)
    metrics.update(
        {
            "touched_auc": within["auc"],
            "touched_tpr@1%fpr": within["tpr@1%fpr"],
            "touched_f1": within["f1"],
            "touched_positives": within["positives"],
            "touched_negatives": within["negatives"],
            "first_round_mean": float(acc["imia_round"][attacked].mean())
            if attacked.size
            else float("nan"),
        }
    )
    ci["touched_auc"] = within_ci["auc"]
    base["touched_auc"] = 0.5
    ctx.arrays["imia"] = scores
    return [
        AttackResult(
            "imia",
            _UP,
            metrics,
            ci,
            base,
            "shadow training (Yuan et al. WWW 2023) on each user's first observed upload: "
            "fresh private part, guessed labels refined by the distance between the shadow's "
            "and the real item-row updates; touched_* = among the rows the upload changed",
        )
    ]


def _participated(record_dir: Path, n_users: int) -> np.ndarray:
    seen = np.zeros(n_users, dtype=bool)
    for path in sorted(record_dir.glob("round_*.npz")):
        with np.load(path) as z:
            part = z["participants"]
        seen[part[part < n_users]] = True
    return seen


def _released(ctx: ScoreContext) -> list[AttackResult]:
    from attacks.released import released_labels, released_scores
    from protocols.seeding import torch_generator
    from securefed.errors import DataError

    record_dir, split, train_cfg = ctx.record_dir, ctx.split, ctx.train_cfg
    n_real, n_real_users = ctx.n_real, ctx.n_real_users

    path = record_dir / RELEASED_FILE
    if not path.exists():
        raise DataError(f"the released model {path} is missing; audit the run again")
    released = torch.load(path, weights_only=True)
    participated = _participated(record_dir, n_real_users)
    labels = released_labels(split, n_real, n_real_users, participated)
    calibrated, raw, info = released_scores(
        train_cfg.model,
        train_cfg,
        released,
        split,
        n_real=n_real,
        n_users=n_real_users,
        generator=torch_generator(train_cfg.seed, "audit-released"),
        iterations=ctx.cfg.released_iterations,
    )
    metrics, ci, base = membership_report(calibrated, labels, rng=ctx.rng, n_boot=ctx.n_boot)
    uncal = binary_metrics(raw, labels)
    metrics.update(
        {
            "uncalibrated_auc": uncal.auc,
            "uncalibrated_tpr@1%fpr": uncal.tpr_at_1,
            "participating_users": int(participated.sum()),
            **info,
        }
    )
    ctx.arrays["released"] = calibrated
    ctx.arrays["released_labels"] = labels
    return [
        AttackResult(
            "released",
            _REL,
            metrics,
            ci,
            base,
            "fresh private part fitted to all of a user's known interactions against the "
            "frozen released model, logit minus the item's mean logit over reference users; "
            "members = training positives of participating users, non-members = held-out "
            "validation/test items and the items of users who never took part",
        )
    ]


def _optimization(ctx: ScoreContext) -> list[AttackResult]:
    from attacks.inversion import invert_fedrecgel

    targets, labels, rng, nb = ctx.targets, ctx.labels, ctx.rng, ctx.n_boot

    scores = np.full(labels.shape, np.nan, dtype=np.float32)
    cos = np.full(labels.shape[0], np.nan)
    # A recording made before the recorder left canary clients out could target them: their
    # rows are not scored (the score matrices hold the real users).
    targets = [u for u in targets if u < labels.shape[0]]
    for u in targets:
        rec = torch.load(ctx.record_dir / f"target_{u}.pt", weights_only=True)
        out = invert_fedrecgel(rec, seed=u)
        row = np.full(rec["n_items"], -1e9, dtype=np.float32)  # unchanged rows: non-members
        row[out["items"].numpy()] = out["label_scores"].float().numpy()
        scores[u] = row[: ctx.n_real]
        truth = rec["truth_embedding"].float()
        cos[u] = float(torch.nn.functional.cosine_similarity(out["embedding"], truth, dim=0))
    metrics, ci, base = membership_report(scores, labels, rng=rng, n_boot=nb)
    c, c_ci = _mean_ci(cos, rng, nb)
    metrics["embedding_cosine"] = c
    ci["embedding_cosine"] = c_ci
    base["embedding_cosine"] = 0.0
    ctx.arrays["optimization"] = scores
    return [
        AttackResult(
            "optimization",
            _UP,
            metrics,
            ci,
            base,
            f"gradient matching with L-BFGS on {len(targets)} target uploads (first round of each)",
        )
    ]


_UPLOAD: tuple[RecorderGroup, ...] = ("upload",)
#: The released-model attack, in (estimated) full-ranking evaluations of the model per
#: iteration (``AuditConfig.released_iterations``): 1.36 (FedRAP) and 0.93 (FedRecGEL).
_RELEASED_EVALS_PER_ITERATION = 1.4
#: The optimization attack (gradient matching), in (estimated) full-ranking evaluations per
#: target user (``AuditConfig.target_users``): 0.16 measured for FedRecGEL.
_OPTIMIZATION_EVALS_PER_TARGET = 0.3
#: The built-in attacks (:mod:`attacks.registry` names this module for each).
SPECS: dict[str, AttackSpec] = {
    s.name: s
    for s in (
        AttackSpec(name="row-change", threat=_UP, score=_row_change, reads=_UPLOAD),
        AttackSpec(name="intersection", threat=_UP, score=_intersection, reads=_UPLOAD),
        AttackSpec(name="gradient-ratio", threat=_UP, score=_gradient_ratio, reads=_UPLOAD),
        AttackSpec(
            name="optimization",
            threat=_UP,
            score=_optimization,
            reads=("upload", "targets"),
            full_evals=lambda cfg: _OPTIMIZATION_EVALS_PER_TARGET * cfg.target_users,
        ),
        # A classifier over users: no [users, items] score matrix.
        AttackSpec(name="attribute", threat=_UP, score=_attribute, reads=_UPLOAD, score_matrices=0),
        AttackSpec(name="imia", threat=_UP, score=_imia, reads=("imia",), models=tuple(SHADOWS)),
        AttackSpec(name="union", threat=_AGG, score=_union, reads=("union",)),
        AttackSpec(name="differencing", threat=_AGG, score=_differencing, reads=("differencing",)),
        AttackSpec(
            name="released",
            threat=_REL,
            score=_released,
            reads=("release",),
            models=tuple(FITS),
            label_matrices=1,
            full_evals=lambda cfg: _RELEASED_EVALS_PER_ITERATION * cfg.released_iterations,
        ),
    )
}


def canary_significance(cfg: AuditConfig, *, prior: bool) -> float:
    """The significance each canary bound is computed at: ``1 - confidence``, halved for a
    run with a popularity prior (two statistics, Bonferroni) and halved again between the
    Clopper-Pearson and one-run bounds (:func:`_audit`)."""
    return (1.0 - cfg.confidence) / (2.0 if prior else 1.0) / 2.0


def _audit(
    scores: np.ndarray,
    canaries: Canaries,
    train_cfg: TrainConfig,
    cfg: AuditConfig,
    summary: dict[str, Any],
    rng: np.random.Generator,
    prior_scores: np.ndarray | None = None,
) -> dict[str, Any]:
    """The canary bounds. One statistic (the rounds') at significance ``alpha``; with a
    popularity prior, the rounds' and the prior's, each at ``alpha / 2`` (Bonferroni), and
    the larger bound is the audit's; within a statistic Clopper-Pearson and one-run split its
    level in two as well."""
    delta = train_cfg.privacy.delta if train_cfg.privacy.dp else 0.0
    stats = (
        {"rounds": scores} if prior_scores is None else {"rounds": scores, "prior": prior_scores}
    )
    level = 2.0 * canary_significance(cfg, prior=prior_scores is not None)
    releases: dict[str, dict[str, Any]] = {}
    for name, s in stats.items():
        cp = clopper_pearson_bound(s, canaries.included, delta=delta, alpha=level / 2, rng=rng)
        one, detail = one_run_bound(s, canaries.included, delta=delta, alpha=level / 2)
        releases[name] = {
            "epsilon_lower_bound": max(cp, one),
            "clopper_pearson": cp,
            "one_run": one,
            "one_run_guesses": detail,
            "canary_auc": binary_metrics(s, canaries.included).auc,
            "confidence": 1.0 - level,
        }
    best = max(releases, key=lambda n: releases[n]["epsilon_lower_bound"])
    top = releases[best]
    attack = (
        "zero-out canaries (a planted positive of a random host, a null example with "
        "probability 1/2): the canary item's row of the host's own upload projected on the "
        "direction its positive would push it (FedRAP: the host's first round only)"
        if canaries.unit == "interaction"
        else "known-others test on every round's released sum: subtract the other "
        "participants' clipped uploads, project the canary item's coordinates on the direction "
        "its positive pushes them (FedRAP, FedRecGEL: from the canary's private vector; "
        "fedals: the canary's own contribution)"
    )
    if prior_scores is not None:
        attack += (
            "; and on the popularity prior's release: the canary item's released count minus "
            "the other users' contributions (a bound from each, Bonferroni)"
        )
    return {
        "epsilon_lower_bound": top["epsilon_lower_bound"],
        "confidence": cfg.confidence,
        "method": (
            "max of Clopper-Pearson (Jagielski et al. 2020) and one-run (Steinke, Nasr, "
            "Jagielski 2023) bounds, each at confidence 1 - alpha/2 (Bonferroni)"
            + (
                "; per release kind (rounds, prior) at alpha/2 each"
                if prior_scores is not None
                else ""
            )
        ),
        "clopper_pearson": top["clopper_pearson"],
        "one_run": top["one_run"],
        "one_run_guesses": top["one_run_guesses"],
        "canaries": canaries.size,
        "unit": canaries.unit,
        "included": int(canaries.included.sum()),
        "canary_auc": top["canary_auc"],
        "bound_from": best,
        "releases": releases,
        "threat_model": _UP if canaries.unit == "interaction" else _AGG,
        "attack": attack,
        "accounted_epsilon": summary.get("epsilon"),
        # With Poisson cohorts the test knows which rounds a canary took part in (and whom
        # to subtract): the guarantee against that adversary is the unamplified one. Not for
        # a model whose test projects on the canary's own contribution (fedals): that score
        # is distributed as one using the canary's would-be push every round, which needs no
        # knowledge of its own sampling, so the amplified epsilon is the yardstick (review).
        "accounted_epsilon_unamplified": (
            None
            if observer_hooks(train_cfg.model).canary_own_direction
            else summary.get("epsilon_unamplified")
        ),
        "delta": delta,
    }
