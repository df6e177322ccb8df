"""The fixed-point ring never wraps, even at the largest cohort and clip it is built for."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocols.errors import ConfigError
from protocols.secagg import FixedPointCodec, SecAggConfig, secure_sum


def _ring_sum(codec: FixedPointCodec, rows: np.ndarray) -> np.ndarray:
    return rows.sum(axis=0, dtype=np.uint64) & codec.mask


@pytest.mark.slow
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_flower_overflow_case_2100_clients_320_values_at_the_clip_extremes(sign):
    """Flower's SecAgg+ returned a sum off by ~70 here; the codec's ring cannot wrap."""
    n, d, clip = 2100, 320, 3.0
    codec = FixedPointCodec.for_sum(n_clients=n, clip=clip, scale_bits=16)
    x = np.full((n, d), sign * clip)
    ring = codec.encode(x, rng=np.random.default_rng(0))
    cfg = SecAggConfig(n_clients=n, neighbours=4, threshold=3, modulus_bits=codec.modulus_bits)
    res = secure_sum(ring, config=cfg, round_index=0, public_seed=b"flower-overflow!")
    got = codec.decode_sum(res.sum)
    assert np.max(np.abs(got - sign * clip * n)) <= codec.max_decode_error(n)


@pytest.mark.parametrize("scale_bits", [40, 51])
def test_largest_ring_the_config_allows_does_not_wrap(scale_bits):
    n, clip = 2100, 1.0
    codec = FixedPointCodec.for_sum(n_clients=n, clip=clip, scale_bits=scale_bits)
    assert codec.modulus_bits <= 64
    rng = np.random.default_rng(1)
    for sign in (1.0, -1.0):
        ring = codec.encode(np.full((n, 8), sign * clip), rng=rng)
        got = codec.decode_sum(_ring_sum(codec, ring))
        assert np.max(np.abs(got - sign * n * clip)) <= codec.max_decode_error(n)


def test_ring_size_is_minimal_and_one_more_client_would_need_more_bits():
    codec = FixedPointCodec.for_sum(n_clients=2100, clip=1.0, scale_bits=20)
    bound = codec.n_clients * codec.per_client_bound
    assert bound < 1 << (codec.modulus_bits - 1) <= 2 * bound


def test_too_large_for_64_bits_is_a_config_error():
    with pytest.raises(ConfigError, match="64"):
        FixedPointCodec.for_sum(n_clients=2100, clip=1.0, scale_bits=52)


def test_integer_noise_bound_enters_the_ring_and_is_enforced():
    n, d = 500, 16
    noise_bound = 1 << 20
    codec = FixedPointCodec.for_sum(
        n_clients=n, clip=1.0, scale_bits=12, extra_int_bound=noise_bound
    )
    rng = np.random.default_rng(2)
    x = codec.encode(np.full((n, d), 1.0), rng=rng)
    noise = codec.to_ring(np.full((n, d), noise_bound, dtype=np.int64))
    got = codec.decode_sum(_ring_sum(codec, codec.add(x, noise)))
    expected = n * 1.0 + n * noise_bound / codec.scale
    assert np.max(np.abs(got - expected)) <= codec.max_decode_error(n)
    with pytest.raises(ConfigError):
        codec.to_ring(np.array([noise_bound + 1]))


def test_encode_rejects_values_beyond_clip_and_nan():
    codec = FixedPointCodec.for_sum(n_clients=3, clip=1.0, scale_bits=8)
    for bad in (np.array([1.5]), np.array([np.nan])):
        with pytest.raises(ConfigError):
            codec.encode(bad, rng=np.random.default_rng(0))


def test_encode_in_blocks_equals_one_pass_in_c_order(monkeypatch):
    """encode works in blocks (its temporaries stay in cache): the result must be the one-pass
    formula floor(x * scale + U) with the uniforms drawn in C order, across block edges, for
    float32 input widened before scaling, and a bad value in a later block must still refuse."""
    from protocols.secagg import fixedpoint

    monkeypatch.setattr(fixedpoint, "BLOCK", 7)  # 5 x 9 = 45 elements: 7 blocks, the last short
    codec = FixedPointCodec.for_sum(n_clients=4, clip=3.0, scale=1000.3)  # not a power of 2
    x = np.random.default_rng(1).uniform(-3, 3, size=(5, 9))
    for inp in (x, x.astype(np.float32), np.asfortranarray(x)):
        wide = np.asarray(inp, dtype=np.float64)
        q = np.floor(wide * codec.scale + np.random.default_rng(9).random(wide.shape))
        want = q.astype(np.int64).view(np.uint64) & codec.mask
        got = codec.encode(inp, rng=np.random.default_rng(9))
        assert got.dtype == np.uint64 and got.shape == inp.shape
        np.testing.assert_array_equal(got, want)
    bad = x.copy()
    bad[4, 8] = np.nan  # the last element: in the last block
    with pytest.raises(ConfigError, match="clip=3.0"):
        codec.encode(bad, rng=np.random.default_rng(0))
    ints = np.array([[-5, 7], [0, -1]], dtype=np.int64)
    for values in (ints, ints.astype(np.int32)):
        np.testing.assert_array_equal(
            codec.encode_integers(values), ints.astype(np.uint64) & codec.mask
        )
    monkeypatch.undo()  # the default block size for the larger array
    # float32 is widened before the product: a float32 product x * 1000.3 moves ~1e-4 of the
    # floors at this size (tens of elements), which the comparison would catch.
    x32 = np.random.default_rng(2).uniform(-3, 3, size=200_000).astype(np.float32)
    q = np.floor(x32.astype(np.float64) * codec.scale + np.random.default_rng(4).random(x32.size))
    want = q.astype(np.int64).view(np.uint64) & codec.mask
    np.testing.assert_array_equal(codec.encode(x32, rng=np.random.default_rng(4)), want)


@settings(max_examples=80, deadline=None)
@given(
    n=st.integers(1, 50),
    d=st.integers(1, 20),
    scale_bits=st.integers(0, 30),
    clip=st.floats(1e-3, 1e3),
    seed=st.integers(0, 2**32 - 1),
)
def test_round_trip_error_within_bound(n, d, scale_bits, clip, seed):
    codec = FixedPointCodec.for_sum(n_clients=n, clip=clip, scale_bits=scale_bits)
    rng = np.random.default_rng(seed)
    x = rng.uniform(-clip, clip, size=(n, d))
    got = codec.decode_sum(_ring_sum(codec, codec.encode(x, rng=rng)))
    assert np.max(np.abs(got - x.sum(axis=0))) <= codec.max_decode_error(n)


@pytest.mark.statistical
def test_stochastic_rounding_is_unbiased():
    """Mean of q - x*scale over m draws; |mean| < z * sd / sqrt(m) with z = 5.33 (two-sided
    false-failure rate 1e-7); sd <= 1/2 for a Bernoulli rounding step."""
    codec = FixedPointCodec.for_sum(n_clients=1, clip=1.0, scale_bits=4)
    m = 200_000
    x = np.full(m, 0.3 / 16)  # 0.3 units: rounds up with probability 0.3
    q = codec.decode_sum(codec.encode(x, rng=np.random.default_rng(3))) * 16
    err = q - 0.3
    assert abs(err.mean()) < 5.33 * 0.5 / np.sqrt(m)
    # Power check: deterministic rounding (bias -0.3) is rejected by the same test.
    assert abs(np.floor(x * 16).mean() - 0.3) >= 5.33 * 0.5 / np.sqrt(m)


def test_encode_integers_accepts_rounded_update_plus_noise_and_refuses_overflow():
    codec = FixedPointCodec.for_sum(n_clients=3, clip=2.0, scale=100.0, extra_int_bound=50)
    bound = codec.per_client_bound
    ok = np.array([[bound, -bound, 7]], dtype=np.int64)
    total = codec.add(
        codec.add(codec.encode_integers(ok), codec.encode_integers(ok)), codec.encode_integers(ok)
    )
    np.testing.assert_array_equal(codec.decode_sum(total), 3 * ok / 100.0)
    with pytest.raises(ConfigError):
        codec.encode_integers(np.array([bound + 1], dtype=np.int64))


# -- exact parameters, boundaries and messages (each test kills a mutant that survived) --------


def test_defaults_and_the_exact_per_client_bound():
    codec = FixedPointCodec.for_sum(n_clients=3, clip=1.5, scale_bits=4)
    assert codec.extra_int_bound == 0 and codec.scale == 16.0
    assert codec.per_client_bound == 25  # floor(1.5 * 16 * (1 + 2**-51)) + 1
    assert codec.modulus_bits == (3 * 25).bit_length() + 1
    assert codec.modulus == 1 << codec.modulus_bits and int(codec.mask) == codec.modulus - 1


def test_scale_bits_range_is_0_to_60():
    assert FixedPointCodec.for_sum(n_clients=1, clip=1.0, scale_bits=60).modulus_bits == 62
    assert FixedPointCodec.for_sum(n_clients=1, clip=1.0, scale_bits=0).scale == 1.0
    for bad in (61, -1):
        with pytest.raises(ConfigError, match=rf"scale_bits must be in \[0, 60\], got {bad}"):
            FixedPointCodec.for_sum(n_clients=1, clip=1.0, scale_bits=bad)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"scale_bits": 4, "scale": 16.0}, "give exactly one of scale_bits and scale"),
        ({}, "give exactly one of scale_bits and scale"),
        ({"scale": 0.0}, r"scale must be a positive finite float, got 0\.0"),
        ({"scale": float("inf")}, r"scale must be a positive finite float, got inf"),
        ({"scale": 2.0, "n_clients": 0}, r"n_clients must be an int >= 1, got 0"),
        ({"scale": 2.0, "n_clients": 2.0}, r"n_clients must be an int >= 1, got 2\.0"),
        ({"scale": 2.0, "clip": 0.0}, r"clip must be a positive finite float, got 0\.0"),
        ({"scale": 2.0, "clip": float("inf")}, r"clip must be a positive finite float, got inf"),
        ({"scale": 2.0, "extra_int_bound": -1}, r"extra_int_bound must be an int >= 0, got -1"),
    ],
)
def test_for_sum_rejects_each_invalid_argument_with_its_message(kwargs, message):
    args = {"n_clients": 2, "clip": 1.0} | kwargs
    with pytest.raises(ConfigError, match=message):
        FixedPointCodec.for_sum(**args)


def test_to_ring_is_exact_above_2_to_the_53():
    codec = FixedPointCodec.for_sum(n_clients=1, clip=1.0, scale_bits=0, extra_int_bound=2**60)
    v = np.array([2**53 + 1, -(2**53) - 1, 2**60], dtype=np.int64)
    ring = codec.to_ring(v)
    assert [int(r) for r in ring] == [(int(x)) % codec.modulus for x in v]


def test_out_of_range_message_names_the_worst_value_and_the_bound_name():
    codec = FixedPointCodec.for_sum(n_clients=2, clip=1.0, scale_bits=2, extra_int_bound=4)
    for values, worst in (([-2, 9], 9), ([-9, 2], -9), ([-5, 5], 5), ([5, -5], 5)):
        with pytest.raises(ConfigError, match=rf"extra_int_bound=4, got {worst}; raise the clip"):
            codec.to_ring(np.array(values))
    with pytest.raises(
        ConfigError, match=r"per_client_bound=9, got 10; .*FixedPointCodec\.for_sum"
    ):
        codec.encode_integers(np.array([10]))
    with pytest.raises(ConfigError, match="values must be an integer array, got dtype float64"):
        codec.to_ring(np.array([1.0]))
    with pytest.raises(ConfigError, match=r"inputs must be finite with \|x\| <= clip=1\.0"):
        codec.encode(np.array([2.0]), rng=np.random.default_rng(0))


def test_add_accepts_plain_python_integers():
    codec = FixedPointCodec.for_sum(n_clients=2, clip=1.0, scale_bits=2)
    got = codec.add([codec.modulus - 1, 3], [1, 4])
    assert got.dtype == np.uint64 and got.tolist() == [0, 7]


@pytest.mark.parametrize("bits_scale", [4, 59])
def test_decode_sum_sign_boundary_and_range_check(bits_scale):
    """59 gives a 63-bit ring, where the old decoder overflowed (2**63 is no int64)."""
    codec = FixedPointCodec.for_sum(n_clients=4, clip=1.0, scale_bits=bits_scale)
    half = 1 << (codec.modulus_bits - 1)
    got = codec.decode_sum(np.array([half - 1, half, codec.modulus - 1, 0], dtype=np.uint64))
    assert got.tolist() == [(half - 1) / codec.scale, -half / codec.scale, -1 / codec.scale, 0.0]
    if codec.modulus_bits < 64:
        with pytest.raises(ConfigError, match=rf"ring values must be < 2\*\*{codec.modulus_bits}"):
            codec.decode_sum(np.array([codec.modulus], dtype=np.uint64))
    with pytest.raises(ConfigError, match="ring values must be uint64, got dtype int64"):
        codec.decode_sum(np.array([1], dtype=np.int64))


def test_decode_sum_of_a_full_64_bit_ring():
    codec = FixedPointCodec.for_sum(n_clients=4, clip=1.0, scale_bits=60)
    assert codec.modulus_bits == 64
    s = np.array([2**64 - 1, 2**63, 2**63 - 1], dtype=np.uint64)
    assert codec.decode_sum(s).tolist() == [-1 / 2**60, -(2**63) / 2**60, (2**63 - 1) / 2**60]


def test_max_decode_error_is_the_documented_formula():
    codec = FixedPointCodec.for_sum(n_clients=5, clip=0.75, scale_bits=40, extra_int_bound=3)
    eps = 2.0**-52
    m = codec.per_client_bound
    for n in (0, 1, 5):
        want = (n * (1.0 + 0.75 * 2.0**40 * 2 * eps) + n * m * eps) / 2.0**40
        assert codec.max_decode_error(n) == pytest.approx(want, rel=1e-12, abs=0)
    for bad in (-1, 6):
        with pytest.raises(ConfigError, match=rf"n must be in \[0, 5\], got {bad}"):
            codec.max_decode_error(bad)


def test_exact_messages_of_the_codec_size_errors():
    with pytest.raises(ConfigError) as err:
        FixedPointCodec.for_sum(n_clients=2, clip=1.0)
    assert str(err.value) == "give exactly one of scale_bits and scale"
    with pytest.raises(ConfigError) as err:
        FixedPointCodec.for_sum(n_clients=2100, clip=1.0, scale_bits=52)
    assert str(err.value).endswith(
        "needs a 65-bit ring (max 64); lower the scale, the clip, the noise bound or the "
        "cohort size"
    )


def test_per_client_bound_rounds_up_by_two_ulps_exactly():
    """clip * scale = 2**52 - 1: times (1 + 2**-51) it rounds to 2**52 + 1, so the bound is
    2**52 + 2 (one more ulp of slack would give 2**52 + 3)."""
    codec = FixedPointCodec.for_sum(n_clients=1, clip=(2**52 - 1) / 2**52, scale_bits=52)
    assert codec.per_client_bound == 2**52 + 2


def test_encoding_into_a_given_table_is_the_same_as_a_new_one():
    """``out=``: a round's ring table written in place (reused across rounds) holds the
    same words as a fresh encoding; a wrong table is refused; the bound is still checked
    on the exact extremes of int64 inputs."""
    codec = FixedPointCodec.for_sum(n_clients=4, clip=2.0, scale_bits=8, extra_int_bound=50)
    x = np.random.default_rng(1).uniform(-2, 2, size=(4, 37))
    table = np.full((6, 37), 7, dtype=np.uint64)
    got = codec.encode(x, rng=np.random.default_rng(5), out=table[1:5])
    assert got.base is table or got is table[1:5] or np.shares_memory(got, table)
    assert np.array_equal(table[1:5], codec.encode(x, rng=np.random.default_rng(5)))
    assert (table[0] == 7).all() and (table[5] == 7).all()
    ints = np.random.default_rng(2).integers(-500, 500, size=(4, 37))
    codec.encode_integers(ints, out=table[1:5])
    assert np.array_equal(table[1:5], codec.encode_integers(ints))
    small = codec.encode_integers(ints.astype(np.int32), out=np.empty((4, 37), np.uint64))
    assert np.array_equal(small, codec.encode_integers(ints))
    for bad in (
        np.empty((4, 36), np.uint64),
        np.empty((4, 37), np.int64),
        table[:, :37:1][1:5, ::2],
    ):
        with pytest.raises(ConfigError, match="out must be"):
            codec.encode(x, rng=np.random.default_rng(5), out=bad)
        with pytest.raises(ConfigError, match="out must be"):
            codec.encode_integers(ints, out=bad)
    worst = ints.copy()
    worst[3, 0] = np.iinfo(np.int64).min
    with pytest.raises(ConfigError, match="per_client_bound"):
        codec.encode_integers(worst, out=table[1:5])
