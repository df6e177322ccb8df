"""Canaries and empirical epsilon lower bounds.

Canaries (interaction level): ``m`` fresh items are appended to the catalogue, one per canary,
and canary ``j`` is the pair ``(user_j, item_j)`` with distinct users. Each is put into its
user's training positives independently with probability 1/2. No real user has a canary item
as a positive, so only its canary user can push its row up. Adding one interaction changes one
user's data, so a user-level (epsilon, delta)-DP run is (epsilon, delta)-DP for every canary
bit, and a valid lower bound from the canaries never exceeds the accountant's epsilon (up to
the stated failure probability).

Two lower bounds, each at confidence ``1 - alpha/2`` so that both hold together with
``1 - alpha`` (Bonferroni):

* Jagielski, Ullman, Oprea, "Auditing Differentially Private Machine Learning: How Private is
  Private SGD?" (NeurIPS 2020), Sec. 4: at a threshold, Clopper-Pearson upper bounds on the
  false-positive and false-negative rates give ``epsilon >= log((1 - delta - FNR) / FPR)``.
  The threshold is chosen on one half of the canaries and the bound computed on the other.
* Steinke, Nasr, Jagielski, "Privacy Auditing with One (1) Training Run" (NeurIPS 2023),
  Thm. 3.1 / Alg. 1: guess "in" for the ``k+`` highest scores and "out" for the ``k-``
  lowest; under epsilon-DP the number of correct guesses among ``r`` is stochastically
  dominated by ``Binomial(r, e^eps / (1 + e^eps))``; the largest epsilon whose tail
  probability at the observed count is below the significance level is the bound. We use
  their pure-epsilon statement and spend ``m * delta`` of the significance level on delta
  (a union bound over the canaries' delta events; conservative, and negligible here). The
  guess counts are chosen from a fixed grid with a Bonferroni correction.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
from scipy import optimize, stats

from securefed.data.types import Split
from securefed.errors import ConfigError

__all__ = ["Canaries", "clopper_pearson_bound", "one_run_bound", "plant_canaries"]


@dataclass(frozen=True)
class Canaries:
    """Planted canary pairs: ``users[j]`` gets item ``items[j]`` iff ``included[j]``."""

    users: np.ndarray
    items: np.ndarray
    included: np.ndarray

    @property
    def size(self) -> int:
        return int(self.users.size)


def plant_canaries(split: Split, count: int, rng: np.random.Generator) -> tuple[Split, Canaries]:
    """Append ``count`` canary items and plant each in a distinct user with probability 1/2.

    Returns:
        The split with ``n_items + count`` items (evaluation data unchanged) and the canaries.
    """
    if not isinstance(count, int) or count < 1:
        raise ConfigError(f"canaries must be a positive integer, got {count!r}")
    if count > split.n_users:
        raise ConfigError(
            f"{count} canaries need {count} distinct users but the data has {split.n_users}; "
            "use fewer canaries"
        )
    users = np.sort(rng.choice(split.n_users, size=count, replace=False)).astype(np.int64)
    items = split.n_items + np.arange(count, dtype=np.int64)
    included = rng.random(count) < 0.5
    extra = {int(u): int(i) for u, i, inc in zip(users, items, included, strict=True) if inc}

    def add(indptr: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        parts = []
        new_ptr = [0]
        for u in range(split.n_users):
            row = values[indptr[u] : indptr[u + 1]]
            if u in extra:
                row = np.append(row, extra[u])  # canary ids are the largest: still sorted
            parts.append(row)
            new_ptr.append(new_ptr[-1] + row.size)
        return np.asarray(new_ptr, dtype=indptr.dtype), np.concatenate(parts).astype(values.dtype)

    train_ptr, train_items = add(split.train_indptr, split.train_items)
    hist_ptr, hist_items = add(split.history_indptr, split.history_items)
    planted = dataclasses.replace(
        split,
        n_items=split.n_items + count,
        train_indptr=train_ptr,
        train_items=train_items,
        history_indptr=hist_ptr,
        history_items=hist_items,
    )
    return planted, Canaries(users=users, items=items, included=included)


def _cp_upper(k: int, n: int, alpha: float) -> float:
    """One-sided Clopper-Pearson upper bound of a proportion at confidence 1 - alpha."""
    if n == 0:
        return 1.0
    if k >= n:
        return 1.0
    return float(stats.beta.ppf(1 - alpha, k + 1, n - k))


def clopper_pearson_bound(
    scores: np.ndarray, included: np.ndarray, *, delta: float, alpha: float, rng: np.random.Generator
) -> float:
    """Epsilon lower bound of Jagielski et al. (2020) at confidence ``1 - alpha``.

    The threshold (and direction) is picked on a random half of the canaries; the bound uses
    Clopper-Pearson upper bounds (each at ``alpha / 2``) of FPR and FNR on the other half.
    """
    s = np.asarray(scores, dtype=np.float64)
    y = np.asarray(included, dtype=bool)
    order = rng.permutation(s.size)
    pick, test = order[: s.size // 2], order[s.size // 2 :]

    def bound(idx: np.ndarray, thr: float, a: float) -> float:
        pred = s[idx] >= thr
        truth = y[idx]
        n_out, n_in = int((~truth).sum()), int(truth.sum())
        fp, fn = int((pred & ~truth).sum()), int((~pred & truth).sum())
        fpr = _cp_upper(fp, n_out, a / 2)
        fnr = _cp_upper(fn, n_in, a / 2)
        if fpr <= 0 or 1 - delta - fnr <= 0:
            return 0.0
        return max(0.0, math.log((1 - delta - fnr) / fpr))

    candidates = np.unique(s[pick])
    if candidates.size == 0:
        return 0.0
    best = max(candidates, key=lambda t: bound(pick, float(t), alpha))
    return bound(test, float(best), alpha)


def _one_run_eps(correct: int, guesses: int, beta: float) -> float:
    """Largest epsilon with P[Binomial(r, e^eps/(1+e^eps)) >= v] <= beta (0 if none)."""
    if guesses == 0 or correct == 0:
        return 0.0

    def tail(eps: float) -> float:
        p = 1.0 / (1.0 + math.exp(-eps))
        return float(stats.binom.sf(correct - 1, guesses, p))

    if tail(0.0) > beta:
        return 0.0
    hi = 1.0
    while tail(hi) <= beta and hi < 64:
        hi *= 2
    if tail(hi) <= beta:
        return hi
    return float(optimize.brentq(lambda e: tail(e) - beta, 0.0, hi, xtol=1e-6))


def one_run_bound(
    scores: np.ndarray, included: np.ndarray, *, delta: float, alpha: float
) -> tuple[float, dict[str, int]]:
    """Epsilon lower bound of Steinke, Nasr, Jagielski (2023) at confidence ``1 - alpha``.

    Returns:
        ``(epsilon, {"guesses", "correct"})`` of the best grid point.
    """
    s = np.asarray(scores, dtype=np.float64)
    y = np.asarray(included, dtype=bool)
    m = s.size
    fractions = (0.05, 0.1, 0.2, 0.5, 1.0)
    beta = (alpha - m * delta) / len(fractions)
    if beta <= 0:
        raise ConfigError(
            f"delta {delta:g} is too large for an audit with {m} canaries (m * delta >= alpha)"
        )
    order = np.argsort(-s, kind="stable")
    best, detail = 0.0, {"guesses": 0, "correct": 0}
    for f in fractions:
        r = max(2, int(round(f * m)))
        r -= r % 2
        top, bottom = order[: r // 2], order[m - r // 2 :]
        correct = int(y[top].sum() + (~y[bottom]).sum())
        eps = _one_run_eps(correct, r, beta)
        if eps > best:
            best, detail = eps, {"guesses": r, "correct": correct}
    return best, detail
