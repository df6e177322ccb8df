"""FedRAP's private item views stored as one shared base plus the rows that were written.

Every user's view ``D_u`` starts as the same ``d0`` ``[items, dim]``, and the batched
simulation never rewrites a row that no local step touched (weight decay lives in a per-user
scale, :class:`securefed.models.fedrap.FedRAP`), so an unwritten row ``D_u[i]`` is bit for
bit ``d0[i]``. :class:`SparseViews` keeps ``d0`` once and the written rows keyed by
``user * items + item`` (sorted ``int64`` keys, rows in key order): memory grows with the
(user, item) pairs trained on, not with ``users x items``. Lookups are one
``torch.searchsorted``; a round's new keys are merged in once, all batched.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

__all__ = ["SparseViews", "changed_rows"]


def changed_rows(
    dense: torch.Tensor, base: torch.Tensor, *, release: Callable[[], None] | None = None
) -> torch.Tensor:
    """``[users, items]`` bool: which rows of a dense ``D`` ``[users, items, dim]`` differ in
    their bits from ``base`` ``[items, dim]`` (compared about 64 MiB of ``D`` at a time, and
    ``release`` called after each block: a paged ``D``'s pages leave the resident set)."""
    n_users, n_items, dim = dense.shape
    if base.shape != (n_items, dim):
        raise ValueError(
            f"a dense D of shape {tuple(dense.shape)} does not match the base view "
            f"{tuple(base.shape)}"
        )
    bits = base.contiguous().view(torch.int32)
    out = torch.empty(n_users, n_items, dtype=torch.bool, device=dense.device)
    step = max(1, (1 << 24) // max(1, n_items * dim))
    for lo in range(0, n_users, step):
        block = dense[lo : lo + step].contiguous().view(torch.int32)
        torch.any(block != bits, dim=2, out=out[lo : lo + step])
        if release is not None:
            release()
    return out


class SparseViews:
    """``D`` ``[users, items, dim]`` as a base ``[items, dim]`` plus written rows.

    Attributes:
        base: The initial view every user starts from, ``[items, dim]``.
        n_users: Users the views belong to.
        keys: Sorted, unique ``user * items + item`` of the written rows, ``int64 [n]``.
        rows: The written rows in key order, ``[n, dim]`` (the base's dtype).
    """

    def __init__(
        self,
        base: torch.Tensor,
        n_users: int,
        keys: torch.Tensor | None = None,
        rows: torch.Tensor | None = None,
    ) -> None:
        """Views with no written row, or with ``keys`` and ``rows`` (validated, taken over).

        Raises:
            ValueError: if the keys are not sorted, unique and inside ``users x items``, or
                the rows do not match them and the base.
        """
        if base.dim() != 2:
            raise ValueError(f"the base view must be [items, dim], got {tuple(base.shape)}")
        self.base = base.contiguous()
        self.n_users = int(n_users)
        n_items, dim = base.shape
        if keys is None:  # nothing written yet
            keys = torch.zeros(0, dtype=torch.long, device=base.device)
        if rows is None:
            rows = torch.zeros(0, dim, dtype=base.dtype, device=base.device)
        if keys.dtype != torch.long or keys.dim() != 1:
            raise ValueError(f"D_keys must be a 1-d int64 tensor, got {keys.dtype} {keys.dim()}-d")
        if rows.shape != (keys.shape[0], dim):
            raise ValueError(
                f"D_rows has shape {tuple(rows.shape)}, expected {(keys.shape[0], dim)}"
            )
        if keys.numel():
            if bool((keys.diff() <= 0).any()):
                raise ValueError("D_keys must be strictly increasing (sorted, no repeats)")
            if int(keys[0]) < 0 or int(keys[-1]) >= self.n_users * n_items:
                raise ValueError(
                    f"D_keys must lie in [0, {self.n_users * n_items}) "
                    f"({self.n_users} users x {n_items} items)"
                )
        self.keys = keys.contiguous()
        self.rows = rows.to(base.dtype).contiguous()

    @property
    def n_items(self) -> int:
        """Items of every view."""
        return int(self.base.shape[0])

    def __len__(self) -> int:
        """Written rows."""
        return int(self.keys.shape[0])

    def nbytes(self) -> int:
        """Bytes held: the base, the keys and the rows."""
        return sum(t.numel() * t.element_size() for t in (self.base, self.keys, self.rows))

    def _find(self, flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(position, hit)`` of every key of ``flat`` in :attr:`keys` (position clamped)."""
        n = self.keys.shape[0]
        if not n:
            return torch.zeros_like(flat), torch.zeros_like(flat, dtype=torch.bool)
        pos = torch.searchsorted(self.keys, flat).clamp_max_(n - 1)
        return pos, self.keys.index_select(0, pos.reshape(-1)).view(flat.shape) == flat

    def gather(self, flat: torch.Tensor) -> torch.Tensor:
        """The rows ``D[flat // items, flat % items]``, ``[*flat.shape, dim]`` (copies).

        A written key gives its stored row, any other key the base row: the same bits a dense
        ``D`` would hold there.
        """
        shape = flat.shape
        flat = flat.reshape(-1)
        out = self.base.index_select(0, flat % self.n_items)
        pos, hit = self._find(flat)
        at = torch.nonzero(hit).squeeze(1)
        if at.numel():
            out.index_copy_(0, at, self.rows.index_select(0, pos.index_select(0, at)))
        return out.view(*shape, self.base.shape[1])

    def put(self, flat: torch.Tensor, values: torch.Tensor) -> None:
        """Write ``values`` ``[k, dim]`` at the unique keys ``flat`` ``[k]`` (any order).

        Keys already written are overwritten in place; the new ones are merged into the
        sorted keys in one pass (their insertion points from ``searchsorted``).
        """
        values = values.to(self.rows.dtype)
        pos, hit = self._find(flat)
        old = torch.nonzero(hit).squeeze(1)
        if old.numel():
            self.rows.index_copy_(0, pos.index_select(0, old), values.index_select(0, old))
        new = torch.nonzero(~hit).squeeze(1)
        if not new.numel():
            return
        new_keys, order = torch.sort(flat.index_select(0, new))
        new_rows = values.index_select(0, new.index_select(0, order))
        n, k = self.keys.shape[0], new_keys.shape[0]
        at = torch.searchsorted(self.keys, new_keys) + torch.arange(k, device=new_keys.device)
        is_new = torch.zeros(n + k, dtype=torch.bool, device=new_keys.device)
        is_new[at] = True
        old_at = torch.nonzero(~is_new).squeeze(1)
        keys = torch.empty(n + k, dtype=torch.long, device=new_keys.device)
        keys[at] = new_keys
        keys[old_at] = self.keys
        rows = torch.empty(n + k, self.rows.shape[1], dtype=self.rows.dtype, device=new_keys.device)
        rows.index_copy_(0, at, new_rows)
        rows.index_copy_(0, old_at, self.rows)
        self.keys, self.rows = keys, rows

    def _written_of(self, users: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The written rows of ``users`` ``[n]``: ``(position in users, index in rows, item)``,
        each ``int64 [k]``, grouped by position."""
        n_items = self.base.shape[0]
        dev = self.keys.device
        lo = torch.searchsorted(self.keys, users * n_items)
        count = torch.searchsorted(self.keys, (users + 1) * n_items) - lo
        total = int(count.sum())
        local = torch.repeat_interleave(torch.arange(users.shape[0], device=dev), count)
        idx = lo.index_select(0, local) + torch.arange(total, device=dev)
        idx -= (torch.cumsum(count, 0) - count).index_select(0, local)
        return local, idx, self.keys.index_select(0, idx) % n_items

    def user_block(self, users: torch.Tensor) -> torch.Tensor:
        """The dense views of ``users`` ``[n]``: a new ``[n, items, dim]`` tensor."""
        n_items, dim = self.base.shape
        out = self.base.unsqueeze(0).repeat(users.shape[0], 1, 1)
        if self.keys.numel() and users.shape[0]:
            local, idx, item = self._written_of(users)
            out.view(-1, dim).index_copy_(0, local * n_items + item, self.rows.index_select(0, idx))
        return out

    def user_products(self, users: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """``D_u[i] . w_u`` for ``users`` ``[n]`` against every item, ``[n, items]``.

        One matmul against the base for every (user, item), then the written rows of these
        users replace their entries: ``n x items`` floats and the users' written rows, never
        their ``[n, items, dim]`` views. Equal to the dense product up to float summation
        order (the matmul and a per-row dot product may add the ``dim`` terms differently).
        """
        n_items = self.base.shape[0]
        out = w @ self.base.T
        if self.keys.numel() and users.shape[0]:
            local, idx, item = self._written_of(users)
            dots = (self.rows.index_select(0, idx) * w.index_select(0, local)).sum(dim=1)
            out.view(-1).index_copy_(0, local * n_items + item, dots.to(out.dtype))
        return out

    def dense(self) -> torch.Tensor:
        """Every user's view, ``[users, items, dim]`` (``users x items x dim`` floats)."""
        dim = self.base.shape[1]
        out = self.base.unsqueeze(0).repeat(self.n_users, 1, 1)
        out.view(-1, dim).index_copy_(0, self.keys, self.rows)
        return out

    def written_mask(self) -> torch.Tensor:
        """``[users * items]`` bool: which rows are stored."""
        mask = torch.zeros(self.n_users * self.n_items, dtype=torch.bool, device=self.keys.device)
        mask[self.keys] = True
        return mask

    @classmethod
    def from_dense(cls, dense: torch.Tensor, base: torch.Tensor) -> SparseViews:
        """The sparse form of a dense ``[users, items, dim]``: the rows whose bits differ
        from ``base`` are stored (:func:`changed_rows`)."""
        keys = torch.nonzero(changed_rows(dense, base).reshape(-1)).squeeze(1)
        rows = dense.reshape(-1, dense.shape[2]).index_select(0, keys)
        return cls(base, dense.shape[0], keys, rows.to(base.dtype))

    @classmethod
    def from_mask(
        cls, base: torch.Tensor, mask: torch.Tensor, rows: torch.Tensor, n_users: int
    ) -> SparseViews:
        """The views of a checkpoint's packed ``[users, items]`` bit mask and its rows
        (:meth:`securefed.models.fedrap.FedRAP.checkpoint_state`'s dense-model form).

        Raises:
            ValueError: if the mask, the rows and the base do not describe one matrix.
        """
        cells = n_users * base.shape[0]
        if mask.dtype != torch.uint8 or mask.numel() != (cells + 7) // 8:
            raise ValueError(f"D_mask holds {mask.numel()} bytes, expected {(cells + 7) // 8}")
        changed = np.unpackbits(mask.cpu().numpy(), count=cells).astype(bool)
        keys = torch.from_numpy(np.flatnonzero(changed).astype(np.int64)).to(base.device)
        return cls(base, n_users, keys, rows.to(base.device))
