"""Leave-one-out split and the sampled evaluation negatives.

Protocol (the one of the FedRAP and FedRecGEL papers): per user, the latest interaction is the
test item, the second latest the validation item, the rest are training positives.

* With timestamps, interactions are ordered by time; equal timestamps keep their order in the
  :class:`~securefed.data.types.Interactions` arrays (file order), so ties are broken the same
  way on every run.
* Without timestamps (FilmTrust), each user's interactions are put in the order of a random
  permutation drawn from ``derive_seed(seed, "split", "order")``: the held-out items are a
  uniformly random pair of the user's items, and the same ``seed`` gives the same split.

The evaluation negatives are ``n_eval_negatives`` distinct items per user that the user never
interacted with (train, validation or test), drawn once per seed and separately for validation
and test, so every model evaluated with the same seed ranks against the same lists.
"""

from __future__ import annotations

import numpy as np

from protocols.seeding import keyed_uniforms, numpy_generator
from securefed.data.types import Interactions, Split
from securefed.errors import ConfigError, DataError

__all__ = ["DEFAULT_EVAL_NEGATIVES", "MIN_EVAL_NEGATIVES", "complement_items", "leave_one_out"]

#: Sampled negatives per held-out item, the papers' protocol (``TrainConfig.eval_negatives``).
DEFAULT_EVAL_NEGATIVES = 99
#: The fewest a run draws: with fewer than 10, every held-out item is in the top 10 of its
#: sampled ranking and the sampled HR@10 is 1 whatever the model.
MIN_EVAL_NEGATIVES = 10


def _csr(users: np.ndarray, items: np.ndarray, n_users: int) -> tuple[np.ndarray, np.ndarray]:
    """CSR (indptr, items sorted within each user) of the given pairs."""
    order = np.lexsort((items, users))
    indptr = np.zeros(n_users + 1, dtype=np.int64)
    np.cumsum(np.bincount(users, minlength=n_users), out=indptr[1:])
    return indptr, items[order].astype(np.int64)


def complement_items(
    indptr: np.ndarray, items: np.ndarray, n_items: int, users: np.ndarray, ranks: np.ndarray
) -> np.ndarray:
    """Map ranks within each user's complement to item ids.

    For user ``u`` with sorted positives ``h_0 < h_1 < ...``, rank ``r`` in
    ``[0, n_items - len(h))`` maps to the ``r``-th item not in ``h``: ``r + #{j : h_j - j <= r}``.
    The adjusted keys ``u * n_items + h_j - j`` are globally non-decreasing, so one
    ``searchsorted`` serves all users at once.

    Args:
        indptr: CSR row pointers (``n_users + 1``).
        items: CSR items, sorted and unique within each user.
        n_items: Catalogue size.
        users: User of each query (any shape).
        ranks: Rank of each query within that user's complement (same shape as ``users``).
    """
    counts = np.diff(indptr)
    within = np.arange(len(items), dtype=np.int64) - np.repeat(indptr[:-1], counts)
    owners = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
    keys = owners * n_items + items - within
    found = np.searchsorted(keys, users * n_items + ranks, side="right")
    return ranks + found - indptr[users]


def _sample_distinct(
    rng: np.random.Generator, sizes: np.ndarray, k: int, rows: np.ndarray | None = None
) -> np.ndarray:
    """``k`` distinct ranks in ``[0, sizes[u])`` per row, uniformly (Floyd's algorithm).

    Vectorised over rows; the loop runs over the ``k`` positions only. With ``rows`` only
    those rows are drawn (their ranks exactly as without): the stream still spends one
    number per row of ``sizes`` and position, a row's ranks depend on its own numbers only.
    """
    n = len(sizes)
    if rows is not None:
        sizes = sizes[rows]
    out = np.empty((len(sizes), k), dtype=np.int64)
    for col in range(k):
        j = sizes - k + col  # Floyd: draw t in [0, j]; if taken, take j instead
        u = rng.random(n)
        t = np.floor((u if rows is None else u[rows]) * (j + 1)).astype(np.int64)
        t = np.minimum(t, j)
        taken = (out[:, :col] == t[:, None]).any(axis=1)
        out[:, col] = np.where(taken, j, t)
    return out


