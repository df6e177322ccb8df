"""securefed's privacy pipeline split at the network boundary: client half and server half.

In-process, :class:`securefed.privacy.PrivateAggregator` runs the whole secure round in one
function (``_secure_round``). A deployment runs the same steps on two sides of a network::

    node:   norms -> clip factor -> (DP) conditional rounding + discrete Gaussian share
            -> fixed-point ring encoding, the user's counters beside it (:func:`encode_updates`)
            -> SecAggClient stage machine per user   (node.py)
    server: SecAggServer stages -> ledger event, written ahead (:func:`commit_before_unmask`)
            -> unmask -> decode -> Aggregate and the counters' sums (:func:`finish_round`)

The counters (:data:`COUNTERS`: trained, clipped, the training loss in fixed point) are summed
by the same secure round as the update, as extra ring coordinates
(:class:`~protocols.secagg.LimbCodec`, no wrap-around), so the server learns the round's
totals over the surviving users, not a user's or a node's, as in process. They carry no DP
noise: like the in-process round's loss and clipped fraction they are exact aggregates
outside the printed epsilon (docs/privacy.md, "What the printed epsilon covers"), and two
rounds whose survivors differ by one user differ by that user's counters.

Both sides derive the round's public parameters with :func:`round_parameters` from the same
resolved :class:`~securefed.training.TrainConfig` and cohort size, exactly as
``PrivateAggregator._secure_round`` does, so the ring encoding, the modulus, ``k`` and ``t``
agree bit for bit with the in-process simulation.

Replay of the seeded streams. With ``--replay-from-seed`` (and in runs without DP) the
in-process simulation draws the
stochastic rounding and the noise shares of *all* participants from one generator per round
(``derive(seed, "dp-noise", round)``). A node that holds some of those participants reproduces
its rows by replaying the whole draw with zero rows in place of the other participants' updates
(``positions`` below): it learns nothing about them (their rows are zeros it made up), it only
spends the same random numbers. That makes a Flower run with a seed produce the same global
model as ``securefed.train`` with that seed, which is what the equivalence test checks. A DP
run without replay (the default) draws every DP random number from the OS and the node encodes
only its own rows.

This module reads a few private members of ``PrivateAggregator`` (``_denominator``,
``_last``); they are the seam a future public split of ``_secure_round``
should expose.
"""

from __future__ import annotations

import fcntl
import math
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from protocols.dp import PrivacyLedger
from protocols.secagg import FixedPointCodec, LimbCodec, SecAggConfig
from protocols.seeding import derive_seed, numpy_generator, torch_generator
from securefed.errors import PrivacyBudgetError, ProtocolError
from securefed.evaluation import ndcg_gains
from securefed.federation.base import Aggregate, ClientUpdates

if TYPE_CHECKING:
    from protocols.dp import DPConfig
    from securefed.privacy import PrivateAggregator

#: Rows x coordinates materialised at once; must equal ``securefed.privacy._MAX_DENSE`` for
#: the replayed draws to be chunked like the in-process ones.
from securefed.privacy import _MAX_DENSE as MAX_DENSE  # noqa: E402
from securefed.privacy import (  # noqa: E402
    encode_rows,
    ledger_record,
    ledger_with,
    read_ledger_file,
    write_durably,
)

#: What each user's secure input carries beside its update, in this order: 1 (it trained),
#: whether the clip shortened its update, its training loss in fixed point (``LOSS_SCALE``
#: units plus ``LOSS_OFFSET``, so that a negative loss is a non-negative integer and the sum
#: less ``trained * LOSS_OFFSET`` is the losses' sum and nothing more) and whether that loss
#: was unusable (not finite, or ``|loss| >= 2**32``; then encoded as 0: the round's loss is
#: NaN).
COUNTERS = ("trained", "clipped", "loss", "loss_unusable")
COUNTER_BITS = (1, 1, 49, 1)
#: Resolution of a user's loss in the secure sum: ``2**-16``.
LOSS_SCALE = float(2**16)
LOSS_OFFSET = 1 << 48


@dataclass(frozen=True)
class RoundCounters:
    """What a secure round's counters sum to over its surviving users.

    Attributes:
        trained: Users whose input is in the sum.
        clipped: How many of them the clip shortened.
        loss_sum: Their training losses' sum (to ``2**-16`` each; NaN when one was not finite).
    """

    trained: int
    clipped: int
    loss_sum: float


