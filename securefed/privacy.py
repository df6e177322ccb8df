"""Differential privacy and secure aggregation at the ``aggregate`` seam.

One round, as the server and clients run it::

    clip (each client, L2 <= C)
      -> central:     server sums the clipped updates and adds N(0, sigma^2 C^2)
      -> distributed: each client rounds its clipped update to integers and adds its
                      discrete Gaussian share (sized for the fewest survivors t)
      -> secure aggregation (optional): fixed-point ring encoding + pairwise masks; the
                      server learns only the (noised) sum of the survivors
      -> decode, divide by the denominator, record the privacy event in the ledger

Unit of privacy: one user (DP-FedAvg, McMahan et al. 2018). With Poisson sampling
(``--client-fraction q < 1``) the accountant uses sample rate q and the mean divides by the
fixed expected cohort ``q * N``; otherwise no amplification is claimed (sample rate 1).

With ``privacy_unit="interaction"`` the clients run DP-SGD themselves (FedRAP's and
FedRecGEL's ``train_dpsgd``); this seam then adds no noise, only accounts the local steps
(:meth:`PrivateAggregator.begin_round`) and, with secure aggregation, masks the uploads.

Randomness: in a DP run every noise draw (central, distributed shares and their randomized
rounding, DP-SGD), every cohort and the secure-aggregation public seed come from the OS
(``os.urandom`` through the protocols samplers), so nothing in the run directory regenerates
them; the run seed drives only randomness no DP claim relies on. ``PrivacyConfig.replay``
(``--replay-from-seed``) derives them from the seed instead, and the run's summary and ledger
then carry :data:`REPLAY_WARNING`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import secrets
import threading
import time
from collections import Counter
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch

from protocols.dp import (
    CentralGaussian,
    DistributedDiscreteGaussian,
    DistributedGaussian,
    DPConfig,
    PrivacyLedger,
    calibrate_distributed_noise_multiplier,
    clip_scales,
    clipped_rows,
    discrete_gaussian,
    distributed_noise_plan,
    privacy_summary,
)
from protocols.dp.accounting import gaussian_epsilon
from protocols.dp.dpsgd import (
    DPSGDConfig,
    calibrate_dpsgd_noise,
    check_interaction_delta,
    dpsgd_event,
    dpsgd_steps,
)
from protocols.dp.ledger import DISTRIBUTED_DISCRETE_GAUSSIAN
from protocols.dp.noise import SECURE_CHUNK, SECURE_WORKERS, below
from protocols.errors import ProtocolError
from protocols.seeding import derive_seed, numpy_generator, torch_generator
from securefed import runs
from securefed.costs import ENCODE_TILE, STREAM_RING_WORDS, streamed_secagg
from securefed.errors import ConfigError, IntegrityError, PrivacyBudgetError
from securefed.federation.aggregation import null_out
from securefed.federation.base import Aggregate, ClientUpdates

if TYPE_CHECKING:
    from protocols.secagg import FixedPointCodec, SecAggConfig
    from securefed.config import TrainConfig
    from securefed.data.types import Split

#: The default L2 clip of one client's upload (user-level DP) and of one example's gradient
#: (interaction-level DP-SGD) are each model's own (``ModelSpec.dp_clip``/``example_clip``).
#: Without DP, secure aggregation still needs a bound on each input; this one is far above
#: the measured update norms, so clipping is inactive in practice.
DEFAULT_SECAGG_BOUND = 1000.0
#: Secure-aggregation chunk of clients x coordinates materialised at once (floats).
_MAX_DENSE = 64_000_000
#: Bytes of the ring values a streamed block encodes at once (a slice of rows of one tile).
_TILE_PIECE_BYTES = 4 << 20


def encode_rows(
    x: torch.Tensor,
    codec: Any,
    ddg: DistributedDiscreteGaussian | None,
    *,
    secure: bool,
    round_gen: torch.Generator | None,
    noise_gen: torch.Generator | None,
    rng: np.random.Generator,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """Clipped update rows ``x`` (float32 ``[r, d]``) put in the ring as their clients put
    them: with distributed DP, conditionally rounded plus each row's noise share, checked
    against the bound of a whole client input (``codec.encode_integers``); without it,
    stochastically rounded from ``rng``. The in-process round and a Flower node
    (:func:`securefed.flower.pipeline.encode_updates`) both encode through here."""
    if ddg is None:
        return codec.encode(x.numpy(), rng=rng, out=out)
    if secure and x.shape[0] > 1 and x.shape[1] <= SECURE_CHUNK:
        return _encode_rows_secure(x, codec, ddg, out)
    ints = ddg.round_update(x, generator=round_gen, secure=secure)
    ints.add_(ddg.client_share(x.shape[0], generator=noise_gen, secure=secure))
    return codec.encode_integers(ints.numpy(), out=out)


def _encode_rows_secure(
    x: torch.Tensor, codec: Any, ddg: DistributedDiscreteGaussian, out: np.ndarray | None
) -> np.ndarray:
    """:func:`encode_rows` with distributed DP on OS randomness: a few rows at a time (about
    :data:`~protocols.dp.noise.SECURE_CHUNK` coordinates) on up to
    :data:`~protocols.dp.noise.SECURE_WORKERS` threads, each block's rounding, noise shares and
    ring words made while the block is in cache. Blocks are independent (every draw takes its
    own fresh OS key), so the split changes no distribution. Whole-table passes took 1.8-2.7 s
    for FedRAP's ``[943, 53,824]`` on MovieLens 100K here, these blocks 1.4-1.7 s
    (docs/benchmarks.md)."""
    m, d = x.shape
    ring = np.empty((m, d), dtype=np.uint64) if out is None else out
    rows = max(1, SECURE_CHUNK // d)

    def block(lo: int) -> None:
        hi = min(m, lo + rows)
        ints = ddg.round_update(x[lo:hi], generator=None, secure=True)
        ints.add_(ddg.client_share(hi - lo, generator=None, secure=True))
        codec.encode_integers(ints.numpy(), out=ring[lo:hi])

    starts = range(0, m, rows)
    with ThreadPoolExecutor(max_workers=min(len(starts), SECURE_WORKERS)) as threads:
        for done in [threads.submit(block, lo) for lo in starts]:
            done.result()
    return ring


class EncodedBlocks:
    """Clipped client updates put in the ring a block of coordinates at a time.

    A :class:`~protocols.secagg.RingBlocks` for :func:`~protocols.secagg.secure_sum`: block
    ``[lo, hi)`` is ``codec.encode(updates.dense_block(lo, hi) * factors)``, the rounding of
    each :data:`~securefed.costs.ENCODE_TILE` coordinates drawn from the generator ``(seed,
    stream, round, tile)``. Nothing ``[clients, d]``-sized is held.
    """

    align = ENCODE_TILE

    def __init__(
        self,
        updates: ClientUpdates,
        factors: torch.Tensor,
        codec: Any,
        *,
        seed: int,
        stream: str,
        round_index: int,
    ) -> None:
        self.shape = (len(updates), updates.layout.size)
        self._updates = updates
        self._factors = factors.unsqueeze(1)
        self._codec = codec
        self._rng = (seed, stream, round_index)
        self._local = threading.local()

    def block(self, lo: int, hi: int) -> np.ndarray:
        """The ring inputs of coordinates ``lo .. hi - 1`` (``lo`` on a tile boundary).

        The array is this thread's buffer, overwritten by its next call (the engine asks for
        a thread's next block once it has finished with the last): blocks of hundreds of MB
        allocated inside a mask thread would otherwise be fresh mappings every time, faulted
        in page by page (glibc's thread arenas cannot hold them)."""
        m, w = self.shape[0], hi - lo
        held = getattr(self._local, "buffers", None)
        if held is None or held[0].shape != (m, w):  # a thread's last block is narrower
            held = (np.empty((m, w), dtype=np.uint64), torch.empty(m, w))
            self._local.buffers = held
        out = held[0]
        x = self._updates.dense_block(lo, hi, out=held[1]).mul_(self._factors).numpy()
        seed, stream, round_index = self._rng
        # A tile is encoded a few rows at a time, in order (the same draws as the whole
        # tile: encode consumes its generator in C order), into a small buffer: whole-tile
        # temporaries (96 MB at 3,000 clients) allocated in a mask thread are fresh mappings
        # faulted in page by page every time.
        rows = max(1, _TILE_PIECE_BYTES // (ENCODE_TILE * 8))
        piece = np.empty(min(rows, x.shape[0]) * ENCODE_TILE, dtype=np.uint64)
        for a in range(lo, hi, ENCODE_TILE):
            b = min(hi, a + ENCODE_TILE)
            rng = numpy_generator(seed, stream, round_index, a // ENCODE_TILE)
            for r0 in range(0, x.shape[0], rows):
                r1 = min(x.shape[0], r0 + rows)
                dst = piece[: (r1 - r0) * (b - a)].reshape(r1 - r0, b - a)
                self._codec.encode(x[r0:r1, a - lo : b - lo], rng=rng, out=dst)
                out[r0:r1, a - lo : b - lo] = dst
        return out


class DiscreteGaussianBlocks:
    """Distributed discrete-Gaussian inputs (Kairouz et al. 2021) a block of coordinates at a
    time: each client's conditionally rounded update plus its noise share, in the ring.

    Conditional randomized rounding accepts a client's rounding only when its whole rounded
    vector's L2 norm is within the plan's bound, so it cannot be decided block by block. The
    constructor therefore makes the rounding draws first, tile by tile
    (:data:`~securefed.costs.ENCODE_TILE` coordinates), keeping only one bit per coordinate
    (rounded up or down: ``m * d / 8`` bytes, 0.5 GB for 3,000 clients at 1.31 M coordinates)
    and each client's squared norm, and redraws every tile of the clients over the bound, as
    :func:`~protocols.dp.mechanisms.conditional_randomized_round` does; :meth:`block` then
    recomputes the same floors from the same floats, adds the stored bits and draws the noise
    shares of the block (OS randomness, or per-tile generators in a replay run).
    """

    align = ENCODE_TILE  # a multiple of 8: tiles start on whole bytes of the bits

    def __init__(
        self,
        updates: ClientUpdates,
        factors: torch.Tensor,
        codec: Any,
        ddg: DistributedDiscreteGaussian,
        *,
        seed: int,
        round_index: int,
        secure: bool,
        max_tries: int = 1000,
    ) -> None:
        m, dim = len(updates), updates.layout.size
        self.shape = (m, dim)
        self._updates = updates
        self._factors = factors.unsqueeze(1)
        self._codec = codec
        self._plan = ddg.plan
        self._rng = (seed, round_index)
        self._secure = secure
        self._bits = np.zeros((m, -(-dim // 8)), dtype=np.uint8)
        self._local = threading.local()
        bound = self._plan.l2_sensitivity_after_rounding
        pending = torch.arange(m)
        for attempt in range(max_tries):
            sq = torch.zeros(pending.shape[0], dtype=torch.float64)
            for lo in range(0, dim, ENCODE_TILE):
                hi = min(dim, lo + ENCODE_TILE)
                low, frac = self._scaled(lo, hi, pending)
                up = below(frac, self._generator("dp-round", lo, attempt), secure)
                sq += (low + up).square().sum(1)
                self._store(pending, lo, up)
            pending = pending[sq.sqrt() > bound]
            if pending.numel() == 0:
                return
        raise ProtocolError(
            f"{pending.numel()} update(s) exceeded the rounded L2 bound {bound:.6g} after "
            f"{max_tries} tries; clip updates to the configured norm before rounding"
        )

    def _generator(self, purpose: str, lo: int, attempt: int = 0) -> torch.Generator | None:
        if self._secure:
            return None
        seed, round_index = self._rng
        return torch_generator(seed, purpose, round_index, lo // ENCODE_TILE, attempt)

    def _scaled(
        self, lo: int, hi: int, rows: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Floors and fractional parts of the scaled, clipped updates on ``lo .. hi - 1``."""
        # Clipped as the in-memory round clips (in the update's float32, which clip_scales
        # keeps within the clip), then scaled in float64 as the rounding does.
        x = (self._updates.dense_block(lo, hi) * self._factors).to(torch.float64)
        if rows is not None:
            x = x[rows]
        y = x.mul_(self._plan.scale)
        low = torch.floor(y)
        return low, y.sub_(low)

    def _store(self, rows: torch.Tensor, lo: int, up: torch.Tensor) -> None:
        # ``lo`` is a multiple of 8 (a tile boundary): whole bytes.
        packed = np.packbits(up.numpy(), axis=1, bitorder="little")
        self._bits[rows.numpy(), lo // 8 : lo // 8 + packed.shape[1]] = packed

    def rounded(self, lo: int, hi: int) -> torch.Tensor:
        """The accepted conditional rounding of coordinates ``lo .. hi - 1``, int64."""
        x = self._updates.dense_block(lo, hi) * self._factors
        return self._rounded_rows(x, 0, self.shape[0], lo, hi)

    def _rounded_rows(self, x: torch.Tensor, r0: int, r1: int, lo: int, hi: int) -> torch.Tensor:
        """Rows ``r0 .. r1 - 1`` of the accepted rounding of coordinates ``lo .. hi - 1``: the
        floors of the clipped floats ``x`` (``[m, hi - lo]``, as :meth:`_scaled` makes them)
        plus the stored bits."""
        low = torch.floor(x[r0:r1].to(torch.float64).mul_(self._plan.scale))
        up = np.unpackbits(
            self._bits[r0:r1, lo // 8 : -(-hi // 8)], axis=1, count=hi - lo, bitorder="little"
        )
        return low.to(torch.int64).add_(torch.from_numpy(up))

    def block(self, lo: int, hi: int) -> np.ndarray:
        """Ring inputs of coordinates ``lo .. hi - 1``: rounding plus fresh noise shares.

        The array is this thread's buffer, overwritten by its next call (as
        :meth:`EncodedBlocks.block`'s). On OS randomness the block is made a few rows at a
        time (about :data:`~protocols.dp.noise.SECURE_CHUNK` coordinates: floors, stored bits,
        noise shares and ring words while in cache); a replay run draws each tile's noise from
        its own generator over all rows, as before."""
        m, w = self.shape[0], hi - lo
        held = getattr(self._local, "buffers", None)
        if held is None or held[0].shape != (m, w):  # a thread's last block is narrower
            held = (np.empty((m, w), dtype=np.uint64), torch.empty(m, w))
            self._local.buffers = held
        ring, floats = held
        x = self._updates.dense_block(lo, hi, out=floats).mul_(self._factors)
        sigma = self._plan.share_sigma
        if not self._secure:
            ints = self._rounded_rows(x, 0, m, lo, hi)
            for a in range(lo, hi, ENCODE_TILE):  # noise per tile (a replay's generators)
                b = min(hi, a + ENCODE_TILE)
                ints[:, a - lo : b - lo] += discrete_gaussian(
                    (m, b - a), sigma, generator=self._generator("dp-noise", a), secure=False
                )
            return self._codec.encode_integers(ints.numpy(), out=ring)
        rows = max(1, SECURE_CHUNK // w)
        for r0 in range(0, m, rows):
            r1 = min(m, r0 + rows)
            ints = self._rounded_rows(x, r0, r1, lo, hi)
            ints += discrete_gaussian((r1 - r0, w), sigma, generator=None, secure=True)
            self._codec.encode_integers(ints.numpy(), out=ring[r0:r1])
        return ring


#: Recorded in the summary and ledger of every replay run and printed by the CLI. Opacus's
#: ``secure_mode=False`` warning says only that the RNG is "not secure"; this says what an
#: attacker can do with it and against whom the printed epsilon still holds.
REPLAY_WARNING = (
    "REPLAY RUN (--replay-from-seed): every DP noise draw, every cohort and the secure-"
    "aggregation seed were derived from seed {seed}, which config.toml and summary.json "
    "record. Anyone who knows that seed can regenerate the noise, subtract it from the released "
    "aggregates and recover the sums of the clipped client updates exactly. {epsilon} "
    "holds only against an observer who does not know the seed. Use replay runs to reproduce "
    "experiments; never publish a model trained this way on real users' data: train without "
    "--replay-from-seed, which draws all of it from the OS."
)


def secagg_engine(config: Any) -> Literal["batched", "objects"]:
    """The simulation engine of a secure round: the batched one, or in malicious mode (which
    the batched engine does not run: no signatures, no consistency round) the per-client
    stage machines, with fresh enrollments each round (slower; docs/secagg.md)."""
    return "objects" if config.malicious else "batched"


#: Cohort sizes tried for the smallest one secure aggregation accepts (secure_minimum).
_SECURE_MINIMUM_SEARCH = 4096
# ceil((1 - f - g) m) in floating point: 1 - 0.2 - 0.1 is 0.7000000000000001, so 10 of it
# would need 8 honest shares (a share divisor below the exact product by at most this keeps
# the honest floor's guarantee; see min_survivors).
_CEIL_SLACK = 1e-9


class PrivateAggregator:
    """Clip, noise, securely sum and account one round's updates (see module docstring)."""

    def __init__(
        self, config: TrainConfig, split: Split, *, dim: int, dpsgd: DPSGDConfig | None = None
    ) -> None:
        p = config.privacy
        self.seed = config.seed
        self.rounds = config.rounds
        self.dim = dim
        self._ring_buffer: np.ndarray | None = None
        self.cohort = config.cohort(split.n_users)
        self.n_users = split.n_users
        self._null_users = split.null_users
        self.sample_rate = self.cohort.sample_rate(split.n_users)
        self.expected_cohort = self.cohort.expected_size(split.n_users)
        self.secagg = p.secagg
        self.config = config
        # DP noise, cohorts and the public seed from the OS in every DP run that does not replay.
        self.secure = p.os_randomness
        self.replay = p.dp and p.replay
        self.p = p
        self.ledger = PrivacyLedger()
        self._journal: Path | None = None  # the run's ledger file, written ahead (attach)
        self._last: dict[str, Any] = {}
        self._interaction_epsilon = 0.0
        placement = p.placement
        spec = config.spec
        default = spec.default_clip(config.params)
        clip = p.clip if p.clip is not None else (default or DEFAULT_SECAGG_BOUND)
        self.dp: DPConfig | None = None
        self.noise_multiplier: float | None = None
        self.clip = clip if p.dp else (p.clip if p.clip is not None else DEFAULT_SECAGG_BOUND)
        # Distributed discrete noise (secure aggregation with user-level DP): the fixed-point
        # scale, and each cohort size's plan (:meth:`discrete_noise`).
        self._discrete_scale: float | None = None
        self._noise_plans: dict[int, DistributedDiscreteGaussian] = {}
        self._secure_minimum: int | None = None
        if placement == "distributed" and not p.secagg and p.dp:
            placement_note = (
                "continuous Gaussian shares without secure aggregation: the server sees each "
                "client's upload with only that client's share of the noise; the epsilon "
                "covers the released sum, not the uploads (add --secagg)"
            )
        else:
            placement_note = None
        self.placement_note = placement_note
        self.dpsgd: DPSGDConfig | None = None
        self.interaction: DPConfig | None = None
        self.releases_per_round = interaction_steps_per_round(config) if p.interaction_dp else 0
        # The private popularity prior (securefed.prior): its own release, sized before the
        # model's sigma, which is calibrated for the rest of the budget.
        self.prior_noise_multiplier: float | None = None
        self.prior_clip = math.sqrt(p.prior_items)
        if p.interaction_dp:
            # Client-side DP-SGD: the uploads are already private; this seam adds no noise
            # and, with secure aggregation, ``clip`` is only the bound on each input.
            self.clip = p.clip if p.clip is not None else DEFAULT_SECAGG_BOUND
            self.dpsgd = dpsgd if dpsgd is not None else interaction_dpsgd(config, split)
            self.interaction = DPConfig(
                epsilon=p.epsilon,
                delta=p.delta,
                noise_multiplier=p.noise_multiplier,
                clip=self.dpsgd.example_clip,
                accountant=p.accountant or "prv",
                privacy_unit="interaction",
                secure=p.os_randomness,
            )
        elif p.dp:
            # Distributed noise is accounted with RDP (protocols.dp.DPConfig requires it).
            accountant = p.user_accountant
            self.dp = DPConfig(
                epsilon=p.epsilon,
                delta=p.delta,
                noise_multiplier=p.noise_multiplier,
                clip=clip,
                accountant=accountant,
                placement=placement,
                privacy_unit=p.privacy_unit,
                secure=p.os_randomness,
            )
            self.dp.check_population(split.n_users)
            if p.prior_share is not None:
                from securefed.prior import prior_noise_multiplier

                self.prior_noise_multiplier = prior_noise_multiplier(
                    epsilon=float(p.epsilon),  # type: ignore[arg-type]
                    delta=p.delta,
                    share=float(p.prior_share),
                    accountant=accountant,
                )
            if p.ring_noise:
                self._setup_discrete()
            elif placement == "distributed":
                # Continuous shares sized for every sampled client surviving (no dropouts
                # without secure aggregation): accounted exactly like the central Gaussian.
                self.noise_multiplier = self._central_sigma(accountant=accountant)
            else:
                self.noise_multiplier = self._central_sigma(accountant=accountant)
        self._refuse_a_cap_round_one_passes()

    # ------------------------------------------------------------------ setup
    def _refuse_a_cap_round_one_passes(self) -> None:
        """``--epsilon`` with ``--noise-multiplier`` is a budget cap (the run stops before a
        round that would pass it); a cap that round 1 alone passes would train nothing and
        exit as if it had run, so it is refused before anything is written."""
        p = self.p
        if p.epsilon is None or p.noise_multiplier is None:
            return
        cfg = self.budget
        if cfg is None:
            return
        if self.dpsgd is not None or self.secagg:
            # Round 1's most (the largest cohort at the fewest survivors its noise is sized for).
            events = self.worst_round_events(0, self._largest_cohort())
        else:
            assert self.noise_multiplier is not None
            central = CentralGaussian(clip=cfg.clip, noise_multiplier=self.noise_multiplier)
            events = [central.event(0, sample_rate=self.sample_rate)]
        eps = PrivacyLedger(events).epsilon(cfg.delta, cfg.accountant)
        if eps > float(p.epsilon):
            raise PrivacyBudgetError(
                f"--noise-multiplier {p.noise_multiplier:g} spends epsilon {eps:.4g} in round "
                f"1 alone, above the --epsilon {p.epsilon:g} cap, so nothing would train; "
                "raise --noise-multiplier, or give --epsilon alone (it calibrates the noise)"
            )

    def _central_sigma(self, *, accountant: str) -> float:
        assert self.dp is not None
        if self.prior_noise_multiplier is not None:
            from securefed.prior import calibrate_remaining

            return calibrate_remaining(
                epsilon=float(self.dp.epsilon),  # type: ignore[arg-type]
                delta=self.dp.delta,
                fixed=[(self.prior_noise_multiplier, 1.0, 1)],
                sample_rate=self.sample_rate,
                steps=self.rounds,
                accountant=accountant,
            )
        cfg = DPConfig(**{**self.dp.to_dict(), "accountant": accountant, "placement": "central"})
        return cfg.resolve_noise_multiplier(
            sample_rate=self.sample_rate, steps=self.rounds, n_users=self.n_users
        )

    def secure_minimum(self) -> int:
        """The fewest clients a secure round can have at this run's secure-aggregation
        settings: below it no (neighbours, threshold) meets the security and correctness
        bounds (``SecAggConfig`` refuses it; 4 at the defaults), or, with noise shares in the
        ring, whose survivor floor (:meth:`min_survivors`) exceeds its clients (10 at the
        defaults), and the round aborts before anything is encoded, releasing nothing. A
        Poisson cohort can fall that low where its expected size is small."""
        if self._secure_minimum is None:
            error: ConfigError | None = None
            for n in range(2, _SECURE_MINIMUM_SEARCH):
                try:
                    self.secagg_config(n)
                except ConfigError as exc:
                    error = exc
                    continue
                self._secure_minimum = n
                break
            else:
                assert error is not None
                raise error
            if self.p.ring_noise and self.p.secagg_corrupt > 0:
                # The floor fits every m >= 1 / f (ceil((1 - f) m) < m leaves room for the
                # one survivor the colluders' rounding can add), not always below: start
                # after the last cohort size it does not fit, so every larger one aggregates
                # (f >= 1e-4 where g > 0, PrivacyConfig: at most 10,000 sizes to look at;
                # without colluders the floor is ceil((1 - f) m) <= m for every m).
                top = math.ceil(1.0 / self.p.secagg_dropout) + 2
                short = [
                    n
                    for n in range(self._secure_minimum, max(top, _SECURE_MINIMUM_SEARCH))
                    if self.min_survivors(n) > n
                ]
                if short:
                    self._secure_minimum = short[-1] + 1
        return self._secure_minimum

    def secagg_config(
        self,
        n: int,
        modulus_bits: int | None = None,
        survivors: int | None = None,
        *,
        choose_graph: bool = False,
    ) -> SecAggConfig:
        """The SecAgg(+) configuration of a secure round of ``n`` clients at this run's
        settings (neighbours, dropout tolerance, corrupt fraction, mode; ``survivors``: the
        fewest inputs it may unmask, which malicious-mode clients enforce). With
        ``choose_graph`` the neighbours are chosen for ``n`` (the run's are for its training
        cohorts: a Flower evaluation round has every user)."""
        from protocols.secagg import SecAggConfig

        return SecAggConfig(
            n_clients=n,
            neighbours=None if choose_graph else self.p.secagg_neighbours,
            dropout_tolerance=self.p.secagg_dropout,
            corrupt_fraction=self.p.secagg_corrupt,
            modulus_bits=modulus_bits,
            mode=self.p.secagg_mode,
            survivors=survivors,
        )

    def secure_parameters(self, m: int) -> tuple[FixedPointCodec, SecAggConfig]:
        """The fixed-point codec and SecAgg configuration of a secure round of ``m`` clients:
        the ring holds ``m`` clipped inputs (with distributed noise: rounded updates and one
        noise share each, :meth:`discrete_noise`). The Flower server and nodes derive theirs
        here too (:func:`securefed.flower.pipeline.round_parameters`), so both sides agree
        with the in-process round bit for bit."""
        from protocols.secagg import FixedPointCodec

        ddg = self.discrete_noise(m)
        if ddg is not None:
            plan = ddg.plan
            codec = FixedPointCodec.for_sum(
                n_clients=m,
                clip=plan.l2_sensitivity_after_rounding / plan.scale,
                scale=plan.scale,
                extra_int_bound=int(plan.noise_sum_bound(1)),
            )
        else:
            codec = FixedPointCodec.for_sum(
                n_clients=m, clip=self.clip, scale_bits=self.p.secagg_scale_bits
            )
        # Distributed noise is sized for ddg.plan.min_survivors shares: a malicious-mode
        # client refuses to unmask fewer (the graph's own floor can be lower).
        survivors = ddg.plan.min_survivors if ddg is not None else None
        return codec, self.secagg_config(m, codec.modulus_bits, survivors)

    def too_few(self, m: int) -> str:
        """Why a secure round of ``m`` clients aborted before it began."""
        return (
            f"{m} participants, fewer than the {self.secure_minimum()} secure aggregation needs "
            "at these settings"
        )

    def min_survivors(self, m: int) -> int:
        """The fewest of a secure round's ``m`` clients whose noise shares may make up a
        released sum: ``ceil((1 - f) m)`` (``f`` the dropout tolerance), raised where needed
        so that the honest shares among them number at least ``(1 - f - g) m`` (``g`` the
        corrupt fraction; :meth:`honest_share_fraction`), the count the shares are sized for:
        ``ceil((1 - f - g) m) + ceil(g m)``, one more than ``ceil((1 - f) m)`` for some
        ``m`` (and more than ``m`` itself below 10 clients at the defaults: such a round
        cannot carry its noise and aborts, :meth:`secure_minimum`).

        SecAgg+'s Shamir threshold t is per neighbourhood (k neighbours), not a global bound,
        so the guarantee is this floor: a round whose survivors fall below it is aborted
        before anything is released (:meth:`_secure_round`).
        """
        honest = math.ceil(self.honest_share_fraction() * m - _CEIL_SLACK)
        return max(1, math.ceil((1.0 - self.p.secagg_dropout) * m), honest + self.colluders(m))

    def honest_share_fraction(self) -> float:
        """``1 - f - g``: the fraction of a secure round's ``m`` clients whose noise shares
        a round always holds against the server and its colluders; each share is sized for
        that many (:meth:`discrete_noise`)."""
        return 1.0 - self.p.secagg_dropout - self.p.secagg_corrupt

    def colluders(self, m: int) -> int:
        """The most of a secure round's ``m`` clients that may collude with the server:
        ``ceil(corrupt_fraction m)``, secure aggregation's own bound (``SecAggConfig``).
        Their noise shares are known to the coalition, so they are not noise against it."""
        return math.ceil(self.p.secagg_corrupt * m)

    def honest_shares(self, survivors: int, m: int) -> int:
        """The noise shares in a secure round's sum that the server and its colluders do not
        know: the ``survivors`` less the round's :meth:`colluders`, and at least the share of
        the user the guarantee protects (an honest survivor of any sum it is in)."""
        return max(1, survivors - self.colluders(m))

    def _largest_cohort(self) -> int:
        if self.cohort.kind == "fixed":
            return max(2, min(self.cohort.size, self.n_users))
        return max(2, self.n_users)

    def discrete_noise(self, m: int) -> DistributedDiscreteGaussian | None:
        """The distributed discrete Gaussian of a secure round of ``m`` clients (``None``
        unless the run adds discrete noise shares in the ring).

        Each share is sized for the round's own cohort: variance ``sigma^2 D2^2 / ((1 - f -
        g) m)`` (``f`` the dropout tolerance, ``g`` the corrupt fraction), so the honest
        shares of any :meth:`min_survivors` survivors (all but :meth:`colluders`, whose
        shares the server may learn) carry at least the calibrated ``sigma^2 D2^2`` and a
        round everyone survives carries ``sigma^2 D2^2 / (1 - f - g)`` whatever ``m`` is.
        Sizing every round for a fixed ``t`` instead (the expected Poisson cohort, as before
        2026-12-06) aborted every round whose sample fell short (about 30 % at MovieLens
        100K, q = 0.1), and both the aborts and the noise's size (``m / t`` of the
        calibrated variance, measurable over ``d`` coordinates) told an observer of the
        releases each round's cohort size, which the amplified epsilon does not cover
        (docs/privacy.md, "Distributed noise sized for each round's cohort").
        """
        if self._discrete_scale is None or self.noise_multiplier is None:
            return None
        m = int(m)
        ddg = self._noise_plans.get(m)
        if ddg is None:
            assert self.dp is not None
            t = self.min_survivors(m)
            if t > m:
                raise ConfigError(self.too_few(m))
            plan = distributed_noise_plan(
                clip=self.dp.clip,
                noise_multiplier=self.noise_multiplier,
                scale=self._discrete_scale,
                dim=self.dim,
                min_survivors=t,
                cohort_size=m,
                share_divisor=min(
                    float(self.honest_shares(t, m)), self.honest_share_fraction() * m
                ),
            )
            ddg = self._noise_plans[m] = DistributedDiscreteGaussian(plan=plan)
        return ddg

    def _setup_discrete(self) -> None:
        """Calibrate sigma for the run's largest possible cohort: each round's shares are
        sized for its own ``m`` (:meth:`discrete_noise`), so every round's sum carries at
        least ``sigma^2 D2^2`` and its shares are at least as large as the calibration's
        (Kairouz et al.'s correction ``tau`` shrinks with the share and grows with the count)."""
        assert self.dp is not None
        largest = self._largest_cohort()
        # Settings no cohort of this run meets fail here, once: secure_minimum would try
        # every size up to 4,096 first (minutes at dropout 0.5 and corrupt 0.3).
        self.secagg_config(largest)
        if largest < self.secure_minimum():
            raise ConfigError(
                f"the largest cohort of this run is {largest} clients, fewer than the "
                f"{self.secure_minimum()} a secure round with noise shares needs at these "
                "settings; use more users, or a larger secagg_dropout or a smaller "
                "secagg_corrupt in [privacy]"
            )
        # Calibrated for the honest shares of the fewest survivors: the colluders' shares
        # are not noise against the coalition secure aggregation is built to withstand.
        t = self.honest_shares(self.min_survivors(largest), largest)
        scale = float(2**self.p.secagg_scale_bits)
        if self.p.noise_multiplier is not None:
            sigma = float(self.p.noise_multiplier)
        else:
            sigma = calibrate_distributed_noise_multiplier(
                epsilon=float(self.p.epsilon),  # type: ignore[arg-type]
                delta=self.p.delta,
                sample_rate=self.sample_rate,
                steps=self.rounds,
                clip=self.dp.clip,
                scale=scale,
                dim=self.dim,
                min_survivors=t,
                n_users=self.n_users,
            )
        self._discrete_scale = scale
        self.noise_multiplier = sigma
        self.discrete_noise(largest)  # refuses a share below 0.5 units now

    # ------------------------------------------------------------------ one round
    def begin_round(self, round_index: int) -> None:
        """Account a round's local DP-SGD before any client trains (interaction unit).

        One event per Gaussian release an interaction enters in a round (FedRAP: one per local
        epoch; FedRecGEL: one per SAM pass per local step, :func:`sam_releases`), recorded
        for every round whether or not a given client is sampled, and written ahead to the
        run's ledger file (:meth:`commit`). With a budget cap a round that would overspend
        raises PrivacyBudgetError before anything runs.
        """
        if self.dpsgd is None or self.interaction is None:
            return
        self._interaction_epsilon = self.commit(*self._dpsgd_events(round_index))

    def _dpsgd_events(self, round_index: int) -> list[Any]:
        assert self.dpsgd is not None
        return [
            dpsgd_event(
                round_index,
                noise_multiplier=self.dpsgd.noise_multiplier,
                example_clip=self.dpsgd.example_clip,
            )
            for _ in range(self.releases_per_round)
        ]

    @property
    def budget(self) -> DPConfig | None:
        """The DP config the ledger is accounted and capped by (``None`` without DP)."""
        return self.interaction if self.interaction is not None else self.dp

    def worst_round_events(self, round_index: int, m: int) -> list[Any]:
        """The privacy events a user's upload in a secure round of ``m`` clients can cost at
        most: the round's local DP-SGD releases, or its user-level event with the fewest
        survivors the noise shares are sized for (the server's own event counts the real
        survivors; an honest server aborts below the floor, and in malicious mode every
        client refuses a smaller survivor set; the colluders' shares never count as noise,
        :meth:`secure_event`). A Flower node charges these to its own ledger
        before it trains, and the server to its own before it asks
        (:class:`securefed.flower.pipeline.ReleaseLedger`).
        """
        if self.dpsgd is not None:
            return self._dpsgd_events(round_index)
        if self.dp is None:
            return []
        ddg = self.discrete_noise(m)
        survivors = ddg.plan.min_survivors if ddg is not None else m
        return [self.secure_event(round_index, survivors, m)]

    def _generator(self, purpose: str, round_index: int) -> torch.Generator | None:
        if self.secure:
            return None
        return torch_generator(self.seed, purpose, round_index)

    def draw_seed(self) -> int:
        """The root seed of a round's draws that serve the clients in order from one stream
        and are not noise: the plain codec's stochastic rounding (central noise after the
        secure sum, the prior's secure sum, a Flower node's inputs without discrete noise) and
        the simulated dropouts. From a seed the run records, removing a user would shift
        every later user's draws (rounding: 2e-5 of the clip; dropouts, which FedRAP's
        batch-count order ties to the data: 3.7 clips at rate 0.04; both found in review), so
        a DP run drawing from the OS takes a fresh one from the OS."""
        return secrets.randbits(63) if self.secure else self.seed

    def clip_factors(self, updates: ClientUpdates) -> tuple[torch.Tensor, torch.Tensor]:
        """Each upload's scale ``min(1, C / ||x||)`` (zero for the split's null users: the
        zero-out canaries, :func:`null_out`) and which uploads the clip scaled (bool, one per
        row, :func:`protocols.dp.clipped_rows`); a Flower node clips its users' uploads with
        it too."""
        norms = updates.norms()
        factors = null_out(clip_scales(norms, self.clip), updates.clients, self._null_users)
        return factors, clipped_rows(norms, self.clip)

    def __call__(self, updates: ClientUpdates, round_index: int) -> Aggregate | None:
        m = len(updates)
        factors, clipped = self.clip_factors(updates)
        self._last = {"clipped_fraction": int(clipped.sum()) / m if m else 0.0}
        denominator = self._denominator(m)
        if self.secagg:
            return self._secure_round(updates, factors, round_index, denominator)
        if self.dp is None:
            if m == 0:
                return None
            return Aggregate(
                total=updates.weighted_sum(factors), contributors=m, denominator=denominator
            )
        assert self.noise_multiplier is not None
        if self.dp.placement == "distributed":
            mech = DistributedGaussian(
                clip=self.dp.clip, noise_multiplier=self.noise_multiplier, min_survivors=max(m, 1)
            )
            event = mech.event(
                round_index, sample_rate=self.sample_rate, noise_contributors=max(m, 1)
            )
        else:
            event = CentralGaussian(
                clip=self.dp.clip, noise_multiplier=self.noise_multiplier
            ).event(round_index, sample_rate=self.sample_rate)
        # Account before release: the event is on disk before the noised sum exists, and a
        # round that would overspend never runs.
        self.commit(event)
        total = updates.weighted_sum(factors) if m else torch.zeros(self.dim)
        if self.dp.placement == "distributed" and m:
            shares = mech.client_share(
                (m, self.dim),
                generator=self._generator("dp-noise", round_index),
                secure=self.secure,
            )
            total = total + shares.sum(0)
        else:
            # Central noise, or an empty Poisson cohort under distributed noise: no client to
            # add a share, so the server adds the one share the event records (std sigma C).
            central = CentralGaussian(clip=self.dp.clip, noise_multiplier=self.noise_multiplier)
            total = total + central.noise_for_sum(
                self.dim, generator=self._generator("dp-noise", round_index), secure=self.secure
            )
        return Aggregate(
            total=total, contributors=m, denominator=denominator, noise_std=self._noise_std()
        )

    def release_prior(self, updates: ClientUpdates, round_index: int = 0) -> torch.Tensor:
        """Release the popularity prior's noisy sum of every user's bounded indicator.

        The Gaussian mechanism on the sum (unit: one user; L2 sensitivity ``sqrt(k)``, the
        contribution bound :mod:`securefed.prior` applies on the device; clipped here to it as
        well), sample rate 1. Accounted before release, as every round: the event is in the
        ledger and on disk before the noisy sum exists. With secure aggregation the server
        learns only the sum of the masked indicators and adds the noise itself (central
        placement, as for ``--noise central``).

        Raises:
            ConfigError: the run has no popularity prior.
            PrivacyBudgetError: the release would overspend (nothing is released).
        """
        if self.dp is None or self.prior_noise_multiplier is None:
            raise ConfigError("this run has no popularity prior (--private-prior)")
        mech = CentralGaussian(clip=self.prior_clip, noise_multiplier=self.prior_noise_multiplier)
        self.commit(mech.event(round_index, sample_rate=1.0))
        norms = updates.norms()
        factors = null_out(clip_scales(norms, self.prior_clip), updates.clients, self._null_users)
        dim = updates.layout.size
        if self.secagg:
            total = self._secure_plain_sum(updates, factors, round_index)
            # The unmasked sum holds rounded indicators: size the noise for their bound.
            mech = CentralGaussian(
                clip=self.rounded_sensitivity(self.prior_clip, dim),
                noise_multiplier=self.prior_noise_multiplier,
            )
        else:
            total = updates.weighted_sum(factors)
        return total + mech.noise_for_sum(
            dim, generator=self._generator("prior-noise", round_index), secure=self.secure
        )

    def _secure_plain_sum(
        self, updates: ClientUpdates, factors: torch.Tensor, round_index: int
    ) -> torch.Tensor:
        """The securely aggregated sum of clipped ``updates`` (every client survives), for a
        release whose noise the server adds after unmasking."""
        from protocols.secagg import FixedPointCodec, secure_sum

        m = len(updates)
        codec = FixedPointCodec.for_sum(
            n_clients=m, clip=self.prior_clip, scale_bits=self.p.secagg_scale_bits
        )
        sa_cfg = self.secagg_config(m, codec.modulus_bits)
        # The prior's count uploads give any block cheaply (MostPopUpdates.dense_block).
        ring = self._ring_inputs(
            updates,
            factors,
            codec,
            "secagg-encode-prior",
            round_index,
            streamed=m * updates.layout.size > STREAM_RING_WORDS,
        )
        seed = derive_seed(self.seed, "secagg-public-prior", round_index).to_bytes(8, "little")
        public_seed = secrets.token_bytes(16) if self.secure else seed * 2
        result = secure_sum(
            ring,
            config=sa_cfg,
            round_index=round_index,
            public_seed=public_seed,
            engine=secagg_engine(sa_cfg),
        )
        return torch.from_numpy(codec.decode_sum(result.sum)).to(torch.float32)

    def _noise_std(self) -> float:
        """Per-coordinate std of the user-level noise in a released sum (its lower end for
        distributed noise, whose shares are sized for the fewest survivors)."""
        if self.dp is None or self.noise_multiplier is None:
            return 0.0
        if self.secagg and self._discrete_scale is None:
            return float(self.noise_multiplier * self.rounded_sensitivity(self.dp.clip, self.dim))
        return float(self.noise_multiplier * self.dp.clip)

    def rounded_sensitivity(self, clip: float, dim: int) -> float:
        """L2 sensitivity of one clipped input of ``dim`` coordinates after the plain codec's
        stochastic rounding: each coordinate moves by less than one fixed-point step, so
        ``clip + sqrt(dim) / scale``. Central noise added to a secure sum is sized for it
        (until 2026-12-06 it was sized for ``clip`` alone: at the default 16 scale bits,
        0.035 % short for FedRAP on MovieLens 100K, ``d`` 53,824 at clip 10)."""
        return float(clip) + math.sqrt(dim) / float(2**self.p.secagg_scale_bits)

    def _denominator(self, m: int) -> float:
        if self.dp is not None and self.cohort.kind == "poisson":
            return max(self.expected_cohort, 1.0)
        return float(max(m, 1))

    def commit(self, *events: Any, check_budget: bool = True) -> float:
        """Account releases before they happen: check the budget, record, write ahead.

        ``check_budget=False`` records a release that has already happened whatever the
        budget says (accounting must never under-count).

        The events join the ledger (in round order: a round re-run after a resume is recorded
        again next to its first release, see :meth:`attach`) and, when a run directory is
        attached, the whole ledger is written to its ``privacy_ledger.json`` and fsynced
        before this returns, so no release the events cover can leave the aggregator before
        it is on disk; a crash at any later point leaves a ledger that counts it.

        Returns:
            The epsilon after recording.

        Raises:
            PrivacyBudgetError: the events would take epsilon above the target; nothing is
                recorded and the caller must not release.
        """
        cfg = self.budget
        assert cfg is not None
        after, eps = ledger_with(self.ledger, events, cfg)
        if check_budget and cfg.epsilon is not None and eps > cfg.epsilon:
            unit = "interaction-level " if self.interaction is not None else ""
            raise PrivacyBudgetError(
                # Rounds as the metrics count them (from 1); the ledger keeps the index.
                f"round {events[0].round + 1} would raise {unit}epsilon to {eps:.4g} above the "
                f"target {cfg.epsilon:.4g} (delta={cfg.delta!r}); stop training or raise the "
                "budget"
            )
        self.ledger = after
        self._last["epsilon"] = eps
        self._persist()
        return eps

    def withdraw(self, event: Any) -> None:
        """Take back an event committed for a round that then aborted before anything was
        released (secure aggregation recovered no sum), and rewrite the ledger file."""
        events = list(self.ledger.events)
        for i in range(len(events) - 1, -1, -1):
            if events[i] == event:
                del events[i]
                break
        else:
            raise ValueError("withdraw: the event was never committed")
        self.ledger = PrivacyLedger(events)
        cfg = self.budget
        assert cfg is not None
        self._last["epsilon"] = self.ledger.epsilon(cfg.delta, cfg.accountant)
        self._persist()

    def attach(self, run_dir: Path, *, resume: bool, start_round: int = 0) -> None:
        """Write the ledger ahead of every release into ``run_dir/privacy_ledger.json``.

        On resume the ledger file, not the checkpoint, is the record: it holds every release
        made, including those of rounds after the last checkpoint that the resumed run will
        make again (with fresh noise: every such release is counted again, docs/privacy.md,
        "Resume"). The checkpoint's events must all be in it. The rounds from
        ``start_round`` on then get the sigma that fits them beside the ledger
        (:meth:`fit_rounds_left`).

        Raises:
            IntegrityError: a DP run resumed without a readable ledger file, or with one that
                lacks events its checkpoint recorded.
        """
        self._journal = Path(run_dir) / runs.LEDGER_FILE
        if resume and (self.dp is not None or self.interaction is not None):
            recorded = read_ledger_file(self._journal)
            missing = Counter(self.ledger.events)
            missing.subtract(recorded.events)
            if any(n > 0 for n in missing.values()):
                raise IntegrityError(
                    f"{self._journal} holds fewer privacy events than the checkpoint "
                    f"({len(recorded)} < {len(self.ledger)}); the ledger file must record every "
                    "release; restore it from a backup or start a new run"
                )
            self.ledger = recorded
            if self.interaction is not None:
                self._interaction_epsilon = recorded.epsilon(
                    self.interaction.delta, self.interaction.accountant
                )
            self.fit_rounds_left(self.rounds - int(start_round))
        self._persist()

    def fit_rounds_left(self, rounds_left: int) -> None:
        """A resumed run's sigma for its ``rounds_left`` rounds, with the ledger's releases
        held fixed (:func:`securefed.prior.calibrate_remaining`, as the prior's release is).

        The sigma calibrated for the config's whole plan is kept when the ledger holds only
        releases at that sigma (or the prior's) and the plan still fits the budget: a resume
        of an unchanged run then releases what an uninterrupted one would. Otherwise (the
        run's ``config.toml`` now plans more rounds or a larger epsilon, or rounds re-run
        after the last checkpoint were counted twice) the rounds left get the smallest sigma
        that keeps the ledger's epsilon within the target: before, a resumed run kept the
        fresh plan's sigma, stopped at once when only ``rounds`` was raised, and printed
        that sigma although no release used it. Only for a user-level epsilon target with
        continuous Gaussian noise (a given ``--noise-multiplier`` is kept; the discrete ring
        noise's plan and interaction-level DP-SGD are not refitted, and a resume of theirs
        that overspends stops on the budget).
        """
        if (
            self.dp is None
            or self.p.noise_multiplier is not None
            or self._discrete_scale is not None
            or self.noise_multiplier is None
            or rounds_left <= 0
            or not len(self.ledger)
        ):
            return
        from securefed.prior import calibrate_remaining

        epsilon = float(self.dp.epsilon)  # type: ignore[arg-type]
        delta, accountant = self.dp.delta, self.dp.accountant
        # Grouped as the ledger's own epsilon is: PRV's cost grows with the entries.
        counts = Counter((e.effective_noise_multiplier, e.sample_rate) for e in self.ledger.events)
        fixed = [(z, q, n) for (z, q), n in counts.items()]
        planned = {self.noise_multiplier, self.prior_noise_multiplier}
        as_planned = all(e.noise_multiplier in planned for e in self.ledger.events)
        plan = [*fixed, (self.noise_multiplier, self.sample_rate, rounds_left)]
        if as_planned and gaussian_epsilon(plan, delta=delta, accountant=accountant) <= epsilon:
            return
        if gaussian_epsilon(fixed, delta=delta, accountant=accountant) >= 0.99 * epsilon:
            return  # spent: the next round stops on the budget, as it always has
        self.noise_multiplier = calibrate_remaining(
            epsilon=epsilon,
            delta=delta,
            fixed=fixed,
            sample_rate=self.sample_rate,
            steps=rounds_left,
            accountant=accountant,
        )

    def _persist(self) -> None:
        if self._journal is None:
            return
        write_durably(self._journal, self.ledger_dicts())

    def _secure_round(
        self, updates: ClientUpdates, factors: torch.Tensor, round_index: int, denominator: float
    ) -> Aggregate | None:
        from protocols.secagg import (
            DropoutSchedule,
            RoundAborted,
            secure_sum,
        )

        m = len(updates)
        if m < self.secure_minimum():
            self._last["aborted"] = self.too_few(m)
            return None
        t0 = time.perf_counter()
        ddg = self.discrete_noise(m)
        codec, sa_cfg = self.secure_parameters(m)
        ring: np.ndarray | EncodedBlocks | DiscreteGaussianBlocks
        streamed = streamed_secagg(self.config, m, self.dim)
        if ddg is not None and streamed:
            ring = DiscreteGaussianBlocks(
                updates,
                factors,
                codec,
                ddg,
                seed=self.seed,
                round_index=round_index,
                secure=self.secure,
            )
        else:
            ring = self._ring_inputs(
                updates, factors, codec, "secagg-encode", round_index, streamed=streamed, ddg=ddg
            )
        dropout_rate = self.p.secagg_simulate_dropout
        # From the OS in a DP run (draw_seed): they drop ring positions, and FedRAP orders
        # its uploads by each user's batch count.
        dropouts = (
            DropoutSchedule.random(
                m, rate=dropout_rate, rng=numpy_generator(self.draw_seed(), "dropout", round_index)
            )
            if dropout_rate > 0
            else None
        )
        public_seed = derive_seed(self.seed, "secagg-public", round_index).to_bytes(8, "little") * 2
        if self.secure:
            public_seed = secrets.token_bytes(16)
        # The server knows who sent a masked input before it asks for unmasking shares: the
        # inputs in the sum are every participant but those silent before that stage.
        silent = (
            dropouts.advertise | dropouts.share | dropouts.masked_input
            if dropouts is not None
            else frozenset()
        )
        if ddg is not None and m - len(silent) < ddg.plan.min_survivors:
            # With fewer than the survivors the noise is sized for it must not unmask.
            self._last["aborted"] = (
                f"{m - len(silent)} masked inputs, fewer than the "
                f"{ddg.plan.min_survivors} the noise shares are sized for"
            )
            return None
        # Account before unmasking (write-ahead): a round the budget refuses is never unmasked.
        event = self.secure_event(round_index, m - len(silent), m)
        if event is not None:
            self.commit(event)
        try:
            result = secure_sum(
                ring,
                config=sa_cfg,
                round_index=round_index,
                public_seed=public_seed,
                dropouts=dropouts,
                engine=secagg_engine(sa_cfg),
            )
        except RoundAborted as exc:
            if event is not None:
                self.withdraw(event)  # nothing was unmasked, nothing released
            self._last["aborted"] = str(exc)
            return None
        survivors = int(len(result.survivors))
        if event is not None and survivors != m - len(silent):
            # A client aborted mid-round (it looks like a dropout): record the release that
            # happened, with the noise that really reached the sum, before it leaves.
            self.withdraw(event)
            self.commit(self.secure_event(round_index, survivors, m), check_budget=False)
        total = torch.from_numpy(codec.decode_sum(result.sum)).to(torch.float32)
        if self.dp is not None and ddg is None:
            # Central noise with secure aggregation: the (trusted) aggregator unmasks the
            # clear sum and noises it before it leaves; the event was committed above.
            assert self.noise_multiplier is not None
            central = CentralGaussian(
                clip=self.rounded_sensitivity(self.dp.clip, self.dim),
                noise_multiplier=self.noise_multiplier,
            )
            total = total + central.noise_for_sum(
                self.dim, generator=self._generator("dp-noise", round_index), secure=self.secure
            )
        self._last.update(
            {
                "secagg_seconds": time.perf_counter() - t0,
                "secagg_streamed": not isinstance(ring, np.ndarray),
                "secagg_survivors": survivors,
                "secagg_bits": codec.modulus_bits,
            }
        )
        return Aggregate(
            total=total,
            contributors=survivors,
            denominator=self._denominator(survivors),
            noise_std=self._noise_std(),
        )

    def _ring_inputs(
        self,
        updates: ClientUpdates,
        factors: torch.Tensor,
        codec: Any,
        stream: str,
        round_index: int,
        *,
        streamed: bool,
        ddg: DistributedDiscreteGaussian | None = None,
    ) -> np.ndarray | EncodedBlocks:
        """The clipped updates in the ring (:func:`encode_rows`; with ``ddg``, its rounding and
        noise shares): the ``[m, d]`` table, or with ``streamed`` (and no ``ddg``: that is
        :class:`DiscreteGaussianBlocks`) an :class:`EncodedBlocks` that produces it a block at
        a time."""
        m, dim = len(updates), updates.layout.size
        seed = self.draw_seed()
        if streamed:
            return EncodedBlocks(
                updates, factors, codec, seed=seed, stream=stream, round_index=round_index
            )
        rng = numpy_generator(seed, stream, round_index)
        round_gen = self._generator("dp-round", round_index)
        noise_gen = self._generator("dp-noise", round_index)
        ring = self._ring_table(m, dim)
        rows_per_chunk = max(1, _MAX_DENSE // max(dim, 1))
        for lo in range(0, m, rows_per_chunk):
            rows = torch.arange(lo, min(m, lo + rows_per_chunk))
            x = updates.dense(rows) * factors[rows].unsqueeze(1)
            encode_rows(
                x,
                codec,
                ddg,
                secure=self.secure,
                round_gen=round_gen,
                noise_gen=noise_gen,
                rng=rng,
                out=ring[lo : lo + rows.shape[0]],
            )
        return ring

    def _ring_table(self, m: int, dim: int) -> np.ndarray:
        """A ``[m, dim]`` uint64 table for a round's ring inputs, the previous round's when
        the shape is the same: hundreds of MB above the allocator's mmap threshold would
        otherwise be mapped and page-faulted in again every round (0.3-0.6 s at MovieLens
        100K). Nothing keeps a round's table past the round (secure_sum reads it; observers
        get copies of the masked inputs)."""
        table = self._ring_buffer
        if table is None or table.shape != (m, dim):
            table = np.empty((m, dim), dtype=np.uint64)
            self._ring_buffer = table
        return table

    def secure_event(self, round_index: int, survivors: int, m: int) -> Any:
        """The privacy event of a secure round of ``m`` clients whose sum holds ``survivors``
        inputs (None without user-level DP). With noise shares, only the honest ones count
        (:meth:`honest_shares`): the server's colluders know theirs."""
        if self.dp is None:
            return None
        ddg = self.discrete_noise(m)
        if ddg is not None:
            return ddg.event(
                round_index,
                sample_rate=self.sample_rate,
                noise_contributors=self.honest_shares(survivors, m),
            )
        assert self.noise_multiplier is not None
        central = CentralGaussian(clip=self.dp.clip, noise_multiplier=self.noise_multiplier)
        return central.event(round_index, sample_rate=self.sample_rate)

    # ------------------------------------------------------------------ reporting
    def round_record(self) -> dict[str, Any]:
        out = dict(self._last)
        if self.interaction is not None:
            out["epsilon"] = self._interaction_epsilon
        return out

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {"secagg": self.secagg, "clip": self.clip}
        if self.interaction is not None and self.dpsgd is not None:
            out.update(privacy_summary(self.interaction, self.ledger))
            out.update(self._randomness(out.get("epsilon")))
            out["noise_multiplier"] = self.dpsgd.noise_multiplier
            out["placement"] = "local"
            out["example_clip"] = self.dpsgd.example_clip
            out["releases_per_round"] = self.releases_per_round
            out["dpsgd_steps"] = len(self.ledger)
            out["released_rounds"] = len({e.round for e in self.ledger.events})
            if self.secagg:
                out["secagg_bound"] = self.clip
            return out
        if self.dp is None:
            out.update(
                {"epsilon": None, "delta": None, "privacy_unit": None, "noise_multiplier": None}
            )
            return out
        out.update(privacy_summary(self.dp, self.ledger))
        # Rounds with a release, and releases (more than rounds when a resumed run released
        # re-run rounds again, each counted).
        out["released_rounds"] = len({e.round for e in self.ledger.events})
        out["releases"] = len(self.ledger)
        out.update(self._randomness(out.get("epsilon")))
        out["noise_multiplier"] = self.noise_multiplier
        used = self._model_noise_multipliers()
        if used and used != [self.noise_multiplier]:
            # A resumed run refitted its sigma (fit_rounds_left), or spent its budget before
            # any release at the config's: every sigma a release used, in order.
            out["noise_multipliers"] = used
        clips = self._model_clips()
        if clips and clips != [self.clip]:
            # A resumed run whose config.toml changed its clip: every clip a release used (the
            # summary printed only the new one; found in a walkthrough).
            out["clips"] = clips
        out["placement"] = self.dp.placement
        if self.placement_note:
            out["placement_note"] = self.placement_note
        if self._discrete_scale is not None:
            # Each round's shares are sized for the honest ones of ceil(fraction * m) of its
            # m clients: all but the colluders' ceil(colluder_fraction * m).
            out["min_survivor_fraction"] = 1.0 - self.p.secagg_dropout
            out["colluder_fraction"] = self.p.secagg_corrupt
            if self.cohort.kind != "poisson":
                m = self._largest_cohort()
                floor = self.min_survivors(m)
                out["min_survivors"] = floor
                out["min_honest_shares"] = self.honest_shares(floor, m)
        if self.prior_noise_multiplier is not None:
            out["prior_share"] = self.p.prior_share
            out["prior_noise_multiplier"] = self.prior_noise_multiplier
            out["prior_items"] = self.p.prior_items
            out["prior_weighting"] = self.p.prior_weighting
        return out

    def _model_events(self) -> list[Any]:
        """The ledger's model releases, in order (the prior's release left out)."""
        prior = (self.prior_noise_multiplier, self.prior_clip)
        return [
            e
            for e in self.ledger.events
            if self.prior_noise_multiplier is None or (e.noise_multiplier, e.clip) != prior
        ]

    def _model_clips(self) -> list[float]:
        """The distinct clips of the ledger's model releases, in the order first used."""
        clips = dict.fromkeys(e.clip for e in self._model_events())
        return [float(c) for c in clips if c is not None]

    def _model_noise_multipliers(self) -> list[float]:
        """The distinct noise multipliers of the ledger's model releases (not the prior's),
        in the order first used."""
        return list(dict.fromkeys(e.noise_multiplier for e in self._model_events()))

    def _randomness(self, epsilon: float | None) -> dict[str, Any]:
        """Where a DP run's noise and cohorts came from, and what that means for the claim.

        ``randomness`` is ``"os"`` or ``"replay"``; a replay run adds ``replay_warning``
        (:data:`REPLAY_WARNING`). ``amplification`` says whether amplification by sampling is
        claimed: only for Poisson cohorts (user level), and for a replay run only with a
        label, since its cohorts are as public as its seed. ``epsilon_unamplified`` is the
        same ledger at sample rate 1: what the guarantee is against anyone who knows the
        cohorts but not the noise (the server that samples them only where the noise is
        drawn as shares inside secure aggregation: with central noise it is trusted and sees
        the sums; anyone with the seed of a replay run also knows the noise, against whom
        nothing holds).
        """
        out: dict[str, Any] = {"randomness": "replay" if self.replay else "os"}
        if self.replay:
            # Before any release (a dry run's plan) the ledger's epsilon is 0: the warning
            # is about what the run will spend (found in a walkthrough: "Epsilon 0 holds").
            eps = (
                "The epsilon it spends"
                if epsilon is None or not len(self.ledger)
                else f"Epsilon {epsilon:.4g}"
            )
            out["replay_warning"] = REPLAY_WARNING.format(seed=self.seed, epsilon=eps)
        rates = {e.sample_rate for e in self.ledger.events} or {self.sample_rate}
        if self.prior_noise_multiplier is not None:
            # The popularity prior is one release at rate 1; the rounds may still be sampled.
            rates = {r for r in rates if r < 1.0} or {1.0}
        if self.interaction is not None or max(rates) >= 1.0:
            out["amplification"] = "none: every round is accounted at sample rate 1"
            return out
        q = ", ".join(f"{r:g}" for r in sorted(rates))
        if self.replay:
            out["amplification"] = (
                f"LABELLED: Poisson cohorts at rate {q} were derived from the seed; the "
                "amplified epsilon holds only against an observer who knows neither the seed "
                "nor the cohorts, otherwise epsilon_unamplified"
            )
        else:
            out["amplification"] = (
                f"claimed: Poisson cohorts at rate {q} drawn from OS randomness; it holds "
                "against observers who do not learn the cohorts or their sizes (the run's "
                "metrics record them); against one who does, epsilon_unamplified"
            )
        out["epsilon_unamplified"] = self._unamplified_epsilon()
        return out

    def planned_epsilon_unamplified(self) -> float | None:
        """Before any release: the epsilon of every planned round released, at sample rate 1
        (each round's user-level event at the fewest survivors its noise shares are sized
        for, a cohort of the expected size: not a bound, a larger cohort's discrete noise
        costs a little more), with the prior's release: what the plan holds against whoever
        learns the cohorts (with noise shares inside secure aggregation, the server that
        samples them). None where no amplification is claimed (no user-level DP, or every
        round at rate 1) or where a cohort of the expected size cannot hold the noise shares."""
        if self.dp is None or self.interaction is not None or self.sample_rate >= 1.0:
            return None
        m = max(1, round(self.expected_cohort))
        try:
            events = [e for r in range(self.rounds) for e in self.worst_round_events(r, m)]
        except ConfigError:
            # A cohort of the expected size is too small for the noise shares (its rounds
            # would abort and release nothing): no number to plan.
            return None
        if self.prior_noise_multiplier is not None:
            sigma = self.prior_noise_multiplier
            prior = CentralGaussian(clip=self.prior_clip, noise_multiplier=sigma)
            events.insert(0, prior.event(0, sample_rate=1.0))  # released before round 1
        return _unamplified(events, self.dp)

    def _unamplified_epsilon(self) -> float | None:
        cfg = self.dp if self.dp is not None else self.interaction
        if cfg is None or not self.ledger.events:
            return None
        return _unamplified(self.ledger.events, cfg)

    def ledger_dicts(self) -> dict[str, Any]:
        return ledger_record(self.ledger, summary=self.summary())

    def state_dict(self) -> dict[str, Any]:
        return {"ledger": self.ledger.to_dicts()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "ledger" in state:
            self.ledger = PrivacyLedger.from_dicts(state["ledger"])
            if self.interaction is not None:
                self._interaction_epsilon = self.ledger.epsilon(
                    self.interaction.delta, self.interaction.accountant
                )


def _unamplified(events: Iterable[Any], budget: DPConfig) -> float | None:
    """The epsilon of ``events`` all at sample rate 1 (None where it is not finite)."""
    flat = PrivacyLedger(dataclasses.replace(e, sample_rate=1.0) for e in events)
    eps = flat.epsilon(budget.delta, budget.accountant)
    return float(eps) if math.isfinite(eps) else None


def ledger_with(
    ledger: PrivacyLedger, events: Iterable[Any], budget: DPConfig
) -> tuple[PrivacyLedger, float]:
    """``ledger`` with ``events`` added (in round order: a round re-run after a resume sits
    next to its first release), and its epsilon at ``budget``'s delta and accountant."""
    after = PrivacyLedger(sorted([*ledger.events, *events], key=lambda e: e.round))
    return after, after.epsilon(budget.delta, budget.accountant)


def write_durably(path: Path, obj: Any) -> None:
    """Replace ``path`` atomically with JSON and make the replacement durable: the file is
    fsynced before the rename (:func:`securefed.runs.write_json`) and its directory after, so a
    power cut cannot bring back the previous ledger."""
    runs.write_json(path, obj)
    try:
        fd = os.open(path.parent, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory handles
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


#: Written beside a ledger's events since noise-share events count only the shares the server's
#: colluders do not know (2026-12-06): a ledger without it whose events hold noise shares
#: counted the colluders' too, and its epsilon does not hold against them.
NOISE_SHARES_KEY = "noise_shares"
NOISE_SHARES = "honest"


def ledger_record(ledger: PrivacyLedger, **head: Any) -> dict[str, Any]:
    """What a ledger file holds (a run's ``privacy_ledger.json``, a Flower node's count):
    ``head``'s keys, the noise-share marker :func:`read_ledger_file` requires, the events."""
    return {**head, NOISE_SHARES_KEY: NOISE_SHARES, "events": ledger.to_dicts()}


def read_ledger_file(path: Path) -> PrivacyLedger:
    """The events of a run's ``privacy_ledger.json`` or a node's count (IntegrityError when
    missing or bad, or written before noise-share events stopped counting the colluders')."""
    try:
        raw = json.loads(path.read_text())
        ledger = PrivacyLedger.from_dicts(raw["events"])
    except FileNotFoundError:
        raise IntegrityError(
            f"{path} is missing: a DP run resumes only with the ledger that records every "
            "release it made; restore the file or start a new run"
        ) from None
    except (OSError, ValueError, KeyError, TypeError, ConfigError) as exc:
        raise IntegrityError(
            f"cannot read the privacy ledger {path} ({type(exc).__name__}); restore the file "
            "from a backup or start a new run"
        ) from None
    shares = any(e.mechanism == DISTRIBUTED_DISCRETE_GAUSSIAN for e in ledger.events)
    if shares and raw.get(NOISE_SHARES_KEY) != NOISE_SHARES:
        raise IntegrityError(
            f"{path} counts every survivor's noise share, the server's colluders' too (written "
            "before 2026-12-06), so its epsilon does not hold against them; start a new run "
            "(a Flower node: a new --state-dir)"
        )
    return ledger


@dataclasses.dataclass(frozen=True)
class RecordedReleases:
    """What a run's ledger file says of its releases so far, for a resume's checks: how many,
    and its head's statement (``randomness``: ``"os"`` or ``"replay"``; ``delta``,
    ``privacy_unit``, ``secagg``, ``placement``). A field is None where the file is missing,
    unreadable or has no such head (:func:`read_ledger_file` then judges the file)."""

    count: int = 0
    randomness: str | None = None
    delta: float | None = None
    privacy_unit: str | None = None
    secagg: bool | None = None
    placement: str | None = None


def recorded_releases(path: Path) -> RecordedReleases:
    """Read :class:`RecordedReleases` from a run's ledger file; never raises."""
    try:
        raw = json.loads(Path(path).read_text())
        events = raw["events"]
        head = raw.get("summary") or {}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return RecordedReleases()
    if not isinstance(head, dict):
        head = {}

    def field(key: str, kinds: tuple[type, ...], allowed: tuple[object, ...] = ()) -> Any:
        value = head.get(key)
        if isinstance(value, bool) and bool not in kinds:
            return None
        if not isinstance(value, kinds) or (allowed and value not in allowed):
            return None
        return value

    return RecordedReleases(
        count=len(events) if isinstance(events, list) else 0,
        randomness=field("randomness", (str,), ("os", "replay")),
        delta=field("delta", (int, float)),
        privacy_unit=field("privacy_unit", (str,), ("user", "interaction")),
        secagg=field("secagg", (bool,)),
        placement=field("placement", (str,), ("central", "distributed", "local")),
    )


def interaction_steps_per_round(config: TrainConfig) -> int:
    """Gaussian releases one interaction enters per round (interaction unit).

    The model's own count (``ModelSpec.interaction_releases``): FedRAP makes one per local
    epoch (the batches partition the examples); FedRecGEL one per data-reading SAM pass whose
    result is used per local step (:func:`protocols.dp.dpsgd.sam_releases`: 3 with SAM, 1
    without).
    """
    spec = config.spec
    if spec.interaction_releases is None:
        raise ConfigError(f"{spec.name} has no interaction-level DP-SGD")
    return int(spec.interaction_releases(config.params))


def interaction_dpsgd(config: TrainConfig, split: Split) -> DPSGDConfig:
    """The local DP-SGD settings of an interaction-level run: sigma fixed or calibrated.

    ``steps = releases per round * rounds`` unamplified Gaussian steps per interaction (see
    :func:`interaction_steps_per_round`); delta must be below 1 / (training interactions).
    """
    from securefed.data.manifest import PUBLIC_SOURCE

    p = config.privacy
    if p.privacy_unit != "interaction" or not p.dp:
        raise ConfigError("interaction-level DP-SGD needs --privacy-unit interaction and --epsilon")
    if split.report.source != PUBLIC_SOURCE:
        # A Flower server's split holds no interaction (data.manifest.public_split): the
        # nodes, which build on the data, check delta against the interactions' count.
        check_interaction_delta(p.delta, n_interactions=int(split.n_train))
    default_clip = config.spec.example_clip
    clip = p.example_clip if p.example_clip is not None else float(default_clip or 1.0)
    if p.noise_multiplier is not None:
        sigma = float(p.noise_multiplier)
    else:
        steps = dpsgd_steps(local_epochs=interaction_steps_per_round(config), rounds=config.rounds)
        sigma = calibrate_dpsgd_noise(
            epsilon=float(p.epsilon),  # type: ignore[arg-type]
            delta=p.delta,
            steps=steps,
            accountant=p.accountant or "prv",
        )
    return DPSGDConfig(noise_multiplier=sigma, example_clip=clip, secure=p.os_randomness)


def account(
    *,
    epsilon: float | None = None,
    noise_multiplier: float | None = None,
    delta: float = 1e-5,
    rounds: int = 100,
    client_fraction: float = 1.0,
    users: int | None = None,
    accountant: str = "prv",
    privacy_unit: str = "user",
    model: str | None = None,
    local_epochs: int | None = None,
    sam: bool | None = None,
) -> dict[str, Any]:
    """Noise multiplier for a target epsilon, or epsilon for a noise multiplier, no training.

    ``privacy_unit="user"``: DP-FedAvg with Poisson sampling at ``client_fraction`` (1.0 means
    every client every round, no amplification), composed over ``rounds`` rounds.
    ``privacy_unit="interaction"``: client-side DP-SGD, ``steps = releases per round *
    rounds`` unamplified Gaussian steps (``model`` default FedRAP: ``local_epochs`` per round,
    its default 10; FedRecGEL: 3 per round with ``sam`` at its default non-zero radii, 1
    without), as in training. ``model``, ``local_epochs`` and ``sam`` describe that DP-SGD
    only: given with the user unit, or to a model without the setting, they are refused
    (they would change nothing).

    Returns:
        ``{"epsilon", "delta", "noise_multiplier", "sample_rate", "rounds", "accountant",
        "privacy_unit", "steps"}``.
    """
    from protocols.dp import compute_epsilon
    from protocols.dp.accounting import check_accountant
    from securefed.config import MIN_NOISE_MULTIPLIER

    if (epsilon is None) == (noise_multiplier is None):
        raise ConfigError("give exactly one of --epsilon and --noise-multiplier")
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ConfigError(f"rounds must be a positive integer, got {rounds!r}")
    if noise_multiplier is not None and 0 < noise_multiplier < MIN_NOISE_MULTIPLIER:
        raise ConfigError(
            f"noise multiplier must be >= 2**-500 (a smaller one underflows in the "
            f"accountant; below ~0.3 it promises nothing anyway), got {noise_multiplier!r}"
        )
    given = {
        name: value
        for name, value in (("model", model), ("local_epochs", local_epochs), ("sam", sam))
        if value is not None
    }
    if privacy_unit == "user" and given:
        flags = ", ".join(f"--{name.replace('_', '-')}" for name in given)
        one = len(given) == 1
        raise ConfigError(
            f"{flags} {'describes' if one else 'describe'} client-side DP-SGD (--privacy-unit "
            f"interaction); user-level accounting does not use {'it' if one else 'them'}: "
            f"drop {'it' if one else 'them'}"
        )
    if privacy_unit == "interaction":
        return _account_interaction(
            epsilon=epsilon,
            noise_multiplier=noise_multiplier,
            delta=delta,
            rounds=rounds,
            client_fraction=client_fraction,
            accountant=accountant,
            model=model or "fedrap",
            local_epochs=local_epochs,
            sam=sam,
        )
    if privacy_unit != "user":
        raise ConfigError(f"privacy unit must be user or interaction, got {privacy_unit!r}")
    acc = check_accountant(accountant)
    if not 0 < client_fraction <= 1:
        raise ConfigError(f"client fraction must be in (0, 1], got {client_fraction!r}")
    cfg = DPConfig(
        epsilon=epsilon,
        delta=delta,
        noise_multiplier=noise_multiplier,
        clip=1.0,
        accountant=acc,
    )
    if users is not None:
        cfg.check_population(users)
    if noise_multiplier is None:
        sigma = cfg.resolve_noise_multiplier(
            sample_rate=client_fraction, steps=rounds, n_users=users
        )
    else:
        sigma = float(noise_multiplier)
    spent = compute_epsilon(
        noise_multiplier=sigma,
        sample_rate=client_fraction,
        steps=rounds,
        delta=delta,
        accountant=acc,
    )
    return {
        "epsilon": spent,
        "delta": delta,
        "noise_multiplier": sigma,
        "sample_rate": client_fraction,
        "rounds": rounds,
        "accountant": accountant,
        "privacy_unit": "user",
        "steps": rounds,
    }


def _account_interaction(
    *,
    epsilon: float | None,
    noise_multiplier: float | None,
    delta: float,
    rounds: int,
    client_fraction: float,
    accountant: str,
    model: str,
    local_epochs: int | None,
    sam: bool | None,
) -> dict[str, Any]:
    """:func:`account` for the interaction unit (client-side DP-SGD, sample rate 1)."""
    from protocols.dp.accounting import check_delta
    from protocols.dp.dpsgd import dpsgd_epsilon
    from securefed.models.registry import get_spec

    if client_fraction != 1.0:
        raise ConfigError(
            "interaction-level accounting claims no amplification from client sampling "
            f"(every round counts); drop --client-fraction, got {client_fraction!r}"
        )
    spec = get_spec(model)
    if spec.interaction_releases is None:
        raise ConfigError(f"{model} has no interaction-level DP-SGD")
    fields = {f.name for f in dataclasses.fields(spec.params)}
    given = {k: v for k, v in (("local_epochs", local_epochs), ("sam", sam)) if v is not None}
    for name in given:
        if name not in fields:
            raise ConfigError(
                f"--{name.replace('_', '-')} does not apply to {model} (its DP-SGD has no "
                f"such setting): drop it"
            )
    params = spec.params(**given)
    per_round = int(spec.interaction_releases(params))
    steps = dpsgd_steps(local_epochs=per_round, rounds=rounds)
    check_delta(delta)
    if noise_multiplier is None:
        sigma = calibrate_dpsgd_noise(
            epsilon=float(epsilon),  # type: ignore[arg-type]
            delta=delta,
            steps=steps,
            accountant=accountant,
        )
    else:
        sigma = float(noise_multiplier)
    return {
        "epsilon": dpsgd_epsilon(
            noise_multiplier=sigma, delta=delta, steps=steps, accountant=accountant
        ),
        "delta": delta,
        "noise_multiplier": sigma,
        "sample_rate": 1.0,
        "rounds": rounds,
        "accountant": accountant,
        "privacy_unit": "interaction",
        "steps": steps,
    }
