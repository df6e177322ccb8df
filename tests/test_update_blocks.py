"""ClientUpdates.dense_block: any block of coordinates of every upload, as dense() has it.

A streamed secure round (securefed.privacy.EncodedBlocks) encodes uploads a block at a time;
each structured upload's block must be the same floats as the slice of its dense form.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from securefed.federation.base import DenseUpdates, UpdateLayout
from securefed.models.fedals import FedALSUpdates, fedals_layout
from securefed.models.fedrap import FedRAPUpdates
from securefed.models.mostpop import MostPopUpdates
from securefed.models.registry import get_spec, model_names


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
    if kind == "fedrecgel":
        from securefed.models.fedrecgel import FedRecGELUpdates

        layout = UpdateLayout(
            names=("embed_item_gmf", "embed_item_mlp", "mlp.0.weight", "predict.bias"),
            shapes=((n_items, dim), (n_items, 4), (3, 5), (1,)),
        )
        return FedRecGELUpdates(
            clients=torch.arange(m),
            layout=layout,
            pair_client=client,
            pair_item=item,
            pair_gmf=torch.randn(len(client), dim, generator=gen),
            pair_mlp=torch.randn(len(client), 4, generator=gen),
            rest=torch.randn(m, 16, generator=gen),
        )
    if kind == "fedals-plain":  # no counts, Gram scales or co-occurrence pairs given
        return FedALSUpdates(
            clients=torch.arange(m),
            layout=fedals_layout(n_items, dim),
            x=torch.randn(m, dim, generator=gen),
            pair_client=client,
            pair_item=item,
            coef=torch.randn(len(client), generator=gen),
        )
    # fedals with every part: float64 factors, per-pair counts, Gram scales, co-occurrences
    gram = 5
    pairs = gram * (gram - 1) // 2
    cooc_client = torch.arange(m).repeat_interleave(3)
    cooc_index = torch.cat([torch.randperm(pairs, generator=gen)[:3] for _ in range(m)])
    return FedALSUpdates(
        clients=torch.arange(m),
        layout=fedals_layout(n_items, dim, gram),
        x=torch.randn(m, dim, generator=gen, dtype=torch.float64),
        pair_client=client,
        pair_item=item,
        coef=torch.randn(len(client), generator=gen, dtype=torch.float64),
        count=torch.rand(len(client), generator=gen, dtype=torch.float64),
        gram_scale=torch.rand(m, generator=gen, dtype=torch.float64),
        cooc_client=cooc_client,
        cooc_index=cooc_index,
        cooc_value=torch.randn(len(cooc_client), generator=gen, dtype=torch.float64),
    )


@pytest.mark.parametrize(
    "kind", ["fedrap", "fedrecgel", "mostpop", "dense", "fedals-plain", "fedals"]
)
def test_dense_block_is_the_slice_of_dense(kind, monkeypatch):
    from securefed.federation import base

    monkeypatch.setattr(base, "DENSE_BLOCK_FLOATS", 100)  # the default's chunks of clients
    updates = _updates(kind)
    full = updates.dense()
    size = updates.layout.size
    # Inside one item row, across rows (partial at both ends), one coordinate, the whole, and
    # (FedRecGEL) across the GMF/MLP and MLP/rest boundaries.
    blocks = [(0, 3), (5, 17), (7, 8), (size - 9, size), (0, size), (11, 11 + size // 3)]
    blocks += [(23 * 6 - 5, 23 * 6 + 7), (23 * 10 - 3, 23 * 10 + 4), (23 * 6 + 9, size - 2)]
    # Every start, one coordinate and seven (each row edge at each end of a block).
    blocks += [(lo, min(size, lo + w)) for lo in range(size) for w in (1, 7)]
    for lo, hi in [(lo, hi) for lo, hi in blocks if 0 <= lo < hi <= size]:
        block = updates.dense_block(lo, hi)
        assert block.shape == (len(updates), hi - lo)
        torch.testing.assert_close(block, full[:, lo:hi], rtol=0, atol=0)
        # Into a reused buffer holding anything (a streamed round's per-thread block).
        buf = torch.full((len(updates), hi - lo), float("nan"))
        into = updates.dense_block(lo, hi, out=buf)
        assert into.data_ptr() == buf.data_ptr()
        torch.testing.assert_close(into, full[:, lo:hi], rtol=0, atol=0)
    with pytest.raises(ValueError, match="out must be float32"):
        updates.dense_block(0, 2, out=torch.zeros(len(updates), 3))


def test_models_that_stream_their_uploads_build_blocks_of_their_own_kind():
    """ModelSpec.streams_uploads promises an efficient dense_block: the flag is set exactly for
    the models whose update class overrides the default (FedRAP, FedRecGEL, fedals)."""
    from securefed.federation.base import ClientUpdates
    from securefed.models.fedrap import FedRAPUpdates
    from securefed.models.fedrecgel import FedRecGELUpdates

    streaming = {name for name in model_names() if get_spec(name).streams_uploads}
    assert streaming == {"fedrap", "fedrecgel", "fedals"}
    for cls in (FedRAPUpdates, FedRecGELUpdates, FedALSUpdates):
        assert cls.dense_block is not ClientUpdates.dense_block


def _ddg_source(monkeypatch, secure, seed=3, bound=None):
    """DiscreteGaussianBlocks over 6 clients' dense 50-float updates, tiles of 16 (``bound``:
    a tighter rounded-norm bound than the plan's, so that first roundings exceed it)."""
    from protocols.dp import DistributedDiscreteGaussian, distributed_noise_plan
    from protocols.secagg import FixedPointCodec
    from securefed import privacy

    monkeypatch.setattr(privacy, "ENCODE_TILE", 16)
    monkeypatch.setattr(privacy.DiscreteGaussianBlocks, "align", 16)
    gen = torch.Generator().manual_seed(seed)
    m, d, clip = 6, 50, 1.0
    x = torch.randn(m, d, generator=gen)
    x = x / x.norm(dim=1, keepdim=True) * clip  # every update at the clip: roundings retry
    layout = UpdateLayout(names=("v",), shapes=((d,),))
    plan = distributed_noise_plan(
        clip=clip, noise_multiplier=1.0, scale=7.3, dim=d, min_survivors=m, rounding_beta=0.6
    )
    if bound is not None:
        plan = dataclasses.replace(plan, l2_sensitivity_after_rounding=bound)
    codec = FixedPointCodec.for_sum(
        n_clients=m,
        clip=plan.l2_sensitivity_after_rounding / plan.scale,
        scale=plan.scale,
        extra_int_bound=int(plan.noise_sum_bound(1)),
    )
    updates = DenseUpdates(torch.arange(m), x, layout)
    source = privacy.DiscreteGaussianBlocks(
        updates,
        torch.ones(m),
        codec,
        DistributedDiscreteGaussian(plan=plan),
        seed=seed,
        round_index=2,
        secure=secure,
    )
    return source, x, plan


