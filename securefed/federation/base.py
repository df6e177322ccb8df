"""The contract between recommenders, the round loop and the privacy protocols.

A round reads top to bottom: sample cohort -> ``Recommender.client_round`` (all participants
trained together as batched tensor operations) -> ``ClientUpdates`` (one flat float vector per
client, what leaves the device) -> ``aggregate`` (plain mean, or DP / secure aggregation) ->
``Recommender.apply_aggregate`` (the server's model step) -> ``Recommender.end_round``.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch


@dataclass(frozen=True)
class UpdateLayout:
    """How a flat update vector splits into named parameter tensors."""

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]

    def __post_init__(self) -> None:
        if len(self.names) != len(self.shapes):
            raise ValueError(f"layout has {len(self.names)} names but {len(self.shapes)} shapes")

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(math.prod(s) for s in self.shapes)

    @property
    def size(self) -> int:
        """Total number of floats in one flat update."""
        return sum(self.sizes)

    def split(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """Views of ``flat`` (``[..., size]``) as the named tensors (``[..., *shape]``)."""
        lead = flat.shape[:-1]
        parts = torch.split(flat, list(self.sizes), dim=-1)
        return {
            n: p.reshape(*lead, *s) for n, p, s in zip(self.names, parts, self.shapes, strict=True)
        }


#: Floats of client updates :meth:`ClientUpdates.dense_block`'s default densifies at once.
DENSE_BLOCK_FLOATS = 64_000_000


def pairs_by_item(item: torch.Tensor, n_items: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions of ``item`` sorted by item, and where each item's run starts
    (``[n_items + 1]``): the index :func:`write_item_rows` selects a block's rows with."""
    order = torch.argsort(item, stable=True)
    starts = torch.zeros(n_items + 1, dtype=torch.long)
    torch.cumsum(torch.bincount(item, minlength=n_items), 0, out=starts[1:])
    return order, starts


