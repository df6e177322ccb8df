"""The yardsticks every result stands next to: random, MostPop and DP-MostPop.

Computed on the run's own split, so a model's HR@10 and its baselines describe the same users
and held-out items:

* **random**: the expected HR@10 / NDCG@10 of uniformly random scores, in closed form (a
  target ranked uniformly among its ``K + 1`` candidates: ``min(k, K + 1) / (K + 1)``).
* **MostPop**: items ranked by their training count (:func:`popularity_counts`).
* **DP-MostPop**: one Gaussian release of the counts at the run's epsilon and delta and unit
  of privacy (user: each user contributes at most :data:`DP_MAX_ITEMS` sampled items, L2
  sensitivity ``sqrt(k)``; interaction: sensitivity 1), noise multiplier from the same
  accountant (one release, sample rate 1).

The baselines are reference numbers for the reader, computed from the same private data: they
are not part of the run's releases and are **not charged to the run's budget**; their noise is
drawn from the run seed (purpose ``baseline-dp-mostpop``) so the yardstick is reproducible.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from protocols.dp import calibrate_noise_multiplier
from protocols.seeding import torch_generator
from securefed.data.types import Split
from securefed.evaluation import evaluate_splits
from securefed.models.mostpop import (
    DP_MAX_ITEMS,
    CountScorer,
    dp_popularity_counts,
    popularity_counts,
)

__all__ = [
    "BASELINE_NOTE",
    "baseline_metrics",
    "dp_mostpop_counts",
    "random_metrics",
    "verdict",
]

BASELINE_NOTE = (
    "baselines on the same split; DP-MostPop is one Gaussian count release at the run's "
    "epsilon, a reference not charged to the run's budget"
)


def random_metrics(
    split: Split, *, k: int = 10, full_users: np.ndarray | None = None
) -> dict[str, float]:
    """Expected test HR@k / NDCG@k of random scores, sampled and full-ranking protocols (the
    full-ranking ones over ``full_users`` when given)."""
    sampled_k = split.test_negatives.shape[1] if split.test_negatives.ndim == 2 else 0
    out = _uniform_rank_metrics(np.full(split.n_users, sampled_k + 1), k)
    train = np.diff(np.asarray(split.train_indptr, dtype=np.int64))
    if full_users is not None:
        train = train[np.asarray(full_users, dtype=np.int64)]
    # Full ranking: every item but the user's training items and the other held-out item.
    full = _uniform_rank_metrics(split.n_items - train - 1, k)
    return {
        "test_hr@10": out[0],
        "test_ndcg@10": out[1],
        "test_full_hr@10": full[0],
        "test_full_ndcg@10": full[1],
    }


def _uniform_rank_metrics(n_positions: np.ndarray, k: int) -> tuple[float, float]:
    """Mean HR@k and NDCG@k of a target placed uniformly among ``n`` positions per user."""
    n = np.maximum(n_positions.astype(np.float64), 1.0)
    hr = np.minimum(k, n) / n
    gains = 1.0 / np.log2(np.arange(k) + 2.0)
    cum = np.concatenate([[0.0], np.cumsum(gains)])
    ndcg = cum[np.minimum(k, n).astype(np.int64)] / n
    return float(hr.mean()), float(ndcg.mean())


def _metrics(
    counts: torch.Tensor, split: Split, full_users: np.ndarray | None = None
) -> dict[str, float]:
    res = evaluate_splits(
        CountScorer(counts), split, which=("test",), k=10, full=True, full_users=full_users
    )["test"]
    assert res.full_hr is not None and res.full_ndcg is not None
    return {
        "test_hr@10": res.hr,
        "test_ndcg@10": res.ndcg,
        "test_full_hr@10": res.full_hr,
        "test_full_ndcg@10": res.full_ndcg,
    }


def dp_mostpop_counts(
    split: Split,
    *,
    epsilon: float,
    delta: float,
    privacy_unit: str,
    seed: int,
    accountant: str = "prv",
) -> tuple[torch.Tensor, float]:
    """DP-MostPop's released counts at ``epsilon`` (and the noise multiplier used)."""
    sigma = calibrate_noise_multiplier(
        epsilon=epsilon,
        delta=delta,
        sample_rate=1.0,
        steps=1,
        accountant=accountant,  # type: ignore[arg-type]
    )
    gen = torch_generator(seed, "baseline-dp-mostpop")
    if privacy_unit == "interaction":
        # One interaction changes one count by 1: no contribution bound needed.
        counts = popularity_counts(split).double()
        noise = torch.randn(split.n_items, generator=gen, dtype=torch.float64) * sigma
        return (counts + noise).float(), sigma
    return (
        dp_popularity_counts(split, noise_multiplier=sigma, max_items=DP_MAX_ITEMS, generator=gen),
        sigma,
    )


def baseline_metrics(
    split: Split,
    *,
    seed: int,
    epsilon: float | None = None,
    delta: float = 1e-5,
    privacy_unit: str = "user",
    full_users: np.ndarray | None = None,
) -> dict[str, Any]:
    """``baseline_<name>_<metric>`` for random, MostPop and (with ``epsilon``) DP-MostPop.

    With ``full_users`` (a run's :attr:`~securefed.config.TrainConfig.eval_users` sample) the
    full-ranking metrics are over the same users as the run's.
    """
    out: dict[str, Any] = {}
    for name, values in (
        ("random", random_metrics(split, full_users=full_users)),
        ("mostpop", _metrics(popularity_counts(split), split, full_users)),
    ):
        out.update({f"baseline_{name}_{k}": v for k, v in values.items()})
    if epsilon is not None and math.isfinite(epsilon) and epsilon > 0:
        counts, sigma = dp_mostpop_counts(
            split, epsilon=epsilon, delta=delta, privacy_unit=privacy_unit, seed=seed
        )
        dp_values = _metrics(counts, split, full_users)
        out.update({f"baseline_dp_mostpop_{k}": v for k, v in dp_values.items()})
        out["baseline_dp_mostpop_epsilon"] = epsilon
        out["baseline_dp_mostpop_noise_multiplier"] = sigma
        out["baseline_dp_mostpop_max_items"] = DP_MAX_ITEMS if privacy_unit == "user" else None
    out["baseline_note"] = BASELINE_NOTE
    return out


def _less(value: float, ref: float) -> str:
    """``"value < ref"`` with the fewest decimals from 4 that tell them apart (``0.0064 <
    0.0064`` read as a tie)."""
    for digits in range(4, 10):
        a, b = f"{value:.{digits}f}", f"{ref:.{digits}f}"
        if a != b:
            return f"{a} < {b}"
    return f"{value!r} < {ref!r}"


def verdict(summary: dict[str, Any]) -> list[str]:
    """Sentences saying where the run stands against its baselines (empty when above all)."""
    lines: list[str] = []
    hr = summary.get("test_hr@10")
    full = summary.get("test_full_hr@10")
    if hr is None:
        return lines
    for name, label in (
        ("random", "random scores"),
        ("mostpop", "MostPop (an item count)"),
        ("dp_mostpop", "DP-MostPop at the same epsilon"),
    ):
        ref = summary.get(f"baseline_{name}_test_hr@10")
        ref_full = summary.get(f"baseline_{name}_test_full_hr@10")
        if ref is None:
            continue
        below = [f"sampled HR@10 {_less(hr, ref)}"] if hr < ref else []
        if full is not None and ref_full is not None and full < ref_full:
            below.append(f"full HR@10 {_less(full, ref_full)}")
        if below:
            lines.append(f"BELOW {label}: " + ", ".join(below))
    return lines