@pytest.mark.parametrize("secure", [False, True])
def test_streamed_distributed_dp_rounding_is_conditional_and_block_independent(monkeypatch, secure):
    """The rounding decided tile by tile before the round is a conditional randomized
    rounding of each client's whole vector (every coordinate one of its two neighbouring
    integers, every client's rounded norm within the plan's bound), and the blocks the engine
    asks for read the same rounding whatever their boundaries."""
    source, x, plan = _ddg_source(monkeypatch, secure)
    d = x.shape[1]
    whole = source.rounded(0, d)
    y = x.double() * plan.scale
    assert bool(((whole == torch.floor(y)) | (whole == torch.floor(y) + 1)).all())
    assert bool((whole.double().norm(dim=1) <= plan.l2_sensitivity_after_rounding).all())
    parts = torch.cat([source.rounded(a, min(d, a + 16)) for a in range(0, d, 16)], dim=1)
    assert torch.equal(parts, whole)
    assert torch.equal(torch.cat([source.rounded(0, 32), source.rounded(32, d)], 1), whole)
    # The ring inputs hold rounding plus noise: their sum decodes near the sum of roundings.
    ring = np.concatenate([source.block(0, 32), source.block(32, d)], axis=1)
    assert ring.dtype == np.uint64 and ring.shape == x.shape


