"""Tests written for surviving mutants of the fourth mutation run over ``protocols/``
(docs/mutation.md, "Fourth run"): ``secagg/simulation.py`` (the dropout schedule and
:func:`secure_sum`'s checks, result and objects engine), ``dp/mechanisms.py`` (the rounded
sensitivity, conditional rounding, the plan's ring and messages) and ``dp/dpsgd.py`` (its
checks, accounting, noise and per-example norms, which were tested only through training).

Each pins a behaviour that a mutant changed without failing any earlier test.
"""

from __future__ import annotations

import math
import re
import time

import numpy as np
import pytest
import torch
from scipy import stats

from protocols.dp.accounting import calibrate_noise_multiplier, compute_epsilon
from protocols.dp.dpsgd import (
    DPSGDConfig,
    calibrate_dpsgd_noise,
    check_example_clip,
    check_interaction_delta,
    clip_factors,
    dpsgd_epsilon,
    dpsgd_event,
    dpsgd_steps,
    embedding_example_sq_norms,
    embedding_rows_sq_norms,
    fill_gaussian_,
    linear_example_grads,
    linear_ghost_sq_norms,
    sam_releases,
)
from protocols.dp.ledger import PrivacyEvent
from protocols.dp.mechanisms import (
    DistributedDiscreteGaussian,
    calibrate_distributed_noise_multiplier,
    conditional_randomized_round,
    distributed_epsilon,
    distributed_noise_plan,
    rounded_l2_bound,
)
from protocols.errors import ConfigError, ProtocolError
from protocols.secagg import (
    ClientAborted,
    DropoutSchedule,
    SecAggClient,
    SecAggConfig,
    secure_sum,
    simulation,
)
from protocols.secagg.simulation import STAGES
from protocols.seeding import torch_generator

SEED = b"simulation-mutants"  # 18 bytes


def _exact(message: str) -> str:
    """A ``pytest.raises(match=...)`` pattern for exactly ``message``."""
    return "^" + re.escape(message) + "$"


def _plain(x: np.ndarray, ids: np.ndarray, bits: int) -> np.ndarray:
    return x[ids].sum(axis=0, dtype=np.uint64) & np.uint64((1 << bits) - 1)


# -- DropoutSchedule ---------------------------------------------------------------------------


def test_schedule_stores_python_int_frozensets_and_names_each_stage():
    sched = DropoutSchedule(
        advertise=[np.int64(0)], share=(np.int32(3), 4), masked_input={7}, unmask=[9, 9]
    )
    for name, ids in zip(STAGES, ({0}, {3, 4}, {7}, {9}), strict=True):
        got = getattr(sched, name)
        assert type(got) is frozenset and got == ids
        assert all(type(c) is int for c in got)
    assert [sched.stage_of(c) for c in (0, 3, 4, 7, 9)] == [
        "advertise",
        "share",
        "share",
        "masked_input",
        "unmask",
    ]
    assert sched.stage_of(1) is None
    assert DropoutSchedule().stage_of(0) is None
    assert sched.all() == frozenset({0, 3, 4, 7, 9})
    assert DropoutSchedule().all() == frozenset()
    assert DropoutSchedule(unmask={2}).all() == frozenset({2})


@pytest.mark.parametrize(
    ("kwargs", "stage"),
    [
        ({"advertise": {1}, "share": {1}}, "share"),
        ({"advertise": {1}, "unmask": {1}}, "unmask"),  # not adjacent: all earlier stages count
        ({"share": {2, 5}, "masked_input": {5}}, "masked_input"),
        ({"advertise": {0}, "share": {1}, "masked_input": {2}, "unmask": {0}}, "unmask"),
    ],
)
def test_schedule_refuses_a_client_under_two_stages_naming_the_later(kwargs, stage):
    with pytest.raises(
        ConfigError, match=_exact(f"a client is listed under more than one stage (at {stage!r})")
    ):
        DropoutSchedule(**kwargs)


def test_schedule_accepts_disjoint_stages():
    sched = DropoutSchedule(advertise={0}, share={1}, masked_input={2}, unmask={3})
    assert sched.all() == frozenset(range(4))


@pytest.mark.parametrize("rate", [-0.1, 1.5, float("nan")])
def test_random_schedule_refuses_a_rate_outside_0_1(rate):
    with pytest.raises(ConfigError, match=_exact(f"rate must be in [0, 1], got {rate!r}")):
        DropoutSchedule.random(10, rate=rate, rng=np.random.default_rng(0))


def test_random_schedule_at_rates_0_and_1():
    assert DropoutSchedule.random(50, rate=0.0, rng=np.random.default_rng(1)).all() == frozenset()
    sched = DropoutSchedule.random(50, rate=1.0, rng=np.random.default_rng(1))
    assert sched.all() == frozenset(range(50))


class _ZeroUniforms:
    """A generator whose uniforms are all exactly 0.0 (numpy's ``random()`` can return 0)."""

    def __init__(self) -> None:
        self._rng = np.random.default_rng(0)

    def random(self, n: int) -> np.ndarray:
        return np.zeros(n)

    def integers(self, *args, **kwargs):
        return self._rng.integers(*args, **kwargs)