@dataclass(frozen=True, kw_only=True)
class RoundParameters:
    """The public parameters of one secure round (same on the server and every node).

    ``share_sigma``: each client's distributed discrete Gaussian scale this round (integer
    units; ``None`` without distributed noise), in the fingerprint so that a node that would
    add other noise than the server accounts is refused before any secret is used.
    ``counters``: how the users' :data:`COUNTERS` ride in the same ring."""

    codec: FixedPointCodec
    secagg: SecAggConfig
    counters: LimbCodec
    share_sigma: float | None = None

    def fingerprint(self) -> str:
        """A short public summary both sides compare before any secret is used."""
        c, s = self.codec, self.secagg
        noise = "none" if self.share_sigma is None else repr(self.share_sigma)
        return (
            f"bits={c.modulus_bits};scale={c.scale!r};n={s.n_clients};k={s.k};t={s.t};"
            f"floor={s.min_survivors};mode={s.mode};share={noise};"
            f"counters={self.counters.width}x{self.counters.limb_bits}"
        )

    def width(self, dim: int) -> int:
        """Ring coordinates of one user's secure input: the ``dim`` of the update, then the
        counters."""
        return dim + self.counters.width


def round_parameters(agg: PrivateAggregator, m: int) -> RoundParameters:
    """Codec and SecAgg configuration for a round of ``m`` participants, as the in-process
    round derives them (:meth:`PrivateAggregator.secure_parameters`), and the counters'
    limbs in its ring."""
    codec, sa_cfg = agg.secure_parameters(m)
    ddg = agg.discrete_noise(m)
    share = ddg.plan.share_sigma if ddg is not None else None
    counters = LimbCodec(n_clients=m, modulus_bits=codec.modulus_bits, value_bits=COUNTER_BITS)
    return RoundParameters(codec=codec, secagg=sa_cfg, counters=counters, share_sigma=share)


#: A secure evaluation round's SecAgg round index: this offset plus the training round's, so
#: its keys and messages are bound to another round than any training round's.
EVAL_ROUND_OFFSET = 1 << 32
#: The ring of a secure evaluation round: 48 bits (every field one limb below 2^31 users).
EVAL_RING_BITS = 48
#: Resolution of a user's NDCG@10 in an evaluation sum (its gain is at most 1): ``2**-16``.
NDCG_SCALE = float(2**16)


@dataclass(frozen=True, kw_only=True)
class EvalParameters:
    """The public parameters of a secure evaluation round over every user (same on the
    server and every node): which sums it carries (``fields``: ``users``, then HR@10 and
    NDCG@10 of the validation and test items, sampled and, with ``full``, full ranking) and
    the SecAgg configuration for ``n`` users in a :data:`EVAL_RING_BITS`-bit ring."""

    fields: tuple[str, ...]
    counters: LimbCodec
    secagg: SecAggConfig

    def fingerprint(self) -> str:
        """A short public summary both sides compare before any secret is used."""
        s = self.secagg
        return (
            f"eval;fields={','.join(self.fields)};n={s.n_clients};k={s.k};t={s.t};"
            f"floor={s.min_survivors};mode={s.mode};limbs={self.counters.limb_bits}"
        )


def evaluation_parameters(agg: PrivateAggregator, n_users: int, *, full: bool) -> EvalParameters:
    """The secure evaluation round of ``n_users`` users (every user: the evaluation covers
    all, not a training round's cohort). No DP noise: like the in-process evaluation its
    sums are outside the printed epsilon; SecAgg keeps each user's hits from the server."""
    fields = ["users"]
    for which in ("val", "test"):
        kinds = ("", "full_") if full else ("",)
        for kind in kinds:
            fields += [f"{which}_{kind}hr@10", f"{which}_{kind}ndcg@10"]
    bits = tuple(17 if f.endswith("ndcg@10") else 1 for f in fields)
    counters = LimbCodec(n_clients=n_users, modulus_bits=EVAL_RING_BITS, value_bits=bits)
    # Its own graph for n users (a run's neighbours may be set for cohorts of a few), at the
    # run's dropout tolerance, corrupt fraction and mode.
    secagg = agg.secagg_config(n_users, EVAL_RING_BITS, choose_graph=True)
    return EvalParameters(fields=tuple(fields), counters=counters, secagg=secagg)