def write_item_rows(
    out: torch.Tensor,
    lo: int,
    hi: int,
    *,
    offset: int,
    width: int,
    n_items: int,
    client: torch.Tensor,
    item: torch.Tensor,
    rows: Callable[[torch.Tensor], torch.Tensor],
    by_item: tuple[torch.Tensor, torch.Tensor],
) -> None:
    """Write per-(client, item) rows of an ``[n_items, width]`` layout part at ``offset``
    into ``out``, the ``[m, hi - lo]`` block of flat coordinates ``lo .. hi - 1``.

    Only the pairs whose item row meets the block are touched (``by_item`` from
    :func:`pairs_by_item`); ``rows(positions)`` gives those pairs' ``[p, width]`` values.
    """
    first = max(lo - offset, 0) // width
    last = min(hi - offset, n_items * width) - 1
    if last < 0 or last // width < first:  # the block ends before the part or starts after
        return
    order, starts = by_item
    sel = order[int(starts[first]) : int(starts[last // width + 1])]
    if sel.numel() == 0:
        return
    col = item[sel].unsqueeze(1) * width + (torch.arange(width) + offset - lo)
    inside = (col >= 0) & (col < hi - lo)
    who = client[sel].unsqueeze(1).expand_as(col)
    out[who[inside], col[inside]] = rows(sel)[inside].to(out.dtype)


class ClientUpdates(abc.ABC):
    """What the participants of one round send to the server, before any privacy protocol.

    One flat float32 update per client (``[m, layout.size]`` when materialised). FedRAP: the
    change of the shared item matrix C against the round's global C; FedRecGEL: the SAM
    gradient of the shared parameters. Subclasses may keep a structured form (FedRAP's update
    is a scaled copy of C plus a few changed rows) so that norms and weighted sums never need
    the dense ``[m, d]`` matrix; :meth:`dense` materialises rows when a protocol needs them.
    """

    clients: torch.Tensor
    layout: UpdateLayout

    def __len__(self) -> int:
        return int(self.clients.shape[0])

    @abc.abstractmethod
    def dense(self, rows: torch.Tensor | None = None) -> torch.Tensor:
        """The flat updates of ``rows`` (positions in ``clients``; all when None), ``[r, d]``."""

    def dense_block(self, lo: int, hi: int, out: torch.Tensor | None = None) -> torch.Tensor:
        """Coordinates ``lo .. hi - 1`` of every client's flat update, ``[m, hi - lo]``.

        What a streamed secure round encodes a block at a time (:mod:`securefed.privacy`).
        This default densifies every client's whole update (in chunks of clients) and keeps
        the block; uploads with structure override it with work proportional to the block.
        ``out``: a float32 ``[m, hi - lo]`` tensor to write the block into and return (a
        caller asking for many blocks reuses one instead of a fresh mapping each time).
        """
        m, size = len(self), self.layout.size
        out = block_buffer(out, m, hi - lo, zero=False)
        step = max(1, DENSE_BLOCK_FLOATS // max(size, 1))
        for a in range(0, m, step):
            rows = torch.arange(a, min(m, a + step), dtype=torch.long)
            out[a : a + rows.shape[0]] = self.dense(rows)[:, lo:hi]
        return out

    @abc.abstractmethod
    def norms(self) -> torch.Tensor:
        """L2 norm of every client's flat update, ``[m]`` (float64 accumulation)."""

    @abc.abstractmethod
    def weighted_sum(self, weights: torch.Tensor) -> torch.Tensor:
        """``sum_i weights[i] * update_i`` as a flat ``[d]`` float32 tensor."""


def block_buffer(
    out: torch.Tensor | None, m: int, w: int, *, zero: bool, device: torch.device | None = None
) -> torch.Tensor:
    """The tensor a :meth:`ClientUpdates.dense_block` writes: ``out`` (float32 ``[m, w]``,
    zeroed when ``zero``) or a new one (on ``device``)."""
    if out is None:
        return torch.zeros(m, w, device=device) if zero else torch.empty(m, w, device=device)
    if out.shape != (m, w) or out.dtype != torch.float32:
        raise ValueError(f"out must be float32 [{m}, {w}], got {out.dtype} {tuple(out.shape)}")
    return out.zero_() if zero else out


@dataclass(frozen=True)
class DenseUpdates(ClientUpdates):
    """Client updates held as one dense ``[m, d]`` float32 matrix."""

    clients: torch.Tensor
    vectors: torch.Tensor
    layout: UpdateLayout

    def __post_init__(self) -> None:
        if self.vectors.ndim != 2 or self.vectors.shape[1] != self.layout.size:
            raise ValueError(
                f"updates must be [clients, {self.layout.size}], got {tuple(self.vectors.shape)}"
            )
        if self.clients.shape[0] != self.vectors.shape[0]:
            raise ValueError("one update row per client is required")

    def dense(self, rows: torch.Tensor | None = None) -> torch.Tensor:
        return self.vectors if rows is None else self.vectors[rows]

    def dense_block(self, lo: int, hi: int, out: torch.Tensor | None = None) -> torch.Tensor:
        if out is None:
            return self.vectors[:, lo:hi]
        return block_buffer(out, len(self), hi - lo, zero=False).copy_(self.vectors[:, lo:hi])

    def norms(self) -> torch.Tensor:
        return torch.linalg.vector_norm(self.vectors.double(), dim=1)

    def weighted_sum(self, weights: torch.Tensor) -> torch.Tensor:
        return weights.to(self.vectors.dtype) @ self.vectors


@dataclass(frozen=True)
class Aggregate:
    """What the server learns from a round: the (possibly noised) sum and how to average it.

    ``mean`` is ``total / denominator``. Without DP the denominator is the number of
    contributors; DP-FedAvg with Poisson sampling uses the fixed expected cohort size.
    ``noise_std`` is the per-coordinate standard deviation of the DP noise in ``total``
    (``noise_multiplier * clip``; 0 without user-level noise): public, so a server step may
    use it to tell signal from noise (fedals's private mode does).
    """

    total: torch.Tensor
    contributors: int
    denominator: float
    noise_std: float = 0.0

    @property
    def mean(self) -> torch.Tensor:
        return self.total / self.denominator


@dataclass(frozen=True)
class RoundStats:
    """Per-round training statistics reported by a recommender."""

    loss: float
    samples: int


@runtime_checkable
class Recommender(Protocol):
    """A federated recommender whose clients are simulated together, batched."""

    name: str
    layout: UpdateLayout

    def client_round(
        self, participants: torch.Tensor, round_index: int, generator: torch.Generator
    ) -> tuple[ClientUpdates, RoundStats]:
        """Train all ``participants`` locally (batched) and return their uploads."""
        ...

    def apply_aggregate(self, aggregate: Aggregate, round_index: int) -> None:
        """The server's model step from the aggregate of the round."""
        ...

    def end_round(self, round_index: int) -> None:
        """Bookkeeping after a round (learning-rate decay, ...)."""
        ...

    def score(self, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        """Personalised scores ``[B, K]`` of ``items[b]`` for ``users[b]`` (higher = better)."""
        ...

    def score_all(self, users: torch.Tensor) -> torch.Tensor:
        """Personalised scores ``[B, n_items]`` of every item for each user."""
        ...

    def global_parameters(self) -> dict[str, torch.Tensor]:
        """The shared parameters every participant receives (named as in ``layout``)."""
        ...

    def set_global_parameters(self, tensors: dict[str, torch.Tensor]) -> None:
        """Install the server's shared parameters (a node receiving the round's model)."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume training exactly (global and private state).

        A model may also define ``run_notes()``: lines saying what it decided from the
        released statistics while it trained (fedals's noise-limited head rule), which the
        run's ``summary.json`` keeps as ``model_notes`` and ``securefed train`` prints.

        A model may also define ``checkpoint_state()``: the same state in a smaller form
        that its ``load_state_dict`` reads back to the same bits; checkpoints store that form
        (FedRAP's sparse private views, :meth:`securefed.models.fedrap.FedRAP.checkpoint_state`).
        """
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@runtime_checkable
class CentralizedRecommender(Protocol):
    """A centralized reference: the server fits on every interaction (no clients, no uploads).

    Used as a yardstick next to the federated models (``ModelSpec.role == "centralized"``).
    """

    name: str

    def fit_round(self, round_index: int, generator: torch.Generator) -> RoundStats:
        """One fitting step (an ALS sweep, or the whole closed-form fit in round 0)."""
        ...

    def score(self, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor: ...

    def score_all(self, users: torch.Tensor) -> torch.Tensor: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...