def test_streamed_distributed_dp_rounding_retries_over_the_bound_and_replays(monkeypatch):
    """With a tight bound some first roundings exceed it and are redrawn (the stored bits
    change); a replay run's rounding and noise are the same on a second construction."""
    from securefed import privacy

    calls = []
    real_below = privacy.below

    def counting_below(p, generator, secure):
        calls.append(p.shape[0])
        return real_below(p, generator, secure)

    monkeypatch.setattr(privacy, "below", counting_below)
    a, x, plan = _ddg_source(monkeypatch, secure=False, bound=7.85)
    tiles = -(-x.shape[1] // 16)
    assert len(calls) > tiles  # a second attempt ran for some clients
    assert min(calls) < x.shape[0]  # ... only for the clients over the bound
    whole = a.rounded(0, x.shape[1])
    assert bool((whole.double().norm(dim=1) <= 7.85).all())
    b, _, _ = _ddg_source(monkeypatch, secure=False, bound=7.85)
    assert torch.equal(a.rounded(0, x.shape[1]), b.rounded(0, x.shape[1]))
    assert np.array_equal(a.block(0, 32), b.block(0, 32))


def test_encoded_blocks_do_not_depend_on_how_many_rows_are_encoded_at_once(monkeypatch):
    """A streamed block encodes each tile a few rows at a time: the same ring values as the
    whole tile at once (the tile's generator is consumed in C order either way)."""
    from protocols.secagg import FixedPointCodec
    from securefed import privacy

    monkeypatch.setattr(privacy, "ENCODE_TILE", 16)
    updates = _updates("fedals")
    codec = FixedPointCodec.for_sum(n_clients=len(updates), clip=1000.0, scale_bits=16)
    factors = torch.rand(len(updates), generator=torch.Generator().manual_seed(3))

    def blocks(piece_bytes: int) -> np.ndarray:
        monkeypatch.setattr(privacy, "_TILE_PIECE_BYTES", piece_bytes)
        source = privacy.EncodedBlocks(
            updates, factors, codec, seed=4, stream="secagg-encode", round_index=1
        )
        size = updates.layout.size
        # .copy(): a source reuses its buffer for this thread's next block.
        return np.concatenate(
            [source.block(a, min(size, a + 48)).copy() for a in range(0, size, 48)], axis=1
        )

    whole, rows = blocks(1 << 30), blocks(16 * 8 * 2)  # all rows, then 2 rows at a time
    assert np.array_equal(whole, rows)
    source = privacy.EncodedBlocks(updates, factors, codec, seed=4, stream="s", round_index=1)
    first = source.block(0, 48)
    assert source.block(48, 96) is first  # one buffer per thread, reused
    expected = codec.encode(
        (updates.dense() * factors.unsqueeze(1))[:, :16].numpy(),
        rng=privacy.numpy_generator(4, "secagg-encode", 1, 0),
    )
    assert np.array_equal(whole[:, :16], expected)


def _secure_ddg(seed: int, m: int, d: int):
    """Unit-norm updates ``[m, d]`` and the distributed discrete Gaussian (scale 40,
    multiplier 1) with its codec, for the OS-randomness encodings below."""
    from protocols.dp import DistributedDiscreteGaussian, distributed_noise_plan
    from protocols.secagg import FixedPointCodec

    x = torch.randn(m, d, generator=torch.Generator().manual_seed(seed))
    x = x / x.norm(dim=1, keepdim=True)
    plan = distributed_noise_plan(
        clip=1.0, noise_multiplier=1.0, scale=40.0, dim=d, min_survivors=m, rounding_beta=0.6
    )
    codec = FixedPointCodec.for_sum(
        n_clients=m,
        clip=plan.l2_sensitivity_after_rounding / plan.scale,
        scale=plan.scale,
        extra_int_bound=int(plan.noise_sum_bound(1)),
    )
    return x, DistributedDiscreteGaussian(plan=plan), codec


def _signed(ring: np.ndarray, bits: int) -> np.ndarray:
    shift = 64 - bits
    return (ring << np.uint64(shift)).view(np.int64) >> np.int64(shift)


def test_secure_encode_rows_rounds_and_noises_every_row_in_independent_blocks(monkeypatch):
    """encode_rows on OS randomness works a few rows at a time on threads (blocks of two rows
    here): every client's ring input is its conditional rounding plus its own noise share,
    whatever block it fell in (a block left without noise, or two blocks drawing the same
    stream, would show), and a rounding that fails in a thread surfaces as the error."""
    from protocols.errors import ProtocolError
    from securefed import privacy

    m, d = 9, 4000
    monkeypatch.setattr(privacy, "SECURE_CHUNK", 2 * d)
    x, ddg, codec = _secure_ddg(11, m, d)
    plan = ddg.plan
    ring = privacy.encode_rows(
        x, codec, ddg, secure=True, round_gen=None, noise_gen=None, rng=np.random.default_rng(0)
    )
    ints = _signed(ring, codec.modulus_bits)
    y = x.double().numpy() * plan.scale
    noise = ints - np.floor(y)  # the rounding's 0 or 1 plus the noise share
    sigma = plan.share_sigma
    for row in noise:  # every client has its share: variance sigma^2 (+ <= 1/4 of rounding)
        assert abs(row.var() / sigma**2 - 1) < 0.1
        assert abs(row.mean() - 0.5) < 5 * sigma / d**0.5
    assert len({row.tobytes() for row in noise}) == m
    far = x.clone()
    far[4] *= 50  # not clipped to the plan's norm: its rounding can never fit the bound
    with pytest.raises(ProtocolError, match="exceeded the rounded L2 bound"):
        privacy.encode_rows(
            far,
            codec,
            ddg,
            secure=True,
            round_gen=None,
            noise_gen=None,
            rng=np.random.default_rng(0),
        )


def test_streamed_secure_block_is_rounding_plus_a_noise_share_in_every_row_piece(monkeypatch):
    """On OS randomness a DiscreteGaussianBlocks block is made a few rows at a time (two here)
    into the thread's buffer: every client's ring input is its stored conditional rounding
    plus its own noise share (a row piece left without noise, or two pieces drawing the same
    stream, would show); a second block reuses the buffer."""
    from securefed import privacy

    m, d = 5, 4096
    monkeypatch.setattr(privacy, "SECURE_CHUNK", 2 * d)
    x, ddg, codec = _secure_ddg(3, m, d)
    layout = UpdateLayout(names=("v",), shapes=((d,),))
    updates = DenseUpdates(torch.arange(m), x, layout)
    source = privacy.DiscreteGaussianBlocks(
        updates, torch.ones(m), codec, ddg, seed=0, round_index=1, secure=True
    )
    rounded = source.rounded(0, d).numpy()
    ring = source.block(0, d)
    assert ring.shape == (m, d) and ring.dtype == np.uint64
    noise = _signed(ring, codec.modulus_bits) - rounded
    sigma = ddg.plan.share_sigma
    for row in noise:
        assert abs(row.var() / sigma**2 - 1) < 0.1 and abs(row.mean()) < 5 * sigma / d**0.5
    assert len({row.tobytes() for row in noise}) == m
    again = source.block(0, d)
    assert again is ring  # the thread's buffer, refilled with fresh shares
    assert not np.array_equal(again, (rounded % 2**codec.modulus_bits).astype(np.uint64))
