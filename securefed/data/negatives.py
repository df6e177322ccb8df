"""Training negatives: items a user did not interact with, sampled uniformly.

Two sources of "did not interact with":

* ``"train"`` (default, leak-free): anything except the user's *training* positives. The
  held-out validation and test items can be drawn as negatives, exactly as any other item the
  model is not allowed to know about.
* ``"history"`` (reproduces the official FedRAP code): anything except the user's whole
  history, *including* the held-out validation and test items. Those two items are then the
  only items the user never saw that are never pushed down during training, so the model
  learns "unseen and never sampled" = held out; this leak inflates FedRAP's HR@10 to about
  0.99 on MovieLens 100K. Use it only to reproduce published numbers.

Sampling is exact, vectorised and loop-free: for a positive of user ``u`` with ``m_u``
allowed items, draw a rank ``r`` uniform in ``[0, m_u)`` and map it to the ``r``-th allowed
item. When ``n_users * n_items`` is at most ``2**22`` (MovieLens 100K) the map is one
gather from a precomputed ``[n_users, n_items]`` table of each user's allowed items;
otherwise it is one ``torch.searchsorted`` over a precomputed sorted key array (see
:func:`securefed.data.split.complement_items`). Unlike rejection sampling neither needs a
redraw loop, so users whose positives cover most of the catalogue cost the same as others.
The ``n_neg`` negatives of one positive are independent draws (they may repeat).
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import torch

from securefed.data.types import Split
from securefed.errors import ConfigError, DataError

__all__ = ["NegativeSampler", "NegativeSource", "sample_train_negatives"]

NegativeSource = Literal["train", "history"]


class NegativeSampler:
    """Precomputes the sorted key array of a split once; :meth:`sample` draws negatives.

    Args:
        split: The leave-one-out split.
        source: ``"train"`` (exclude training positives, leak-free) or ``"history"``
            (exclude the whole history, as the official FedRAP code does; see module docs).
        max_table_entries: Use the gather table (int32, 4 bytes per entry) when
            ``n_users * n_items`` is at most this; 0 always uses ``searchsorted``.
    """

    def __init__(
        self,
        split: Split,
        source: NegativeSource = "train",
        *,
        max_table_entries: int = 1 << 22,
    ) -> None:
        if source == "train":
            indptr, items = split.train_indptr, split.train_items
        elif source == "history":
            indptr, items = split.history_indptr, split.history_items
        else:
            raise ConfigError(f"negative source must be 'train' or 'history', got {source!r}")
        self.source: NegativeSource = source
        self.n_users = split.n_users
        self.n_items = split.n_items
        counts = np.diff(indptr).astype(np.int64)
        within = np.arange(len(items), dtype=np.int64) - np.repeat(indptr[:-1], counts)
        owners = np.repeat(np.arange(split.n_users, dtype=np.int64), counts)
        # Adjusted keys u * n_items + h_j - j are non-decreasing over the whole array.
        self._keys = torch.from_numpy(owners * split.n_items + items - within)
        self._start = torch.from_numpy(np.asarray(indptr[:-1], dtype=np.int64))
        self._allowed = torch.from_numpy(split.n_items - counts)
        self._table: torch.Tensor | None = None
        if split.n_users * split.n_items <= max_table_entries:
            allowed = np.ones((split.n_users, split.n_items), dtype=bool)
            allowed[owners, items] = False
            rows, cols = np.nonzero(allowed)  # row-major: each user's allowed items ascending
            free = split.n_items - counts
            rank = np.arange(len(cols)) - np.repeat(np.cumsum(free) - free, free)
            table = np.zeros((split.n_users, split.n_items), dtype=np.int32)
            table[rows, rank] = cols
            self._table = torch.from_numpy(table)

    def sample(
        self, pos_users: torch.Tensor, n_neg: int, generator: torch.Generator
    ) -> torch.Tensor:
        """Draw ``n_neg`` negatives for each positive's user.

        Args:
            pos_users: int64 tensor ``[P]``, the user of each training positive.
            n_neg: Negatives per positive (at least 0).
            generator: The torch generator to draw from (CPU).

        Returns:
            int64 tensor ``[P, n_neg]`` of item indices never among the excluded items of
            the corresponding user.
        """
        if pos_users.dtype != torch.int64 or pos_users.ndim != 1:
            raise ConfigError(
                f"pos_users must be a 1-D int64 tensor, got {pos_users.dtype} "
                f"of shape {tuple(pos_users.shape)}"
            )
        if isinstance(n_neg, bool) or not isinstance(n_neg, int) or n_neg < 0:
            raise ConfigError(f"n_neg must be a non-negative integer, got {n_neg!r}")
        if pos_users.numel() == 0 or n_neg == 0:
            return torch.empty((pos_users.numel(), n_neg), dtype=torch.int64)
        pos_users = pos_users.cpu()
        lo, hi = int(pos_users.min()), int(pos_users.max())
        if lo < 0 or hi >= self.n_users:
            raise ConfigError(
                f"user index out of range [0, {self.n_users}): {lo if lo < 0 else hi}"
            )
        allowed = self._allowed[pos_users]
        if bool((allowed == 0).any()):
            raise DataError(
                f"a user has interacted with every item, so no {self.source} negative exists"
            )
        uniform = torch.rand((pos_users.numel(), n_neg), generator=generator, dtype=torch.float64)
        ranks = (uniform * allowed[:, None]).long()
        ranks = torch.minimum(ranks, allowed[:, None] - 1)
        users = pos_users[:, None]
        if self._table is not None:
            return self._table[users, ranks].long()
        found = torch.searchsorted(self._keys, users * self.n_items + ranks, right=True)
        return ranks + found - self._start[users]


def sample_train_negatives(
    split: Split,
    pos_users: torch.Tensor,
    n_neg: int,
    *,
    source: NegativeSource = "train",
    generator: torch.Generator,
) -> torch.Tensor:
    """One-shot form of :class:`NegativeSampler` (build the sampler once when looping).

    Returns:
        int64 tensor ``[len(pos_users), n_neg]`` of negatives; see :meth:`NegativeSampler.sample`.
    """
    return NegativeSampler(split, source).sample(pos_users, n_neg, generator)
