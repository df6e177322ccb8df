"""ClientUpdates.dense_block: any block of coordinates of every upload, as dense() has it.

A streamed secure round (securefed.privacy.EncodedBlocks) encodes uploads a block at a time;
each structured upload's block must be the same floats as the slice of its dense form.
"""

from __future__ import annotations

import pytest
import torch

from securefed.federation.base import DenseUpdates, UpdateLayout
from securefed.models.fedals import FedALSUpdates, fedals_layout
from securefed.models.fedrap import FedRAPUpdates
from securefed.models.mostpop import MostPopUpdates


def _pairs(gen, m, n_items, per_client):
    client = torch.arange(m).repeat_interleave(per_client)
    item = torch.cat([torch.randperm(n_items, generator=gen)[:per_client] for _ in range(m)])
    return client, item


def _updates(kind):
    gen = torch.Generator().manual_seed(7)
    m, n_items, dim = 5, 23, 6
    client, item = _pairs(gen, m, n_items, 4)
    if kind == "fedrap":
        layout = UpdateLayout(names=("C",), shapes=((n_items, dim),))
        return FedRAPUpdates(
            clients=torch.arange(m),
            layout=layout,
            global_c=torch.randn(n_items, dim, generator=gen),
            scale=torch.rand(m, generator=gen) + 0.5,
            pair_client=client,
            pair_item=item,
            pair_rows=torch.randn(len(client), dim, generator=gen),
        )
    if kind == "mostpop":
        layout = UpdateLayout(names=("counts",), shapes=((n_items,),))
        weight = torch.rand(len(client), generator=gen, dtype=torch.float64)
        return MostPopUpdates(
            clients=torch.arange(m),
            layout=layout,
            pair_client=client,
            pair_item=item,
            weight=weight,
        )
    if kind == "dense":
        layout = UpdateLayout(names=("v",), shapes=((n_items * dim,),))
        return DenseUpdates(torch.arange(m), torch.randn(m, n_items * dim, generator=gen), layout)
    # fedals: the base class's default (densify chunks of clients, keep the block)
    return FedALSUpdates(
        clients=torch.arange(m),
        layout=fedals_layout(n_items, dim),
        x=torch.randn(m, dim, generator=gen),
        pair_client=client,
        pair_item=item,
        coef=torch.randn(len(client), generator=gen),
    )


@pytest.mark.parametrize("kind", ["fedrap", "mostpop", "dense", "fedals"])
def test_dense_block_is_the_slice_of_dense(kind, monkeypatch):
    from securefed.federation import base

    monkeypatch.setattr(base, "DENSE_BLOCK_FLOATS", 100)  # the default's chunks of clients
    updates = _updates(kind)
    full = updates.dense()
    size = updates.layout.size
    # Inside one item row, across rows (partial at both ends), one coordinate, the whole.
    for lo, hi in [(0, 3), (5, 17), (7, 8), (size - 9, size), (0, size), (11, 11 + size // 3)]:
        block = updates.dense_block(lo, hi)
        assert block.shape == (len(updates), hi - lo)
        torch.testing.assert_close(block, full[:, lo:hi], rtol=0, atol=0)
