"""Canaries and empirical epsilon lower bounds.

Canaries (user level, zero-out): ``m`` fresh items are appended to the catalogue, one per
canary, and canary ``j`` is a fresh *client* whose training positives are its canary item and
two random real items. Every canary client is in the population in both worlds (sampled and
counted like every user); independently with probability 1/2 its uploads are real, otherwise
*null* (zero: :attr:`Split.null_users`). No real user has a canary item as a positive, so
only its canary client pushes that row up. A user whose data is replaced by a null one is
exactly the zero-out neighbouring relation that securefed's user-level epsilon is stated
for (docs/privacy.md, "Unit of privacy"; Kairouz et al., ICML 2021), so for a user-level
(epsilon, delta) run every canary bit is (epsilon, delta)-DP and a valid lower bound never
exceeds the accountant's epsilon (up to the stated failure probability). (Until 2026-12-06
absent canary clients did not exist at all, an add/remove pair: the number of users then
differed between the worlds, and the server divides each round's sum by it, so the released
model's scale told the worlds apart beyond the accounted epsilon (found in review); the
canary test read the sum before that division and could not see it.)
A model whose release reads item *pairs* (fedals's co-occurrence rounds) asks for two fresh
items per canary (``ObserverHooks.canary_items``): the canary client trains on both, so the
pair is the canary's alone, and the audit adds the canaries' items to the set of items whose
pairs are released (``ObserverHooks.prepare_audit``).
(Planting an interaction into an existing user would be a *replace* neighbour, whose
guarantee is up to twice as weak, so it could not be compared with the accountant.)

Canaries (interaction level, zero-out): for runs with ``--privacy-unit interaction``, whose
guarantee is stated for the zero-out relation (one interaction replaced by a null example
with zero gradient; docs/privacy.md). Canary ``j`` is a fresh item planted as a training
positive of a distinct random real user (its host) in *both* worlds; with probability 1/2 its
DP-SGD example is real, otherwise it is a null example (:attr:`Split.null_positives`). The
two worlds then differ by exactly one zero-out neighbour, so each canary bit is
(epsilon, delta)-DP for the run's interaction-level epsilon.

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
from typing import Any

import numpy as np
from scipy import optimize, stats

from securefed.data.types import Split
from securefed.errors import ConfigError

__all__ = [
    "Canaries",
    "clopper_pearson_bound",
    "one_run_bound",
    "check_canary_room",
    "plant_canaries",
    "plant_interaction_canaries",
]


@dataclass(frozen=True)
class Canaries:
    """Canary ``j`` and its item ``items[j]``.

    ``unit="user"``: canary clients; ``users[j]`` is the client's user index in the planted
    split, ``included[j]`` whether its uploads are real (else null, :attr:`Split.null_users`).
    ``unit="interaction"``:
    ``users[j]`` is the host user, always present; ``included[j]`` says whether the planted
    example is real (else a null example).
    """

    users: np.ndarray
    items: np.ndarray
    included: np.ndarray
    unit: str = "user"
    #: A second fresh item of each canary (user level, ``items_per_canary=2``), trained with
    #: the first so that the two form a pair no real user has; None: one item each.
    partners: np.ndarray | None = None

    @property
    def size(self) -> int:
        return int(self.items.size)


def check_canary_room(n_items: int, n_negatives: int) -> None:
    """Refuse user-level canary clients on a catalogue too small for them: each trains on
    4 distinct real items and is evaluated against ``n_negatives`` validation and as many
    test negatives, all distinct (:func:`plant_canaries`; a report checks it before any cell
    trains).

    Raises:
        ConfigError: one line with the items needed and what to do.
    """
    if n_items < 2 * n_negatives + 4:
        raise ConfigError(
            f"canary clients need at least {2 * n_negatives + 4} real items (4 positives and "
            f"{n_negatives} validation and {n_negatives} test negatives, all distinct), the "
            f"data has {n_items}; audit without canaries (securefed audit --canaries 0; a "
            "report: --no-audit), on more items, or with fewer --eval-negatives"
        )


def plant_canaries(
    split: Split, count: int, rng: np.random.Generator, *, items_per_canary: int = 1
) -> tuple[Split, Canaries]:
    """Append ``count`` canary items and clients, each client's uploads null with
    probability 1/2 (the zero-out neighbour: the client is counted and sampled either way).

    Canary clients come after the real users (indices ``split.n_users ..``); each trains on its
    canary item plus two random real items and gets a random real validation and test item
    and evaluation negatives, so training and evaluation run unchanged. Attributes are -1.
    With ``items_per_canary=2`` each canary has a second fresh item (its partner, after all
    the first items: the last ``count`` items of the catalogue) that its client also trains
    on, so the canary owns an item *pair* (a co-occurrence release reads pairs: fedals); the
    random draws are the same as with one item.

    Returns:
        The split with ``n_items + count * items_per_canary`` items and the ``count`` canary
        clients appended (``null_users``: those whose uploads are null), and the canaries.
    """
    if not isinstance(count, int) or count < 1:
        raise ConfigError(f"canaries must be a positive integer, got {count!r}")
    if items_per_canary not in (1, 2):
        raise ValueError(f"items_per_canary must be 1 or 2, got {items_per_canary!r}")
    n_real = split.n_items
    n_neg = split.val_negatives.shape[1]
    check_canary_room(n_real, n_neg)
    items = n_real + np.arange(count, dtype=np.int64)
    partners = items + count if items_per_canary == 2 else None
    included = rng.random(count) < 0.5
    n_new = count
    users = split.n_users + np.arange(count, dtype=np.int64)
    train_rows, hist_rows, val, test, vneg, tneg = [], [], [], [], [], []
    for j in range(count):
        own = items[j : j + 1] if partners is None else np.array([items[j], partners[j]])
        real = rng.choice(n_real, size=4 + 2 * n_neg, replace=False)
        pos = np.sort(real[:2])
        train_rows.append(np.append(pos, own))
        val.append(real[2])
        test.append(real[3])
        hist_rows.append(np.sort(np.append(real[:4], own)))
        vneg.append(real[4 : 4 + n_neg])
        tneg.append(real[4 + n_neg : 4 + 2 * n_neg])

    def extend(
        indptr: np.ndarray, values: np.ndarray, rows: list[np.ndarray]
    ) -> tuple[np.ndarray, np.ndarray]:
        sizes = np.array([r.size for r in rows], dtype=indptr.dtype)
        ptr = np.concatenate([indptr, indptr[-1] + np.cumsum(sizes)]).astype(indptr.dtype)
        vals = np.concatenate([values, *rows]).astype(values.dtype) if rows else values
        return ptr, vals

    train_ptr, train_items = extend(split.train_indptr, split.train_items, train_rows)
    hist_ptr, hist_items = extend(split.history_indptr, split.history_items, hist_rows)

    def stack(base: np.ndarray, rows: list[Any]) -> np.ndarray:
        if not rows:
            return base
        return np.concatenate(
            [base, np.asarray(rows, dtype=base.dtype).reshape(len(rows), *base.shape[1:])]
        )

    attributes = {
        k: np.concatenate([v, np.full(n_new, -1, dtype=v.dtype)])
        for k, v in split.attributes.items()
    }
    planted = dataclasses.replace(
        split,
        n_users=split.n_users + n_new,
        n_items=n_real + count * items_per_canary,
        train_indptr=train_ptr,
        train_items=train_items,
        history_indptr=hist_ptr,
        history_items=hist_items,
        val_items=stack(split.val_items, val),
        test_items=stack(split.test_items, test),
        val_negatives=stack(split.val_negatives, vneg),
        test_negatives=stack(split.test_negatives, tneg),
        attributes=attributes,
        null_users=users[~included],
    )
    return planted, Canaries(users=users, items=items, included=included, partners=partners)


def plant_interaction_canaries(
    split: Split, count: int, rng: np.random.Generator
) -> tuple[Split, Canaries]:
    """Append ``count`` canary items, each a training positive of its own random real user,
    and make each planted example a null example with probability 1/2 (zero-out canaries).

    Returns:
        The split with ``n_items + count`` items, the planted positives and their
        ``null_positives`` mask, and the canaries (``unit="interaction"``).
    """
    if not isinstance(count, int) or count < 1:
        raise ConfigError(f"canaries must be a positive integer, got {count!r}")
    if count > split.n_users:
        raise ConfigError(
            f"interaction canaries need a distinct host user each: {count} canaries, "
            f"{split.n_users} users; lower --canaries"
        )
    if split.null_positives is not None:
        raise ConfigError("the split already holds null examples; plant canaries once")
    n_real = split.n_items
    items = n_real + np.arange(count, dtype=np.int64)
    hosts = rng.choice(split.n_users, size=count, replace=False).astype(np.int64)
    included = rng.random(count) < 0.5
    extra = np.zeros(split.n_users, dtype=np.int64)
    extra[hosts] = 1
    canary_of = np.full(split.n_users, -1, dtype=np.int64)
    canary_of[hosts] = items

    def plant(indptr: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Each host's canary appended after its own (sorted: canary ids are the largest)."""
        counts = np.diff(indptr)
        ptr = np.concatenate([[0], np.cumsum(counts + extra)]).astype(indptr.dtype)
        out = np.empty(int(ptr[-1]), dtype=values.dtype)
        old_pos = np.repeat(ptr[:-1], counts) + (
            np.arange(values.size) - np.repeat(indptr[:-1], counts)
        )
        out[old_pos] = values
        new_pos = ptr[1:][hosts] - 1
        out[new_pos] = canary_of[hosts]
        return ptr, out, new_pos

    train_ptr, train_items, planted_at = plant(split.train_indptr, split.train_items)
    hist_ptr, hist_items, _ = plant(split.history_indptr, split.history_items)
    null = np.zeros(train_items.size, dtype=bool)
    null[planted_at[~included]] = True
    planted = dataclasses.replace(
        split,
        n_items=n_real + count,
        train_indptr=train_ptr,
        train_items=train_items,
        history_indptr=hist_ptr,
        history_items=hist_items,
        null_positives=null,
    )
    return planted, Canaries(users=hosts, items=items, included=included, unit="interaction")


