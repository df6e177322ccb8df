"""The server's view of a round: one function from client updates to an aggregate.

This is the seam where privacy protocols plug in: :class:`PlainAggregator` averages in the
clear; the DP and secure-aggregation aggregators replace it and nothing else changes.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np
import torch

from securefed.federation.base import Aggregate, ClientUpdates


class Aggregator(Protocol):
    """Turns one round's client updates into what the server learns."""

    def __call__(self, updates: ClientUpdates, round_index: int) -> Aggregate | None:
        """The aggregate, or None when the round must be skipped (e.g. too few survivors)."""
        ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class PlainAggregator:
    """Unweighted mean of the updates (FedAvg as both papers' code does it); no privacy.

    ``null_users``: users whose uploads count as zero (:func:`null_out`; the user canary
    audit's null clients), still counted in the mean's denominator."""

    def __init__(self, null_users: np.ndarray | None = None) -> None:
        self.null_users = null_users

    def __call__(self, updates: ClientUpdates, round_index: int) -> Aggregate | None:
        m = len(updates)
        if m == 0:
            return None
        total = updates.weighted_sum(null_out(torch.ones(m), updates.clients, self.null_users))
        return Aggregate(total=total, contributors=m, denominator=float(m))

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        return None


def aggregate(updates: ClientUpdates) -> Aggregate | None:
    """Plain aggregation of one round (see :class:`PlainAggregator`)."""
    return PlainAggregator()(updates, 0)


def null_out(
    factors: torch.Tensor, clients: torch.Tensor, null_users: np.ndarray | None
) -> torch.Tensor:
    """``factors`` (one per upload, aligned with ``clients``) with the uploads of
    ``null_users`` (:attr:`Split.null_users`) scaled to zero: a null user stays in the
    cohort and its count, and contributes nothing (the zero-out neighbour)."""
    if null_users is None or not len(null_users):
        return factors
    null = torch.from_numpy(np.asarray(null_users, dtype=np.int64))
    return torch.where(torch.isin(clients, null), torch.zeros_like(factors), factors)