def evaluation_counters(params: EvalParameters, ranks: dict[str, np.ndarray]) -> np.ndarray:
    """Each user's evaluation fields (int64 ``[k, fields]``) from its 0-based ranks of the
    held-out item (``ranks``: ``"val"``, ``"test"`` and, with full ranking, ``"val_full"``
    and ``"test_full"``, each ``[k]``): a hit is a rank below 10, NDCG@10 its gain
    ``1 / log2(rank + 2)`` in :data:`NDCG_SCALE` units."""
    k = len(next(iter(ranks.values())))
    out = np.zeros((k, len(params.fields)), dtype=np.int64)
    out[:, 0] = 1
    for c, name in enumerate(params.fields[1:], start=1):
        which, metric = name.rsplit("_", 1)
        r = np.asarray(ranks[which])
        if metric == "hr@10":
            out[:, c] = r < 10
        else:
            out[:, c] = np.rint(ndcg_gains(r, 10).numpy() * NDCG_SCALE).astype(np.int64)
    return out


def evaluation_consistent(params: EvalParameters, sums: list[int], survivors: int) -> bool:
    """Whether an evaluation round's sums can be its ``survivors`` users' fields: as many
    users, at most one hit each, an NDCG of at most one a hit."""
    if sums[0] != survivors:
        return False
    named = dict(zip(params.fields, sums, strict=True))
    for name, total in named.items():
        if name.endswith("hr@10") and not 0 <= total <= survivors:
            return False
        if (
            name.endswith("ndcg@10")
            and total > NDCG_SCALE * named[name.removesuffix("ndcg@10") + "hr@10"]
        ):
            return False
    return True


def evaluation_metrics(params: EvalParameters, sums: list[int]) -> dict[str, float]:
    """The round's metrics from the fields' sums over the surviving users: ``eval_users``
    and each metric's mean over them."""
    users = sums[0]
    out: dict[str, float] = {"eval_users": users}
    if not users:
        return out
    for name, total in zip(params.fields[1:], sums[1:], strict=True):
        scale = NDCG_SCALE if name.endswith("ndcg@10") else 1.0
        out[name] = total / scale / users
    return out


def user_counters(clipped: np.ndarray, losses: np.ndarray) -> np.ndarray:
    """Each user's :data:`COUNTERS` (int64 ``[k, 4]``) from whether its update was clipped
    and its training loss."""
    losses = np.asarray(losses, dtype=np.float64)
    scaled = np.rint(np.where(np.isfinite(losses), losses, 0.0) * LOSS_SCALE)
    usable = np.isfinite(losses) & (np.abs(scaled) < LOSS_OFFSET)
    q = np.where(usable, scaled, 0.0).astype(np.int64) + LOSS_OFFSET
    return np.stack(
        [
            np.ones(len(losses), dtype=np.int64),
            np.asarray(clipped, dtype=np.int64),
            q,
            (~usable).astype(np.int64),
        ],
        axis=1,
    )


def public_seed(agg: PrivateAggregator, round_index: int) -> bytes:
    """The round's public seed: fresh OS bytes in a DP run, derived from the run seed in a
    replay run or a run without DP."""
    if agg.secure:
        return secrets.token_bytes(16)
    return derive_seed(agg.seed, "secagg-public", round_index).to_bytes(8, "little") * 2


