"""Attribute inference from uploads.

Zhang et al., "Comprehensive Privacy Analysis on Federated Recommender System against
Attribute Inference Attacks" (IEEE TKDE 2023), Sec. 4: the server knows a sensitive attribute
(gender, age) for a fraction of users and trains a classifier that maps a client's uploads to
the attribute, then applies it to everyone else. The feature of a client here is what the
upload attacks already extract: its per-item interaction profile (the gradient-ratio label
scores summed over the rounds it took part in, L2-normalised), so the classifier learns which
items reveal the attribute. The classifier is an L2-regularised (multinomial) logistic
regression fitted with L-BFGS.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from attacks.metrics import classification_metrics

__all__ = ["attribute_inference"]


def _fit_predict(
    x_train: np.ndarray, y_train: np.ndarray, x_test: np.ndarray, n_classes: int, l2: float
) -> np.ndarray:
    xt = torch.from_numpy(x_train).double()
    yt = torch.from_numpy(y_train).long()
    w = torch.zeros(xt.shape[1], n_classes, dtype=torch.float64, requires_grad=True)
    b = torch.zeros(n_classes, dtype=torch.float64, requires_grad=True)
    counts = torch.bincount(yt, minlength=n_classes).double().clamp_min(1)
    weight = (counts.sum() / (n_classes * counts)).to(torch.float64)  # balanced classes
    opt = torch.optim.LBFGS([w, b], lr=1.0, max_iter=200, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        opt.zero_grad()
        logits = xt @ w + b
        loss = torch.nn.functional.cross_entropy(logits, yt, weight=weight) + l2 * w.square().sum()
        loss.backward()
        return loss

    opt.step(closure)
    with torch.no_grad():
        return torch.softmax(torch.from_numpy(x_test).double() @ w + b, dim=1).numpy()


def attribute_inference(
    features: np.ndarray,
    labels: np.ndarray,
    *,
    rng: np.random.Generator,
    known_fraction: float = 0.5,
    l2: float = 1e-3,
) -> tuple[dict[str, Any], dict[str, list[float]], dict[str, Any]]:
    """Train on a random ``known_fraction`` of the users, report on the rest.

    ``metrics["constant_scores"]`` says whether every user it reports on got the same class
    probabilities: its AUC is then exactly 1/2 with an interval of width 0, which is no
    measurement (:data:`attacks.results.NO_SIGNAL`).

    Args:
        features: ``[users, f]`` per-client features (rows of unobserved users all NaN).
        labels: ``[users]`` integer attribute (negative = unknown, skipped).
        rng: Draws the labelled subset and the bootstrap.
        known_fraction: Share of users whose attribute the attacker knows.
        l2: Ridge penalty of the classifier.
    """
    ok = np.isfinite(features).all(1) & (labels >= 0)
    idx = np.nonzero(ok)[0]
    x = features[idx]
    x = x / (np.linalg.norm(x, axis=1, keepdims=True) + 1e-12)
    y_raw = labels[idx]
    classes = np.unique(y_raw)
    if classes.size < 2 or idx.size < 10:
        nan = float("nan")
        return ({"auc": nan, "macro_f1": nan, "users": int(idx.size)}, {}, {"auc": 0.5})
    y = np.searchsorted(classes, y_raw)
    perm = rng.permutation(idx.size)
    n_known = max(2, int(round(known_fraction * idx.size)))
    tr, te = perm[:n_known], perm[n_known:]
    proba = _fit_predict(x[tr], y[tr], x[te], classes.size, l2)
    majority = int(np.bincount(y[tr], minlength=classes.size).argmax())
    metrics, ci, baseline = classification_metrics(
        proba, y[te], np.arange(classes.size), majority, rng=rng
    )
    metrics["known_users"] = int(tr.size)
    metrics["classes"] = int(classes.size)
    # Every held-out user scored alike (their profiles all zero or all the same: a private
    # fedals's count rounds upload no factor to recover one from): no signal, not chance.
    metrics["constant_scores"] = bool(proba.size and (proba == proba[0]).all())
    return metrics, ci, baseline