def leave_one_out(
    data: Interactions,
    *,
    seed: int,
    n_eval_negatives: int = DEFAULT_EVAL_NEGATIVES,
    users: np.ndarray | None = None,
) -> Split:
    """Split interactions leave-one-out and draw the sampled evaluation negatives.

    Args:
        data: Interactions without duplicate ``(user, item)`` pairs; every user needs at least
            3 interactions (load with ``min_interactions >= 3``).
        seed: Root seed of the tie order without timestamps and of the evaluation negatives.
        n_eval_negatives: Negatives per user for the sampled protocol (99 in the papers);
            0 keeps only the full-ranking protocol.
        users: Keep the rows of these users only (sorted, distinct; a Flower node's
            partition): each of them gets exactly the rows, held-out items and negatives of
            the split of every user, the others none (:attr:`Split.held_users`). The whole
            data is still checked as without.

    Returns:
        The :class:`~securefed.data.types.Split`; see the module docstring for the protocol.

    Raises:
        DataError: A user has fewer than 3 interactions, duplicate pairs exist, or a user has
            fewer than ``n_eval_negatives`` items left to sample from.
    """
    if isinstance(n_eval_negatives, bool) or not isinstance(n_eval_negatives, int):
        raise ConfigError(f"n_eval_negatives must be an integer, got {n_eval_negatives!r}")
    if n_eval_negatives < 0:
        raise ConfigError(f"n_eval_negatives must be non-negative, got {n_eval_negatives!r}")
    n_users, n_items = data.n_users, data.n_items
    held = _held_users(users, n_users)
    users = np.asarray(data.users, dtype=np.int64)
    items = np.asarray(data.items, dtype=np.int64)
    counts = np.bincount(users, minlength=n_users)
    if len(counts) > n_users or (len(items) and (items.min() < 0 or items.max() >= n_items)):
        raise DataError(f"{data.name}: user or item index out of range for its n_users/n_items")
    short = counts < 3
    if short.any():
        raise DataError(
            f"{data.name}: {int(short.sum())} user(s) have fewer than 3 interactions "
            f"(smallest: {int(counts.min())}); leave-one-out needs 3 per user: load the data "
            "with min_interactions >= 3"
        )
    history_indptr, history_items = _csr(users, items, n_users)
    same = np.diff(history_items) == 0
    same &= np.repeat(np.arange(n_users), counts)[1:] == np.repeat(np.arange(n_users), counts)[:-1]
    if same.any():
        raise DataError(
            f"{data.name}: {int(same.sum())} duplicate (user, item) interaction(s); "
            "deduplicate them (the loaders do) before splitting"
        )

    position = np.arange(len(users))
    if data.timestamps is not None:
        order = np.lexsort((position, np.asarray(data.timestamps, dtype=np.float64), users))
    else:
        # Each interaction's key from the seed and its own (user, item): a user's order never
        # depends on anyone else's rows. One stream in file order (before 2026-12-06) let
        # removing a user re-split every later user, moving their clipped uploads by 14-82
        # clips on FilmTrust and Gowalla (found in review; docs/privacy.md).
        keys = keyed_uniforms(seed, "split", "order", keys=(users, items))
        order = np.lexsort((keys, users))
    ordered = items[order]
    last = history_indptr[1:] - 1
    test_items = ordered[last]
    val_items = ordered[last - 1]
    is_train = np.ones(len(users), dtype=bool)
    is_train[last] = False
    is_train[last - 1] = False
    train_indptr, train_items = _csr(users[order][is_train], ordered[is_train], n_users)

    free = n_items - counts
    if n_eval_negatives and (free < n_eval_negatives).any():
        worst = int(free.min())
        more = "use a dataset with more items" + (
            f" (--synthetic-items {n_items - worst + n_eval_negatives} or more)"
            if data.report.synthetic
            else ""
        )
        fewer = (
            f"draw {worst} or fewer (--eval-negatives {worst}; eval_negatives = {worst} in a "
            f"config or TrainConfig), or {more}"
            if worst >= MIN_EVAL_NEGATIVES
            else f"a run draws at least {MIN_EVAL_NEGATIVES} (--eval-negatives): {more}"
        )
        raise DataError(
            f"{data.name}: a user has only {worst} never-interacted item(s) of {n_items}, fewer "
            f"than the {n_eval_negatives} negatives the sampled evaluation draws per user; "
            f"{fewer}"
        )
    negatives = {}
    row_users = (np.arange(n_users, dtype=np.int64) if held is None else held)[:, None]
    for which in ("val", "test"):
        rng = numpy_generator(seed, "split", "eval-negatives", which)
        ranks = _sample_distinct(rng, free, n_eval_negatives, held)
        negatives[which] = complement_items(
            history_indptr, history_items, n_items, np.broadcast_to(row_users, ranks.shape), ranks
        )
    if held is not None:  # the held users' rows only
        keep = np.zeros(n_users, dtype=bool)
        keep[held] = True
        train_indptr, train_items = _rows_of(train_indptr, train_items, keep)
        history_indptr, history_items = _rows_of(history_indptr, history_items, keep)
        val_items = np.where(keep, val_items, -1)
        test_items = np.where(keep, test_items, -1)

    return Split(
        name=data.name,
        n_users=n_users,
        n_items=n_items,
        train_indptr=train_indptr,
        train_items=train_items,
        history_indptr=history_indptr,
        history_items=history_items,
        val_items=val_items,
        test_items=test_items,
        val_negatives=negatives["val"],
        test_negatives=negatives["test"],
        attributes=dict(data.attributes),
        report=data.report,
        held_users=held,
    )


def _held_users(users: np.ndarray | None, n_users: int) -> np.ndarray | None:
    """``users`` checked: sorted, distinct user indices (int64); ``None`` stays."""
    if users is None:
        return None
    held = np.asarray(users)
    if held.ndim != 1 or not np.issubdtype(held.dtype, np.integer):
        raise ConfigError("users must be a 1-D array of user indices")
    held = held.astype(np.int64)
    if held.size and (held[0] < 0 or held[-1] >= n_users or (np.diff(held) <= 0).any()):
        raise ConfigError(f"users must be sorted, distinct user indices in [0, {n_users})")
    return held


def _rows_of(
    indptr: np.ndarray, items: np.ndarray, keep: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The CSR ``(indptr, items)`` with the rows of users not in ``keep`` emptied."""
    counts = np.diff(indptr)
    out = np.zeros_like(indptr)
    np.cumsum(np.where(keep, counts, 0), out=out[1:])
    return out, items[np.repeat(keep, counts)]