def encode_updates(
    agg: PrivateAggregator,
    updates: ClientUpdates,
    *,
    round_index: int,
    params: RoundParameters,
    losses: np.ndarray | None = None,
    positions: torch.Tensor | None = None,
) -> np.ndarray:
    """The node's half of the secure round: clip, DP rounding and noise share, ring encoding,
    and the users' counters beside it.

    Unit of privacy: one user (one row). Each row is clipped to L2 norm ``C`` (sensitivity of
    the sum), then, with distributed DP, conditionally rounded (Kairouz et al. 2021, Sec. 4.1)
    and given its discrete Gaussian share sized for the fewest survivors ``t``; the share
    defends against a server that sees the sum of the survivors (the only thing SecAgg
    releases) and would otherwise read one user's contribution by differencing rounds.

    Args:
        agg: The run's aggregator (built from the same config as the server's).
        updates: This node's users' raw updates (rows in any order).
        round_index: The round (selects the seeded streams).
        params: From :func:`round_parameters` with the round's cohort size.
        losses: Each row's training loss (``[k]``; ``None``: 0), summed in the ring with the
            other :data:`COUNTERS` (exact, no noise).
        positions: Row of each of ``updates`` in the in-process batch of ``m`` rows, to replay
            the seeded draws exactly (see the module docstring); ``None`` draws for own rows
            only (always the case when the DP noise comes from the OS).

    Returns:
        The ring elements ``[k, params.width(dim)]`` (uint64): the update, then the counters.
    """
    k = len(updates)
    dim = agg.dim
    factors, clipped = agg.clip_factors(updates)
    if losses is None:
        losses = np.zeros(k)
    if np.shape(losses) != (k,):
        raise ProtocolError(f"one loss per row expected ({k}), got shape {np.shape(losses)}")
    codec = params.codec
    ddg = agg.discrete_noise(params.secagg.n_clients)
    secure = agg.secure
    if secure and positions is not None:
        raise ProtocolError(
            "this DP run draws its noise from the OS; nothing to replay (replay positions are "
            "for --replay-from-seed runs)"
        )
    noise_gen = None if secure else torch_generator(agg.seed, "dp-noise", round_index)
    round_gen = None if secure else torch_generator(agg.seed, "dp-round", round_index)
    rng = numpy_generator(agg.draw_seed(), "secagg-encode", round_index)
    out = np.empty((k, params.width(dim)), dtype=np.uint64)
    out[:, dim:] = params.counters.encode(user_counters(clipped.cpu().numpy(), losses))
    rows_per_chunk = max(1, MAX_DENSE // max(dim, 1))
    if positions is None:
        total, where = k, torch.arange(k)
    else:
        total, where = params.secagg.n_clients, positions.to(torch.long)
        if where.shape != (k,) or (k and (int(where.min()) < 0 or int(where.max()) >= total)):
            raise ProtocolError(f"replay positions must be {k} rows in [0, {total})")
    for lo in range(0, total, rows_per_chunk):
        hi = min(total, lo + rows_per_chunk)
        mine = torch.nonzero((where >= lo) & (where < hi)).squeeze(1)
        at = where[mine] - lo
        x = torch.zeros(hi - lo, dim)
        if mine.numel():
            x[at] = updates.dense(mine) * factors[mine].unsqueeze(1)
        chunk = encode_rows(
            x, codec, ddg, secure=secure, round_gen=round_gen, noise_gen=noise_gen, rng=rng
        )
        out[mine.numpy(), :dim] = chunk[at.numpy()]
    return out


def finish_round(
    agg: PrivateAggregator,
    ring_sum: np.ndarray,
    *,
    survivors: int,
    round_index: int,
    params: RoundParameters,
    started: float,
) -> tuple[Aggregate, RoundCounters]:
    """The server's half after unmasking: decode the update's sum and the counters' sums
    (``ring_sum`` holds both, :meth:`RoundParameters.width`), and the round's record. The
    release was accounted before unmasking (:func:`commit_before_unmask`)."""
    dim = agg.dim
    if np.shape(ring_sum) != (params.width(dim),):
        raise ProtocolError(
            f"a secure sum of {params.width(dim)} ring elements expected, got {np.shape(ring_sum)}"
        )
    trained, clipped, loss, unusable = params.counters.decode_sum(ring_sum[dim:])
    epsilon = agg._last.get("epsilon")
    agg._last = {}
    if trained == survivors and clipped <= trained and unusable <= trained:
        loss_sum = (loss - trained * LOSS_OFFSET) / LOSS_SCALE if not unusable else math.nan
        counters = RoundCounters(trained=trained, clipped=clipped, loss_sum=loss_sum)
        agg._last["clipped_fraction"] = clipped / trained if trained else 0.0
    else:
        # A client wrote something else than its counters there (nothing checks a masked
        # input): no loss or clipped fraction rather than wrong ones.
        counters = RoundCounters(trained=0, clipped=0, loss_sum=math.nan)
        agg._last["counters_inconsistent"] = True
    if epsilon is not None:
        agg._last["epsilon"] = epsilon
    total = torch.from_numpy(params.codec.decode_sum(ring_sum[:dim])).to(torch.float32)
    agg._last.update(
        {
            "secagg_seconds": time.perf_counter() - started,
            "secagg_survivors": survivors,
            "secagg_bits": params.codec.modulus_bits,
        }
    )
    aggregate = Aggregate(
        total=total,
        contributors=survivors,
        denominator=agg._denominator(survivors),
        noise_std=agg._noise_std(),
    )
    return aggregate, counters


def commit_before_unmask(
    agg: PrivateAggregator, *, round_index: int, survivors: int, participants: int
) -> Any:
    """Account a secure round of ``participants`` clients once the server knows whose masked
    inputs it holds, before it asks for a single unmasking share (write-ahead;
    :meth:`PrivateAggregator.commit`).

    Returns:
        The committed event (``None`` without user-level DP), to withdraw if unmasking aborts.

    Raises:
        PrivacyBudgetError: the round would overspend; the server must not unmask.
    """
    if agg.dp is None or agg.discrete_noise(participants) is None:
        return None
    event = agg.secure_event(round_index, survivors, participants)
    agg.commit(event)
    return event


def record_abort(agg: PrivateAggregator, reason: str) -> None:
    """Record an aborted round in the aggregator's round record (nothing was released, the
    counters included: no clipped fraction, no loss)."""
    agg._last = {"aborted": reason}


class ReleaseLedger:
    """The most a run's rounds can have cost each user, counted where the releases are made,
    never rewound.

    The server's ledger records every release at its real survivors, but the server also
    decides what to ask for: a train message with ``resume`` makes a node rewind and train
    (and noise) a round again, as a real resume must, so a server could ask for more releases
    than its ledger shows. Each node therefore charges, before it trains a round its users'
    data enters, the most that round can cost them
    (:meth:`~securefed.privacy.PrivateAggregator.worst_round_events`: the user-level event at
    the fewest survivors the noise shares are sized for, or the round's local DP-SGD
    releases), writes the ledger durably (under a file lock: processes sharing a state
    directory share one count), and only then trains; a charge that would pass the run's
    epsilon is refused, with nothing trained or sent. A node's count spans every run on its
    state directory; the honest server keeps the same count over every round of its run that
    it asks for (re-runs included), so within one run it stops at the cap before any node
    refuses (a node only has the rounds its users were in), and a node whose count holds
    earlier runs refuses with a reply the server stops on (``messages.REFUSED``).

    Args:
        path: The ledger file (``None``: memory only, for tests).
    """

    def __init__(self, path: Path | None) -> None:
        self.path = path
        #: The count as of the last charge; a charge re-reads the file first (under its lock).
        self.ledger = PrivacyLedger()

    def charge(self, agg: PrivateAggregator, round_index: int, m: int) -> float | None:
        """Record the most a round of ``m`` clients can cost, after checking the budget.

        Returns:
            The epsilon after the charge (``None`` in a run without DP).

        Raises:
            PrivacyBudgetError: the charge would pass the run's epsilon; nothing is recorded.
        """
        budget = agg.budget
        events = agg.worst_round_events(round_index, m)
        if budget is None or not events:
            return None
        if self.path is None:
            return self._charge(events, budget, round_index)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # One count per file even when several processes serve this state directory (two
        # runs at once, or overlapping per-message ClientApps): read and written under an
        # exclusive lock (found in review: 40 charges accepted, 20 on disk).
        with open(self.path.with_name(self.path.name + ".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if self.path.exists():
                self.ledger = read_ledger_file(self.path)
            return self._charge(events, budget, round_index)

    def _charge(self, events: list[Any], budget: DPConfig, round_index: int) -> float:
        after, eps = ledger_with(self.ledger, events, budget)
        if budget.epsilon is not None and eps > budget.epsilon:
            raise PrivacyBudgetError(
                f"round {round_index + 1} could raise epsilon to {eps:.4g} above the target "
                f"{budget.epsilon:.4g} (delta={budget.delta!r}) at the fewest survivors its "
                f"noise is sized for, after the {len(self.ledger)} releases counted"
            )
        self.ledger = after
        if self.path is not None:
            write_durably(self.path, ledger_record(after, epsilon=eps))
        return eps