def _cp_upper(k: int, n: int, alpha: float) -> float:
    """One-sided Clopper-Pearson upper bound of a proportion at confidence 1 - alpha."""
    if n == 0:
        return 1.0
    if k >= n:
        return 1.0
    return float(stats.beta.ppf(1 - alpha, k + 1, n - k))


def clopper_pearson_bound(
    scores: np.ndarray,
    included: np.ndarray,
    *,
    delta: float,
    alpha: float,
    rng: np.random.Generator,
) -> float:
    """Epsilon lower bound of Jagielski et al. (2020) at confidence ``1 - alpha``.

    The threshold (and direction) is picked on a random half of the canaries; the bound uses
    Clopper-Pearson upper bounds (each at ``alpha / 2``) of FPR and FNR on the other half.
    """
    s = np.asarray(scores, dtype=np.float64)
    y = np.asarray(included, dtype=bool)
    order = rng.permutation(s.size)
    pick, test = order[: s.size // 2], order[s.size // 2 :]

    def bound(idx: np.ndarray, thr: float, a: float, sign: float = 1.0) -> float:
        pred = sign * s[idx] >= thr
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
    # Both directions of the test are candidates: a score that separates the canaries the
    # wrong way round is still evidence, and the choice is made on the pick half only.
    best_sign, best_thr, best_eps = 1.0, float(candidates[0]), -1.0
    for sign in (1.0, -1.0):
        for t in sign * candidates:
            e = bound(pick, float(t), alpha, sign)
            if e > best_eps:
                best_sign, best_thr, best_eps = sign, float(t), e
    return bound(test, best_thr, alpha, best_sign)


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


#: The one-run bound's grid of guess counts, as fractions of the canaries (Bonferroni over
#: them): the top half of each count guessed in, the bottom half out, the rest abstained on.
ONE_RUN_FRACTIONS = (0.05, 0.1, 0.2, 0.5, 0.8, 0.9, 1.0)


def check_canary_delta(n_canaries: int, delta: float, alpha: float) -> None:
    """Refuse a delta the one-run bound cannot use: it spends ``m * delta`` of its
    significance ``alpha`` (Steinke, Nasr, Jagielski 2023), so ``m * delta < alpha``.

    Raises:
        ConfigError: ``n_canaries * delta >= alpha``, naming the most canaries that fit.
    """
    if n_canaries * delta >= alpha:
        most = max(0, math.ceil(alpha / delta) - 1)
        while most > 0 and most * delta >= alpha:  # alpha / delta rounds up (0.025 / 1e-4)
            most -= 1
        raise ConfigError(
            f"delta {delta:g} is too large for an audit with {n_canaries} canaries: the "
            f"one-run bound spends canaries x delta ({n_canaries * delta:.3g}) of its "
            f"significance {alpha:.3g}; audit with --canaries {most} or fewer, or train "
            "with a smaller delta"
        )


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
    fractions = ONE_RUN_FRACTIONS
    check_canary_delta(m, delta, alpha)
    beta = (alpha - m * delta) / len(fractions)
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