def test_random_schedule_at_rate_0_drops_nobody_even_at_a_zero_uniform():
    """``U < rate``: a uniform of exactly 0 is no drop at rate 0 (``<=`` would drop all)."""
    assert DropoutSchedule.random(20, rate=0.0, rng=_ZeroUniforms()).all() == frozenset()
    assert DropoutSchedule.random(20, rate=1e-300, rng=_ZeroUniforms()).all() == set(range(20))


def test_random_schedule_drops_at_the_rate_at_uniform_stages():
    """n = 4000 at rate 0.25: the drop count and the four stage counts are within a
    two-sided binomial / chi-square test at false-failure rate 1e-6 (fixed seed), and
    every drop is a client id in range."""
    n, rate = 4000, 0.25
    sched = DropoutSchedule.random(n, rate=rate, rng=np.random.default_rng(2026))
    dropped = sched.all()
    assert dropped <= frozenset(range(n))
    assert stats.binomtest(len(dropped), n, rate).pvalue > 1e-6
    counts = [len(getattr(sched, name)) for name in STAGES]
    assert min(counts) > 0
    assert stats.chisquare(counts).pvalue > 1e-6
    # Power: all drops at one stage, or a stage never used, fails the same test.
    assert stats.chisquare([len(dropped), 0, 0, 0]).pvalue < 1e-6
    assert stats.chisquare([len(dropped) // 3] * 3 + [0]).pvalue < 1e-6


def test_random_schedule_is_a_function_of_the_generator():
    a = DropoutSchedule.random(200, rate=0.3, rng=np.random.default_rng(5))
    b = DropoutSchedule.random(200, rate=0.3, rng=np.random.default_rng(5))
    assert a == b


# -- secure_sum's checks -----------------------------------------------------------------------

_CFG = SecAggConfig(n_clients=4, neighbours=3, threshold=2, modulus_bits=8)


def _sum(x, **kw):
    return secure_sum(x, **{"config": _CFG, "round_index": 0, "public_seed": SEED, **kw})


@pytest.mark.parametrize(
    ("x", "got"),
    [
        (np.zeros((4, 2), np.int64), "int64 (4, 2)"),
        (np.zeros((4, 2), np.uint32), "uint32 (4, 2)"),
        (np.zeros(8, np.uint64), "uint64 (8,)"),
        (np.zeros((4, 2, 1), np.uint64), "uint64 (4, 2, 1)"),
        (np.zeros((3, 2), np.uint64), "uint64 (3, 2)"),
        (np.zeros((5, 2), np.uint64), "uint64 (5, 2)"),
        (np.zeros((4, 0), np.uint64), "uint64 (4, 0)"),
    ],
)
def test_secure_sum_names_malformed_ring_inputs(x, got):
    with pytest.raises(
        ConfigError, match=_exact(f"ring_inputs must be uint64 of shape [4, dim >= 1], got {got}")
    ):
        _sum(x)


@pytest.mark.parametrize("engine", ["batched", "objects"])
def test_secure_sum_accepts_the_edges_of_its_checks(engine):
    """dim 1, the largest ring value, a 16-byte seed, dropout ids 0 and n - 1."""
    x = np.array([[255], [1], [2], [254]], np.uint64)
    res = _sum(x, public_seed=bytes(16), engine=engine)
    np.testing.assert_array_equal(res.sum, [(255 + 1 + 2 + 254) % 256])
    res = _sum(x, dropouts=DropoutSchedule(masked_input={3}), engine=engine)
    assert res.survivors.tolist() == [0, 1, 2] and res.dropped.tolist() == [3]
    np.testing.assert_array_equal(res.sum, [(255 + 1 + 2) % 256])
    res = _sum(x, dropouts=DropoutSchedule(advertise={0}), engine=engine)
    assert res.survivors.tolist() == [1, 2, 3] and res.excluded.tolist() == [0]
    np.testing.assert_array_equal(res.sum, [(1 + 2 + 254) % 256])


def test_secure_sum_refuses_an_unreduced_input_with_the_modulus():
    x = np.zeros((4, 3), np.uint64)
    x[3, 2] = 256
    with pytest.raises(ConfigError, match=_exact("ring_inputs must be reduced modulo 2**8")):
        _sum(x)


def test_secure_sum_on_a_64_bit_ring_takes_any_uint64():
    cfg = SecAggConfig(n_clients=4, neighbours=3, threshold=2, modulus_bits=64)
    x = np.full((4, 2), 2**64 - 1, np.uint64)
    res = secure_sum(x, config=cfg, round_index=0, public_seed=SEED)
    np.testing.assert_array_equal(res.sum, np.full(2, 2**64 - 4, np.uint64))


@pytest.mark.parametrize(
    "seed", [bytes(15), b"", bytearray(32), "a-public-seed-of-32-characters!!"]
)
def test_secure_sum_refuses_a_short_or_non_bytes_public_seed(seed):
    with pytest.raises(ConfigError, match=_exact("public_seed must be at least 16 bytes")):
        _sum(np.zeros((4, 2), np.uint64), public_seed=seed)


@pytest.mark.parametrize("bad", [-1, 4, 5])
@pytest.mark.parametrize("stage", STAGES)
def test_secure_sum_refuses_dropout_ids_outside_the_cohort(bad, stage):
    with pytest.raises(ConfigError, match=_exact("dropout ids must be in [0, 4)")):
        _sum(np.zeros((4, 2), np.uint64), dropouts=DropoutSchedule(**{stage: {bad}}))


def test_secure_sum_names_an_unknown_engine():
    with pytest.raises(
        ConfigError, match=_exact("engine must be 'batched' or 'objects', got 'object'")
    ):
        _sum(np.zeros((4, 2), np.uint64), engine="object")


# -- secure_sum's result -----------------------------------------------------------------------


@pytest.mark.parametrize("engine", ["batched", "objects"])
def test_result_reports_the_configuration_the_sets_and_the_time(engine):
    cfg = SecAggConfig(n_clients=9, neighbours=6, threshold=4, modulus_bits=21)
    x = np.random.default_rng(4).integers(0, 1 << 21, size=(9, 7), dtype=np.uint64)
    before = time.perf_counter()
    res = secure_sum(x, config=cfg, round_index=2, public_seed=SEED, engine=engine)
    wall = time.perf_counter() - before
    assert (res.neighbours, res.threshold, res.modulus_bits) == (6, 4, 21)
    assert res.survivors.tolist() == list(range(9))
    for name in ("survivors", "dropped", "excluded"):
        assert getattr(res, name).dtype == np.int64  # also when empty
    assert res.dropped.size == 0 and res.excluded.size == 0
    np.testing.assert_array_equal(res.sum, _plain(x, res.survivors, 21))
    assert 0.0 < res.seconds <= wall
    assert set(res.seconds_per_stage) == set(STAGES) == set(res.bytes_per_stage)
    assert all(0.0 < s <= res.seconds for s in res.seconds_per_stage.values())
    assert sum(res.seconds_per_stage.values()) <= res.seconds
    assert all(type(b) is int and b > 0 for b in res.bytes_per_stage.values())


def test_objects_engine_shares_one_mask_expander(monkeypatch):
    """Every client and the server of the objects engine use one :class:`MaskExpander` of the
    ring's dtype (the module's ``O(dim * k + n * k)`` memory bound; one expander per client
    would be ``O(n * dim)``)."""
    made = []

    class Client(SecAggClient):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    class Server(simulation.SecAggServer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(simulation, "SecAggClient", Client)
    monkeypatch.setattr(simulation, "SecAggServer", Server)
    x = np.arange(12, dtype=np.uint64).reshape(4, 3)
    res = _sum(x, engine="objects")
    np.testing.assert_array_equal(res.sum, x.sum(axis=0) % 256)
    assert len(made) == 5 and isinstance(made[-1], Server)
    assert len({id(m._expander) for m in made}) == 1
    assert made[0]._expander.dim == 3 and made[0]._expander.dtype == np.uint8


def test_objects_engine_treats_an_aborting_client_as_a_dropout(monkeypatch):
    """A client that aborts (here: client 2 at the masked-input stage) is indistinguishable
    from one that goes silent there: the same sets, sum and traffic, and every later client
    still takes its turn."""
    n, d, bits = 6, 5, 16
    cfg = SecAggConfig(n_clients=n, neighbours=5, threshold=3, modulus_bits=bits)
    x = np.random.default_rng(8).integers(0, 1 << bits, size=(n, d), dtype=np.uint64)
    kw = {"config": cfg, "round_index": 3, "public_seed": SEED, "engine": "objects"}
    silent = secure_sum(x, dropouts=DropoutSchedule(masked_input={2}), **kw)
    original = SecAggClient.masked_input

    def aborting(self, message, values):
        if self.id == 2:
            raise ClientAborted("aborted by the test")
        return original(self, message, values)

    monkeypatch.setattr(SecAggClient, "masked_input", aborting)
    aborted = secure_sum(x, **kw)
    assert aborted.survivors.tolist() == [0, 1, 3, 4, 5] and aborted.dropped.tolist() == [2]
    for name in ("survivors", "dropped", "excluded"):
        assert getattr(aborted, name).tolist() == getattr(silent, name).tolist()
    np.testing.assert_array_equal(aborted.sum, silent.sum)
    np.testing.assert_array_equal(aborted.sum, _plain(x, aborted.survivors, bits))
    assert aborted.bytes_per_stage == silent.bytes_per_stage


# -- dp/mechanisms: conditional randomized rounding ----------------------------------------------


def test_rounding_keeps_the_bound_exactly_in_float64_also_for_float32_input():
    """y = (5000.5, 0.5): the candidates (5000, 0) of norm exactly 5000 and (5000, 1) of norm
    5000.0001 differ by less than float32's resolution at 5000. With the bound 5000 only the
    first may be returned, and it must be accepted (the bound is inclusive). A norm taken in
    float32, over the whole block, or a strict ``<`` breaks one of the two; 64 rows make a
    wrong acceptance certain but for probability 2**-64."""
    x = torch.tensor([[5000.5, 0.5]] * 64, dtype=torch.float32)
    out = conditional_randomized_round(
        x, scale=1.0, l2_bound=5000.0, generator=torch.Generator().manual_seed(3)
    )
    assert out.dtype == torch.int64
    assert torch.equal(out, torch.tensor([[5000, 0]] * 64))


def test_rounding_that_cannot_meet_the_bound_names_the_rows_and_tries():
    """Rows that no rounding can fit (three rows of ones, norm 2 > 1, all in the first block
    of 2**20 // 4 rows; the second block fits) are counted over all blocks, with the
    default 1000 tries."""
    d = 4
    rows = (1 << 20) // d
    x = torch.zeros((rows + 3, d), dtype=torch.float64)
    x[:2] = 1.0
    x[rows - 1] = 1.0
    with pytest.raises(
        ProtocolError,
        match=_exact(
            "3 update(s) exceeded the rounded L2 bound 1 after 1000 tries; "
            "clip updates to the configured norm before rounding"
        ),
    ):
        conditional_randomized_round(x, scale=1.0, l2_bound=1.0, generator=torch.Generator())
    with pytest.raises(ProtocolError, match=r"^1 update\(s\) exceeded .* after 7 tries;"):
        conditional_randomized_round(
            x[:1], scale=1.0, l2_bound=1.0, generator=torch.Generator(), max_tries=7
        )


def test_secure_rounding_never_uses_torch_global_rng():
    """Secure mode draws the rounding from the OS: torch's global RNG state is untouched
    (plain mode with generator None would fall back to it)."""
    x = torch.full((6, 5), 0.37, dtype=torch.float64)
    torch.manual_seed(99)
    state = torch.get_rng_state()
    out = conditional_randomized_round(x, scale=10.0, l2_bound=100.0, generator=None, secure=True)
    assert torch.equal(torch.get_rng_state(), state)
    assert bool(((out == 3) | (out == 4)).all())


# -- dp/mechanisms: the rounded sensitivity ------------------------------------------------------


@pytest.mark.parametrize(
    ("c", "d", "beta", "conditional"),
    [
        (10.0, 400, math.exp(-0.5), True),
        (3.0, 50, 0.01, True),
        (100.0, 7, 0.3, True),
        (1.0, 1, 1e-6, False),  # here c + sqrt(d) is the smaller bound
    ],
)
def test_rounded_l2_bound_is_kairouz_prop_22(c, d, beta, conditional):
    """``min(c + sqrt(d), sqrt(c^2 + d/4 + sqrt(2 log(1/beta)) (c + sqrt(d)/2)))``, written
    out (Kairouz et al. 2021, Sec. 4.1): the integer L2 sensitivity every ring and every
    epsilon of the distributed discrete Gaussian is sized with."""
    always = c + math.sqrt(d)
    tight = math.sqrt(c**2 + d / 4 + math.sqrt(2 * math.log(1 / beta)) * (c + math.sqrt(d) / 2))
    assert (tight < always) is conditional
    assert rounded_l2_bound(c, d, beta) == pytest.approx(min(always, tight), rel=1e-12)
    assert rounded_l2_bound(c, d, 0.0) == always


@pytest.mark.parametrize("beta", [1.0, 1.5, -0.1, float("nan")])
def test_rounded_l2_bound_refuses_beta_outside_0_1(beta):
    with pytest.raises(ConfigError, match=_exact(f"rounding beta must be in [0, 1), got {beta!r}")):
        rounded_l2_bound(1.0, 4, beta)


def _small_plan(**kw):
    """clip * scale = 1, d = 1, beta = 0: D2 = 2 exactly, t = 4."""
    args = {"clip": 1.0, "noise_multiplier": 1.0, "scale": 1.0, "dim": 1, "min_survivors": 4}
    return distributed_noise_plan(**{**args, "rounding_beta": 0.0, **kw})


def test_plan_ring_is_the_smallest_that_holds_the_bound_also_at_powers_of_two():
    """``per_coordinate_bound = n floor(D2) + noise_bound`` and ``min_ring_bits`` is the
    smallest k with ``2**k >= 2 * bound + 1`` (centered lift), checked for cohorts 4..259,
    among which the bound is 31 and 63 (2**j - 1) and 128 (2**j): one bit too few there
    wraps the sum, one too many is not the smallest."""
    seen = set()
    for n in range(4, 260):
        plan = _small_plan(cohort_size=n)
        bound = plan.per_coordinate_bound
        assert bound == n * 2 + plan.noise_sum_bound(
            n
        ) and plan.noise_bound == plan.noise_sum_bound(n)
        k = plan.min_ring_bits
        assert 2**k >= 2 * bound + 1 > 2 ** (k - 1)
        seen.add(bound)
    assert {31, 63, 128} <= seen


@pytest.mark.parametrize(("c", "d", "beta"), [(64.0, 10, math.exp(-0.5)), (1.0, 10_000, 0.5)])
def test_plan_l1_sensitivity_is_d2_times_min_sqrt_d_d2(c, d, beta):
    """Both branches of ``D1 = D2 * min(sqrt(d), D2)`` (Kairouz et al. 2021, Prop. 22)."""
    plan = distributed_noise_plan(
        clip=1.0, noise_multiplier=1.0, scale=c, dim=d, min_survivors=4, rounding_beta=beta
    )
    d2 = plan.l2_sensitivity_after_rounding
    assert d2 == rounded_l2_bound(c, d, beta)
    assert plan.l1_sensitivity_after_rounding == pytest.approx(d2 * min(math.sqrt(d), d2))
    assert (d2 < math.sqrt(d)) is (d == 10_000)


@pytest.mark.parametrize("bad", [0.0, 1.0, 1.5, -0.5])
def test_plan_refuses_a_failure_probability_outside_0_1(bad):
    with pytest.raises(
        ConfigError, match=_exact(f"failure probability must be in (0, 1), got {bad!r}")
    ):
        _small_plan(failure_prob=bad)
    with pytest.raises(  # checked with the arguments, before the share sigma is sized
        ConfigError, match=_exact(f"failure probability must be in (0, 1), got {bad!r}")
    ):
        _small_plan(failure_prob=bad, noise_multiplier=0.125)


def test_plan_names_a_share_sigma_below_half_a_unit():
    assert _small_plan(noise_multiplier=0.5).share_sigma == 0.5  # the boundary is allowed
    with pytest.raises(
        ConfigError,
        match=_exact(
            "discrete noise share sigma 0.125 is below 0.5 integer units; "
            "increase the fixed-point scale or the noise multiplier"
        ),
    ):
        _small_plan(noise_multiplier=0.125)


# -- dp/mechanisms: argument names in the plan's messages ----------------------------------------


@pytest.mark.parametrize("name", ["dim", "min_survivors", "cohort_size"])
def test_plan_names_a_bad_count(name):
    args = {"clip": 1.0, "noise_multiplier": 1.0, "scale": 64.0, "dim": 10, "min_survivors": 4}
    with pytest.raises(ConfigError, match=_exact(f"{name} must be an integer >= 1, got 0")):
        distributed_noise_plan(**{**args, name: 0})


def test_ddg_client_share_names_a_bad_client_count():
    plan = distributed_noise_plan(
        clip=1.0, noise_multiplier=1.0, scale=64.0, dim=10, min_survivors=4
    )
    with pytest.raises(ConfigError, match=_exact("n_clients must be an integer >= 1, got 0")):
        DistributedDiscreteGaussian(plan=plan).client_share(0, generator=torch.Generator())


def test_calibration_at_exactly_the_smallest_sigmas_epsilon_returns_it():
    """clip * scale = 1, d = 1, beta = 0, t = 4: the smallest admissible sigma is 0.5; a
    budget equal to its epsilon (a tie) admits it, so the search must stop there."""
    kw = {"delta": 1e-5, "sample_rate": 1.0, "steps": 1, "clip": 1.0, "scale": 1.0, "dim": 1}
    plan = distributed_noise_plan(
        noise_multiplier=0.5, clip=1.0, scale=1.0, dim=1, min_survivors=4, rounding_beta=0.0
    )
    eps = distributed_epsilon(plan, sample_rate=1.0, steps=1, delta=1e-5)
    got = calibrate_distributed_noise_multiplier(
        epsilon=eps, **kw, min_survivors=4, rounding_beta=0.0
    )
    assert got == 0.5


# -- dp/dpsgd: configuration, checks and accounting ----------------------------------------------


@pytest.mark.parametrize("bad", [True, "1", None])
def test_dpsgd_config_refuses_a_noise_multiplier_that_is_no_number(bad):
    with pytest.raises(
        ConfigError, match=_exact(f"noise multiplier must be a number >= 0, got {bad!r}")
    ):
        DPSGDConfig(noise_multiplier=bad, example_clip=1.0)


@pytest.mark.parametrize("bad", [-1e-9, float("inf"), float("nan")])
def test_dpsgd_config_refuses_a_negative_or_infinite_noise_multiplier(bad):
    with pytest.raises(
        ConfigError, match=_exact(f"noise multiplier must be a finite number >= 0, got {bad!r}")
    ):
        DPSGDConfig(noise_multiplier=bad, example_clip=1.0)


def test_dpsgd_config_accepts_zero_noise_and_checks_clip_and_secure():
    cfg = DPSGDConfig(noise_multiplier=0, example_clip=3)
    assert cfg.noise_std == 0.0 and cfg.secure is False
    assert DPSGDConfig(noise_multiplier=1.5, example_clip=0.5).noise_std == 0.75
    with pytest.raises(
        ConfigError, match=_exact("example clip must be a finite number > 0, got 0")
    ):
        DPSGDConfig(noise_multiplier=1.0, example_clip=0)
    for bad in (1, None, "yes"):
        with pytest.raises(ConfigError, match=_exact(f"secure must be True or False, got {bad!r}")):
            DPSGDConfig(noise_multiplier=1.0, example_clip=1.0, secure=bad)


def test_dpsgd_round_generator_is_derived_per_round_or_none_in_secure_mode():
    cfg = DPSGDConfig(noise_multiplier=1.0, example_clip=1.0)
    g = cfg.round_generator(7, 3)
    assert isinstance(g, torch.Generator)
    want = torch.rand(8, generator=torch_generator(7, "dpsgd-noise", 3))
    assert torch.equal(torch.rand(8, generator=g), want)
    assert not torch.equal(torch.rand(8, generator=cfg.round_generator(7, 4)), want)
    secure = DPSGDConfig(noise_multiplier=1.0, example_clip=1.0, secure=True)
    assert secure.round_generator(7, 3) is None


@pytest.mark.parametrize("bad", [True, "1", None])
def test_example_clip_that_is_no_number_is_named(bad):
    with pytest.raises(
        ConfigError, match=_exact(f"example clip must be a number > 0, got {bad!r}")
    ):
        check_example_clip(bad)


@pytest.mark.parametrize("bad", [0.0, -1.0, float("inf"), float("nan")])
def test_example_clip_must_be_finite_and_positive(bad):
    with pytest.raises(
        ConfigError, match=_exact(f"example clip must be a finite number > 0, got {bad!r}")
    ):
        check_example_clip(bad)


def test_example_clip_is_returned_as_float():
    assert type(check_example_clip(2)) is float and check_example_clip(2) == 2.0
    assert check_example_clip(1e-300) == 1e-300


def test_interaction_delta_boundary_and_messages():
    with pytest.raises(
        ConfigError,
        match=_exact(
            "delta must be below 1/interactions = 0.004 for 250 training interactions "
            "(interaction-level DP), got 0.004; choose delta <= 0.0004"
        ),
    ):
        check_interaction_delta(0.004, n_interactions=250)
    got = check_interaction_delta(np.float64(0.0039), n_interactions=250)
    assert got == 0.0039 and type(got) is float
    assert check_interaction_delta(0.5, n_interactions=1) == 0.5
    for bad in (0, -3, True, 2.0, None):
        with pytest.raises(
            ConfigError, match=_exact(f"n_interactions must be a positive integer, got {bad!r}")
        ):
            check_interaction_delta(1e-6, n_interactions=bad)
    with pytest.raises(ConfigError, match="delta"):
        check_interaction_delta(0.0, n_interactions=10)


def test_dpsgd_steps_is_epochs_times_rounds_and_names_a_bad_count():
    assert dpsgd_steps(local_epochs=1, rounds=1) == 1
    assert dpsgd_steps(local_epochs=3, rounds=7) == 21
    for name, kw in (
        ("local epochs", {"local_epochs": 0, "rounds": 2}),
        ("local epochs", {"local_epochs": 2.0, "rounds": 2}),
        ("rounds", {"local_epochs": 2, "rounds": True}),
        ("rounds", {"local_epochs": 2, "rounds": -1}),
    ):
        bad = kw["local_epochs"] if name == "local epochs" else kw["rounds"]
        with pytest.raises(
            ConfigError, match=_exact(f"{name} must be a positive integer, got {bad!r}")
        ):
            dpsgd_steps(**kw)


@pytest.mark.parametrize("accountant", ["rdp", "prv"])
def test_dpsgd_epsilon_is_unamplified_gaussian_composition(accountant):
    got = dpsgd_epsilon(noise_multiplier=2.0, delta=1e-5, steps=12, accountant=accountant)
    want = compute_epsilon(
        noise_multiplier=2.0, sample_rate=1.0, steps=12, delta=1e-5, accountant=accountant
    )
    assert got == want
    assert got > compute_epsilon(
        noise_multiplier=2.0, sample_rate=0.5, steps=12, delta=1e-5, accountant=accountant
    )
    sigma = calibrate_dpsgd_noise(epsilon=got, delta=1e-5, steps=12, accountant=accountant)
    assert sigma == calibrate_noise_multiplier(
        epsilon=got, delta=1e-5, sample_rate=1.0, steps=12, accountant=accountant
    )


def test_dpsgd_epsilon_and_calibration_check_their_arguments():
    with pytest.raises(ConfigError, match="accountant must be one of"):
        dpsgd_epsilon(noise_multiplier=2.0, delta=1e-5, steps=12, accountant="gdp")
    with pytest.raises(ConfigError, match="accountant must be one of"):
        calibrate_dpsgd_noise(epsilon=1.0, delta=1e-5, steps=12, accountant="gdp")
    with pytest.raises(ConfigError, match="noise multiplier"):
        dpsgd_epsilon(noise_multiplier=-1.0, delta=1e-5, steps=12, accountant="rdp")


def test_dpsgd_event_is_one_local_interaction_level_gaussian_step():
    ev = dpsgd_event(4, noise_multiplier=1.25, example_clip=0.3)
    assert ev == PrivacyEvent(
        round=4,
        mechanism="gaussian",
        noise_multiplier=1.25,
        sample_rate=1.0,
        clip=0.3,
        noise_contributors=1,
        min_survivors=1,
        placement="local",
        privacy_unit="interaction",
    )


def test_sam_releases_counts_each_pass_with_a_positive_radius():
    assert sam_releases(sam=True, rho_shared=0.0, rho_private=0.0) == 1
    assert sam_releases(sam=True, rho_shared=0.1, rho_private=0.0) == 2
    assert sam_releases(sam=True, rho_shared=0.0, rho_private=0.1) == 2
    assert sam_releases(sam=True, rho_shared=0.1, rho_private=0.1) == 3
    assert sam_releases(sam=False, rho_shared=0.0, rho_private=0.0) == 1
    for bad in (1, None):
        with pytest.raises(ConfigError, match=_exact(f"sam must be True or False, got {bad!r}")):
            sam_releases(sam=bad, rho_shared=0.1, rho_private=0.1)


# -- dp/dpsgd: noise and per-example norms -------------------------------------------------------


def test_fill_gaussian_in_place_from_the_generator():
    out = torch.full((3, 4), 7.0)
    got = fill_gaussian_(out, 2.5, generator=torch.Generator().manual_seed(11), secure=False)
    assert got.data_ptr() == out.data_ptr()
    want = torch.empty(3, 4).normal_(0.0, 2.5, generator=torch.Generator().manual_seed(11))
    assert torch.equal(out, want)
    one = torch.empty(6, dtype=torch.float64)
    fill_gaussian_(one, 1.0, generator=torch.Generator().manual_seed(2), secure=False)
    want = torch.empty(6, dtype=torch.float64).normal_(generator=torch.Generator().manual_seed(2))
    assert torch.equal(one, want)
    zero = torch.full((5,), 3.0, dtype=torch.float64)
    assert fill_gaussian_(zero, 0.0, generator=torch.Generator(), secure=False) is zero
    assert torch.equal(zero, torch.zeros(5, dtype=torch.float64))


def test_fill_gaussian_needs_a_generator_or_secure_and_checks_the_std():
    with pytest.raises(
        ConfigError,
        match=_exact(
            "pass an explicit torch.Generator (derive it with protocols.seeding), "
            "or set secure=True to use OS randomness"
        ),
    ):
        fill_gaussian_(torch.zeros(3), 1.0, generator=None, secure=False)
    with pytest.raises(ConfigError, match="noise std must be"):
        fill_gaussian_(torch.zeros(3), -1.0, generator=torch.Generator(), secure=False)
    with pytest.raises(ConfigError, match=r"for torch.float16"):
        fill_gaussian_(
            torch.zeros(3, dtype=torch.float16), 1e6, generator=torch.Generator(), secure=False
        )


def test_secure_fill_gaussian_uses_the_os_and_keeps_shape_and_dtype():
    out = torch.zeros((4000,), dtype=torch.float64)
    torch.manual_seed(5)
    state = torch.get_rng_state()
    got = fill_gaussian_(out, 3.0, generator=None, secure=True)
    assert got.data_ptr() == out.data_ptr() and out.dtype == torch.float64
    assert torch.equal(torch.get_rng_state(), state)
    # std 3: the sample variance of 4000 normals is within 6 standard errors (p < 1e-8).
    assert abs(float(out.var()) / 9.0 - 1.0) < 6 * math.sqrt(2 / 4000)
    assert not torch.equal(out, out.float().double())  # drawn in float64, not float32
    with pytest.raises(ConfigError, match=r"for torch.float16"):  # the std is checked for out
        fill_gaussian_(torch.zeros(3, dtype=torch.float16), 1e6, generator=None, secure=True)
    with pytest.raises(ConfigError):
        fill_gaussian_(out, 3.0, generator=torch.Generator(), secure=True)


def test_clip_factors_exact_values_at_the_boundary():
    sq = torch.tensor([0.0, 0.99, 1.0, 4.0, -1e-12], dtype=torch.float64)
    f = clip_factors(sq, 1.0)
    assert f.dtype == torch.float32
    want = torch.tensor([1.0, 1.0, 1.0, (1.0 - 2.0**-20) / 2.0, 1.0], dtype=torch.float64)
    assert torch.equal(f, want.to(torch.float32))
    # Below a clip of 1 (no clamping of norms to 1 anywhere): kept, and scaled by the norm.
    f = clip_factors(torch.tensor([0.01, 0.25], dtype=torch.float64), 0.1)
    assert torch.equal(f, torch.tensor([1.0, 0.1 * (1.0 - 2.0**-20) / 0.5], dtype=torch.float32))
    # float32 input, norm above the clip by less than float32 resolves: computed in float64.
    f = clip_factors(torch.tensor([1.0 + 2.0**-23], dtype=torch.float32), 1.0)
    assert float(f[0]) < 1.0
    f = clip_factors(torch.tensor([9.0], dtype=torch.float32), 1.5)
    assert torch.equal(f, torch.tensor([1.5 * (1.0 - 2.0**-20) / 3.0], dtype=torch.float32))
    for bad in (float("nan"), float("inf")):
        with pytest.raises(
            ConfigError,
            match=_exact("per-example gradient norms contain NaN or infinity; lower the lr"),
        ):
            clip_factors(torch.tensor([1.0, bad], dtype=torch.float64), 1.0)


def test_embedding_example_sq_norms_checks_shapes_and_works_in_float64():
    rows = torch.tensor([[2, 2], [0, 1]])
    coef = torch.tensor([[0.1, 0.2], [0.5, -0.5]], dtype=torch.float32)
    got = embedding_example_sq_norms(rows, coef)
    assert got.dtype == torch.float64
    c = coef.double()
    assert torch.equal(got, torch.stack([(c[0, 0] + c[0, 1]) ** 2, c[1, 0] ** 2 + c[1, 1] ** 2]))
    for r, c2 in ((rows, coef[:, :1]), (rows[0], coef[0]), (rows[None], coef[None])):
        with pytest.raises(
            ConfigError,
            match=_exact(
                "rows and coef must be [examples, samples] tensors of one shape, got "
                f"{tuple(r.shape)} and {tuple(c2.shape)}"
            ),
        ):
            embedding_example_sq_norms(r, c2)


def test_linear_example_grads_sum_the_samples_in_the_inputs_dtype():
    x = torch.arange(12, dtype=torch.float32).view(2, 2, 3)
    delta = torch.tensor([[1.0, -2.0], [0.5, 3.0]], dtype=torch.float64)
    w, b = linear_example_grads(x, delta)
    assert w.dtype == b.dtype == torch.float32
    want = torch.stack(
        [delta[e, 0] * x[e, 0].double() + delta[e, 1] * x[e, 1].double() for e in (0, 1)]
    )
    assert torch.equal(w, want.float()) and w.shape == (2, 3)
    assert torch.equal(b, delta.sum(1).float())
    for xx, dd in ((x[0], delta[0]), (x, delta[:, :1]), (x, delta[0])):
        with pytest.raises(
            ConfigError,
            match=_exact(
                f"x must be [E, k, in] and delta [E, k], got {tuple(xx.shape)} and "
                f"{tuple(dd.shape)}"
            ),
        ):
            linear_example_grads(xx, dd)


def _explicit_sq_norms(rows, grads, n_rows):
    """Per-example squared Frobenius norm of the [n_rows, d] table gradient, built."""
    out = []
    for r, g in zip(rows, grads, strict=True):
        table = torch.zeros(n_rows, grads.shape[-1], dtype=torch.float64)
        table.index_add_(0, r, g.double())
        out.append(float(table.square().sum()))
    return out


def test_embedding_rows_sq_norms_equals_the_built_table_gradient():
    gen = torch.Generator().manual_seed(2)
    rows = torch.tensor([[0, 3, 3, 1], [2, 2, 2, 2], [1, 0, 4, 3]])
    grads = torch.randn(3, 4, 5, generator=gen, dtype=torch.float32)
    got = embedding_rows_sq_norms(rows, grads)
    assert got.dtype == torch.float64
    assert got.tolist() == pytest.approx(_explicit_sq_norms(rows, grads, 5), rel=1e-6)
    cases = ((rows[0], grads), (rows, grads[0]), (rows[:, :3], grads), (rows, grads[:2]))
    for r, g in (*cases, (rows, grads[..., None])):
        with pytest.raises(
            ConfigError,
            match=_exact(
                f"rows must be [E, k] and grads [E, k, d], got {tuple(r.shape)} and "
                f"{tuple(g.shape)}"
            ),
        ):
            embedding_rows_sq_norms(r, g)


def test_linear_ghost_sq_norms_equals_the_built_weight_and_bias_gradients():
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(3, 2, 4, generator=gen, dtype=torch.float64)
    delta = torch.randn(3, 2, 3, generator=gen, dtype=torch.float32)
    got = linear_ghost_sq_norms(torch.bmm(x, x.mT), delta)
    assert got.dtype == torch.float64
    want = []
    for e in range(3):
        weight = sum(torch.outer(delta[e, s].double(), x[e, s]) for s in range(2))
        bias = delta[e].double().sum(0)
        want.append(float(weight.square().sum() + bias.square().sum()))
    # float64 throughout: float32 delta products would be off by about 1e-7.
    assert got.tolist() == pytest.approx(want, rel=1e-11)
    gram = torch.bmm(x, x.mT)
    for gx, d in ((gram, delta[0]), (gram[:, :1], delta), (gram[:2], delta), (gram, delta[:, :1])):
        with pytest.raises(
            ConfigError,
            match=_exact(
                f"gram_x must be [E, k, k] and delta [E, k, out], got {tuple(gx.shape)} and "
                f"{tuple(d.shape)}"
            ),
        ):
            linear_ghost_sq_norms(gx, d)
