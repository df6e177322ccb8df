"""What a party that must not hold a dataset may know of it: its name and its sizes.

A Flower server (:mod:`securefed.flower.server`) trains, accounts and evaluates without
reading any user's interactions: the population size sizes its cohorts, noise and secure
aggregation graphs, and the catalogue size its model. It learns both from the nodes, which hold
the data (:func:`manifest_of` there, :meth:`DataManifest.from_fields` on the server), and
builds its model and privacy machinery on :func:`public_split`, a split of that shape with no
interaction in it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from securefed.data.types import LoadReport, Split

#: Where :func:`public_split` says its report came from.
PUBLIC_SOURCE = "public manifest (name and sizes only; no interaction)"


@dataclass(frozen=True, kw_only=True)
class DataManifest:
    """A dataset's public description: its name, population and catalogue sizes, and
    whether it is synthetic. Nothing in it depends on any one user's interactions beyond
    the user's presence (the population size, public throughout securefed's accounting)."""

    name: str
    n_users: int
    n_items: int
    synthetic: bool = False

    def fields(self, prefix: str = "data-") -> dict[str, Any]:
        """The manifest as flat scalar fields (a message's config entries)."""
        return {
            f"{prefix}name": self.name,
            f"{prefix}users": self.n_users,
            f"{prefix}items": self.n_items,
            f"{prefix}synthetic": self.synthetic,
        }

    @classmethod
    def from_fields(cls, fields: Mapping[str, Any], prefix: str = "data-") -> DataManifest:
        """The manifest in ``fields`` (:meth:`fields`).

        Raises:
            ValueError: An entry is missing or of the wrong type, or a size is not positive.
        """
        name = fields.get(f"{prefix}name")
        users = fields.get(f"{prefix}users")
        items = fields.get(f"{prefix}items")
        synthetic = fields.get(f"{prefix}synthetic")
        if (
            not isinstance(name, str)
            or type(users) is not int
            or type(items) is not int
            or type(synthetic) is not bool
            or users < 1
            or items < 1
        ):
            raise ValueError("malformed dataset manifest")
        return cls(name=name, n_users=users, n_items=items, synthetic=synthetic)

    def record(self) -> dict[str, Any]:
        """What a run directory's ``data.json`` holds when the run's server knew only this."""
        return {
            "name": self.name,
            "users": self.n_users,
            "items": self.n_items,
            "synthetic": self.synthetic,
            "source": PUBLIC_SOURCE,
        }

    def describe(self) -> str:
        """``name (users x items)``, for messages."""
        return f"{self.name} ({self.n_users:,} users x {self.n_items:,} items)"


def manifest_of(split: Split) -> DataManifest:
    """The public description of ``split``."""
    return DataManifest(
        name=split.name,
        n_users=int(split.n_users),
        n_items=int(split.n_items),
        synthetic=bool(split.report.synthetic),
    )


def public_split(manifest: DataManifest) -> Split:
    """A :class:`~securefed.data.types.Split` of the manifest's shape holding no interaction:
    every user's training and history rows are empty, its held-out items are ``-1`` and it
    has no evaluation negatives. What a server builds its model, cohorts and noise on; there
    is nothing in it to count, rank or evaluate (a Flower server's evaluation is a secure
    round over the nodes' users)."""
    n = manifest.n_users
    indptr = np.zeros(n + 1, dtype=np.int64)
    none = np.zeros(0, dtype=np.int64)
    held_out = np.full(n, -1, dtype=np.int64)
    return Split(
        name=manifest.name,
        n_users=n,
        n_items=manifest.n_items,
        train_indptr=indptr,
        train_items=none,
        history_indptr=indptr,
        history_items=none,
        val_items=held_out,
        test_items=held_out.copy(),
        val_negatives=np.zeros((n, 0), dtype=np.int64),
        test_negatives=np.zeros((n, 0), dtype=np.int64),
        report=LoadReport(
            source=PUBLIC_SOURCE,
            raw_rows=0,
            duplicate_rows=0,
            dropped_users=0,
            dropped_interactions=0,
            synthetic=manifest.synthetic,
        ),
    )


__all__ = ["PUBLIC_SOURCE", "DataManifest", "manifest_of", "public_split"]
