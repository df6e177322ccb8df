"""Typed containers passed from the data layer to models, federation and evaluation."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from securefed.errors import ConfigError


@dataclass(frozen=True, kw_only=True)
class LoadReport:
    """What the loader did to the raw file, shown to the user and written into the run."""

    source: str
    raw_rows: int
    duplicate_rows: int
    dropped_users: int
    dropped_interactions: int
    synthetic: bool = False
    notes: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class Interactions:
    """Implicit-feedback interactions with dense ids.

    Attributes:
        name: Dataset name (``"ml-100k"``, ``"synthetic"``, a file name, ...).
        users: int64 array of dense user indices in ``[0, n_users)``, one per interaction.
        items: int64 array of dense item indices in ``[0, n_items)``.
        timestamps: float64 array (seconds) or ``None`` when the data has no timestamps.
        n_users: Number of users.
        n_items: Number of items.
        user_ids: Original user ids, ``user_ids[dense] == original``.
        item_ids: Original item ids.
        attributes: Per-user attributes (arrays of length ``n_users``), e.g. ``"gender"``
            (0/1), ``"age"``; empty when the dataset has none.
        report: What loading did (duplicates removed, users dropped, ...).
    """

    name: str
    users: np.ndarray
    items: np.ndarray
    timestamps: np.ndarray | None
    n_users: int
    n_items: int
    user_ids: np.ndarray
    item_ids: np.ndarray
    attributes: dict[str, np.ndarray] = field(default_factory=dict)
    report: LoadReport


@dataclass(frozen=True, kw_only=True)
class Split:
    """Leave-one-out split with the sampled evaluation protocol.

    Per user, the latest interaction is the test item, the second latest the validation
    item and the rest are training positives. Training positives are stored in CSR form:
    user ``u`` owns ``train_items[train_indptr[u]:train_indptr[u + 1]]`` (sorted, unique).
    The full history (train + val + test) is stored the same way in ``history_*``.

    ``val_negatives`` / ``test_negatives`` hold, per user, ``n_eval_negatives`` items the
    user never interacted with (whole history), sampled once per seed: the papers' sampled
    protocol ranks the held-out item among them.

    A split of some users only (``held_users``, a Flower node's partition:
    ``leave_one_out(..., users=)``) keeps every user index and both sizes, but holds the rows
    of its users alone: the other users' training and history rows are empty, their held-out
    items ``-1``, and the evaluation negatives are stored for the held users only, row ``i``
    for ``held_users[i]`` (read them through :meth:`eval_rows`). Its ``n_train`` counts the
    held users' training positives.
    """

    name: str
    n_users: int
    n_items: int
    train_indptr: np.ndarray
    train_items: np.ndarray
    history_indptr: np.ndarray
    history_items: np.ndarray
    val_items: np.ndarray
    test_items: np.ndarray
    val_negatives: np.ndarray
    test_negatives: np.ndarray
    attributes: dict[str, np.ndarray] = field(default_factory=dict)
    report: LoadReport
    #: Bool mask aligned with ``train_items``: training positives whose DP-SGD example is a
    #: *null* example (zero gradient; the zero-out neighbouring relation of interaction-level
    #: DP). Set only by the interaction canary audit; honoured only by DP-SGD training.
    null_positives: np.ndarray | None = None
    #: User indices (int64) whose every upload is a *null* upload: zero, the zero-out
    #: neighbouring relation of user-level DP (docs/privacy.md). They stay in the population,
    #: are sampled and counted like everyone else, and contribute nothing to any release. Set
    #: only by the user canary audit; honoured where uploads are clipped
    #: (:func:`securefed.federation.aggregation.null_out`).
    null_users: np.ndarray | None = None
    #: The users whose rows this split holds (sorted, distinct int64); ``None``: every user.
    held_users: np.ndarray | None = None

    def eval_rows(self, users: np.ndarray) -> np.ndarray:
        """The rows of ``val_negatives`` / ``test_negatives`` holding ``users``' negatives
        (int64, ``users`` themselves unless the split holds some users only).

        Raises:
            ConfigError: A user whose rows the split does not hold.
        """
        users = np.asarray(users, dtype=np.int64)
        if self.held_users is None:
            return users
        rows = np.searchsorted(self.held_users, users)
        inside = rows < len(self.held_users)
        if not (inside.all() and np.array_equal(self.held_users[rows], users)):
            raise ConfigError(
                f"this split of {self.name} holds the rows of {len(self.held_users)} of its "
                f"{self.n_users} users; evaluate those users only"
            )
        return rows

    @property
    def train_counts(self) -> np.ndarray:
        """Number of training positives per user (int64, length ``n_users``)."""
        return np.diff(self.train_indptr)

    @property
    def n_train(self) -> int:
        """Total number of training positives."""
        return int(self.train_indptr[-1])

    def train_users(self) -> np.ndarray:
        """The user index of every training positive (aligned with ``train_items``)."""
        return np.repeat(np.arange(self.n_users, dtype=np.int64), self.train_counts)

    def train_pairs(self, users: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(position in users, item)`` of every training positive of ``users`` (int64),
        grouped by position in ``users`` order, each user's items in their stored order."""
        users = np.asarray(users, dtype=np.int64)
        indptr = np.asarray(self.train_indptr, dtype=np.int64)
        counts = indptr[users + 1] - indptr[users]
        local = np.repeat(np.arange(users.shape[0], dtype=np.int64), counts)
        offsets = np.arange(local.shape[0], dtype=np.int64) - np.repeat(
            np.cumsum(counts) - counts, counts
        )
        items = np.asarray(self.train_items, dtype=np.int64)[indptr[users][local] + offsets]
        return local, items

    def user_train_items(self, user: int) -> np.ndarray:
        """Training positives of one user."""
        return self.train_items[self.train_indptr[user] : self.train_indptr[user + 1]]
