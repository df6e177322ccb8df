"""Properties of per-participant L2 clipping."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from protocols.dp import clip_rows
from protocols.errors import ConfigError, DataError

finite = st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False, width=32)
updates = st.integers(1, 8).flatmap(
    lambda m: st.integers(1, 16).flatmap(lambda d: arrays(np.float32, (m, d), elements=finite))
)
clips = st.floats(1e-3, 1e3, allow_nan=False)


@settings(max_examples=200, deadline=None)
@given(x=updates, clip=clips)
def test_clipped_norm_never_exceeds_clip(x: np.ndarray, clip: float) -> None:
    clipped, _ = clip_rows(torch.from_numpy(x), clip)
    # Exact norms of the float32 result, computed in float64.
    norms = np.linalg.norm(clipped.numpy().astype(np.float64), axis=1)
    assert (norms <= clip).all()


@settings(max_examples=200, deadline=None)
@given(x=updates, clip=clips)
def test_short_rows_unchanged_and_long_rows_keep_direction(x: np.ndarray, clip: float) -> None:
    t = torch.from_numpy(x)
    clipped, norms = clip_rows(t, clip)
    ref = np.linalg.norm(x.astype(np.float64), axis=1)
    np.testing.assert_allclose(norms.numpy(), ref, rtol=1e-12)
    short = ref <= clip
    assert torch.equal(clipped[torch.from_numpy(short)], t[torch.from_numpy(short)])
    for i in np.flatnonzero(~short):
        a = x[i].astype(np.float64)
        b = clipped[i].numpy().astype(np.float64)
        cos = a @ b / (np.linalg.norm(a) * np.linalg.norm(b))
        assert cos == pytest.approx(1.0, abs=1e-6)
        # Clipped rows land on the sphere (up to the documented 2**-20 shrink).
        assert np.linalg.norm(b) == pytest.approx(clip, rel=1e-5)


def test_clip_rows_is_batched_and_keeps_dtype() -> None:
    x = torch.full((3, 4), 2.0, dtype=torch.float64)
    clipped, norms = clip_rows(x, 1.0)
    assert clipped.dtype == torch.float64
    assert norms.tolist() == [4.0, 4.0, 4.0]
    assert not torch.equal(clipped, x)


@pytest.mark.parametrize("clip", [0.0, -1.0, float("nan"), float("inf"), True, "1"])
def test_bad_clip_is_config_error(clip: object) -> None:
    with pytest.raises(ConfigError, match="clip must be"):
        clip_rows(torch.ones(2, 2), clip)  # type: ignore[arg-type]


def test_bad_updates_are_data_errors() -> None:
    with pytest.raises(DataError, match="2-D floating"):
        clip_rows(torch.ones(3), 1.0)
    with pytest.raises(DataError, match="2-D floating"):
        clip_rows(torch.ones(2, 2, dtype=torch.int64), 1.0)
    with pytest.raises(DataError, match="NaN or infinite"):
        clip_rows(torch.tensor([[1.0, float("nan")]]), 1.0)


def test_clip_scales_is_clip_rows_rule_for_structured_updates():
    """``clip_scales`` gives the factor ``clip_rows`` applies: exactly 1 at or under the clip,
    ``clip (1 - 2^-20) / norm`` above it, so that a scaled float32 update never exceeds the
    clip; ``inf`` clips nothing; a bad clip is refused."""
    from protocols.dp import clip_scales

    gen = torch.Generator().manual_seed(3)
    x = (
        torch.randn(64, 300, generator=gen, dtype=torch.float32)
        * torch.logspace(-2, 2, 64)[:, None]
    )
    clip = 1.5
    norms = torch.linalg.vector_norm(x.double(), dim=1)
    f = clip_scales(norms, clip)
    assert f.dtype == torch.float32
    assert bool((f[norms <= clip] == 1.0).all()) and bool((f[norms > clip] < 1.0).all())
    clipped, _ = clip_rows(x, clip)
    assert torch.equal((x * f[:, None]).to(torch.float32)[norms <= clip], clipped[norms <= clip])
    scaled = torch.linalg.vector_norm((x * f[:, None]).double(), dim=1)
    assert bool((scaled <= clip).all())
    assert torch.allclose(
        scaled[norms > clip], torch.full_like(scaled[norms > clip], clip), rtol=1e-5
    )
    # At the boundary: a norm exactly at the clip is kept, one ulp above is scaled.
    edge = torch.tensor([clip, math.nextafter(clip, math.inf)], dtype=torch.float64)
    assert clip_scales(edge, clip).tolist()[0] == 1.0 and clip_scales(edge, clip)[1] < 1.0
    assert bool((clip_scales(norms, math.inf) == 1.0).all())
    for bad in (0.0, -1.0, float("nan"), True, "1"):
        with pytest.raises(ConfigError, match="clip must be a number > 0"):
            clip_scales(norms, bad)  # type: ignore[arg-type]
