"""What a run will cost before it starts: peak memory, disk and time (issue 17, issue 18).

Memory and disk come from formulas of the tensors a run allocates, from the dataset's shape,
the model and its hyperparameters, the cohort and the defenses:

* the model's **persistent state** (:func:`state_bytes`: exactly the tensors its
  ``state_dict()`` holds, e.g. FedRAP's ``users x items x dim`` private views ``D``, or, held
  sparsely, the initial view plus a bound on the rows the run's rounds write);
* the **round working set** (the per-(client, item) pair buffers of local training, the
  dense ``[cohort, d]`` rows that secure aggregation and distributed DP materialise);
* **evaluation** (a block of users scored against every item) and, for synthetic data, the
  generator's dense ``users x items`` logits;
* the **process** itself (Python, torch, securefed: measured, :data:`PROCESS_BYTES`).

Disk is the checkpoint (the model's state as it is written, one copy kept, a second while it is
replaced atomically) times the number of checkpoints written, and what a finished run keeps
(its released model, the shared parameters, unless ``keep_private_state``); once the model exists,
:func:`state_bytes_of` reads the size from the live ``state_dict()``, so a model that stores its
state more compactly is estimated as it writes it.

Time is calibrated on the machine: a ~0.1 s probe (:func:`machine_speed`) scales per-model rates
measured on the development machine; :meth:`CostEstimate.after_rounds` replaces the rate by the
measured rounds once the first ones ran (round 1 of FedRAP includes ``torch.compile``, so from
round 2 on the warm rounds are used). ``docs/benchmarks.md`` ("Estimates before a run") compares
the estimates with measured runs.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from securefed.errors import ConfigError

if TYPE_CHECKING:
    from securefed.config import TrainConfig
    from securefed.data.types import Split

__all__ = [
    "AUDIT_COST_FACTOR",
    "HEAD_SIZES",
    "PROCESS_BYTES",
    "CostEstimate",
    "CostInputs",
    "InsufficientDisk",
    "InsufficientMemory",
    "ModelCosts",
    "ModelWork",
    "RunShape",
    "available_memory",
    "check_disk",
    "check_memory",
    "choose_views",
    "check_synthetic_fits",
    "counting_work",
    "estimate_run",
    "fit_memory",
    "format_bytes",
    "format_seconds",
    "free_disk_at",
    "layout_size",
    "machine_speed",
    "plural",
    "refuse_if_too_large",
    "run_files_bytes",
    "state_bytes",
    "state_bytes_of",
]

#: Resident memory of a process that imported torch and securefed and loaded a small split,
#: measured on the development machine (405 MB after the imports, 431 MB with MovieLens 100K).
PROCESS_BYTES = 420 * 2**20
#: Extra resident memory of a process that ran ``torch.compile`` (inductor, its C++ build and
#: the compiled kernel): fitted from FedRAP's peak RSS on MovieLens 100K and 1M sizes.
COMPILE_BYTES = 380 * 2**20
#: FedRAP compiles its sub-step kernels when a round's cohort size times the catalogue size
#: reaches this (public quantities: :func:`securefed.models.fedrap.compiles_round`); about
#: 50,000 sampled pairs on MovieLens 100K, where compiling starts to pay.
COMPILE_CELLS = 500_000
#: Resident bytes of FedRAP's paged private views (``views="paged"``): what one gather or
#: write of a round, or one evaluation block, faults in before it releases it (at most
#: :data:`securefed.paging.RELEASE_BYTES` each; two may overlap).
PAGED_RESIDENT_BYTES = 2 * (64 << 20)
#: Bytes of a checkpoint beyond its tensors (the zip layout, pickled names and scalars).
CHECKPOINT_OVERHEAD = 16 * 1024
#: Bytes of ``metrics.jsonl`` per round (one JSON line of a round's metrics).
METRICS_BYTES_PER_ROUND = 1024
#: A run directory's small files: ``config.toml``, ``data.json``, ``summary.json`` and the
#: privacy ledger's header (3.6-7.2 kB measured in the replays of 2-round audits, 2026-12-08).
RUN_FILES_BYTES = 16 * 1024
#: One event of ``privacy_ledger.json`` (40 DP-SGD events: 16.0 kB, 400 bytes each).
LEDGER_EVENT_BYTES = 512
#: An audit's cost relative to the training it replays: the audit trains a seeded replay
#: with the attacks' recorder attached, then scores the attacks (a rough factor).
AUDIT_COST_FACTOR = 2.0
#: Users scored at once by :func:`securefed.evaluation.evaluate_splits`.
EVAL_BLOCK = 256
#: Bytes secure aggregation holds per client coordinate (the uint64 ring inputs, their masked
#: copies and the expanded masks): fitted to FedRAP --secagg on MovieLens 100K (3.36 GB peak RSS
#: measured, 3.49 GB estimated).
SECAGG_BYTES_PER_COORD = 32
#: The dense chunk of clients x coordinates secure aggregation materialises at once
#: (``securefed.privacy._MAX_DENSE`` floats, times the clipping factor's copy).
SECAGG_CHUNK_BYTES = 2 * 64_000_000 * 4
#: A secure round whose ring inputs would exceed this many words (2 GiB of uint64) is encoded
#: and masked a block of coordinates at a time when the model's uploads stream
#: (``ModelSpec.streams_uploads``, :class:`securefed.privacy.EncodedBlocks`): FedRAP at
#: Gowalla's 40,981 items and 10 % cohorts would otherwise hold 2,986 x 1.31 M words (31 GB).
STREAM_RING_WORDS = 1 << 28
#: Coordinates per tile of a streamed encoding (:class:`securefed.privacy.EncodedBlocks`):
#: each tile's stochastic rounding comes from its own generator, so the ring inputs do not
#: depend on the engine's threads or chunk sizes; blocks are whole tiles.
ENCODE_TILE = 1 << 12
#: Bytes a streamed round holds per mask thread, in units of the engine's block
#: (``protocols.secagg.batched.STREAM_BLOCK_BYTES``): the ring block, the float32 and float64
#: update block it is encoded from, a tile's copy and the engine's live rows.
STREAM_BLOCKS_PER_THREAD = 4

# Rates on the development machine (2 cores, torch 2.13 CPU, docs/benchmarks.md), in seconds
# per unit of work named beside each; machine_speed() scales them to the machine at hand. A
# model's own rates live beside its formulas in its module (``ModelSpec.costs``).
DOT_EVAL_S = 1.9e-9  # per user x item x dim scored (dot-product models)
# Secure aggregation on the batched engine (each pair's mask once, two mask threads), fitted
# 2026-12-05 on the quiet machine: FedRAP --secagg on MovieLens 100K (943 x 53,824, k 30:
# 3.3-4.5 s a round) and on Gowalla at --client-fraction 0.1 (3,005 x 1.31 M, k 32,
# streamed: 134 s). The per-pair term covers the key agreements, share boxes and Shamir work.
_SECAGG_S = 1.0e-9  # per word: clients x (k + 1) x d
_KEY_AGREEMENT_S = 80e-6  # per client x neighbour
# Distributed DP: rounding and discrete Gaussian per client coordinate; refitted 2026-12-06
# for the block-table sampler (FedRAP MovieLens 100K --secagg --epsilon 1: 2.9-3.0 s a
# round, estimated 3.1; the README's streamed --secagg --epsilon 2: 18.8-20.4 s, 17.5).
_DDG_S = 2.0e-8
# machine_speed()'s workload on the development machine when quiet (7.7-8.2 ms, 2026-12-05,
# load average 0.9; the rates above were refitted on quiet runs that day or read as such).
_PROBE_REFERENCE_S = 0.0080


class InsufficientMemory(ConfigError):
    """A run whose estimated peak memory exceeds what the machine has available.

    Raised (one line: the estimate, what is available, the flag that would make it fit)
    before the model is built, so no large allocation is attempted.
    """


class InsufficientDisk(ConfigError):
    """A run whose estimated disk at its largest (``disk_peak``) exceeds the free space of the
    file system its run directory goes on.

    Raised (one line: what it needs, what is free where, what to change) before the model is
    built, so nothing is written.
    """


@dataclass(frozen=True, kw_only=True)
class RunShape:
    """The dataset dimensions a cost estimate needs.

    Attributes:
        users: Users after filtering.
        items: Items of the catalogue.
        train_interactions: Training interactions (the split's ``n_train``).
        synthetic: Whether the data is generated in-process (its generator holds dense
            ``users x items`` float64 logits while it runs).
        head_pairs: ``(h, pairs)`` for each ``h`` of :data:`HEAD_SIZES` below the catalogue's
            size and for the whole catalogue: the pairs of training items among the ``h``
            most counted items that the users hold, summed over users (``k (k - 1) / 2`` for
            a user with ``k`` of them). Uploads of item pairs (private fedals's co-occurrence
            rounds) grow with it; the mean history alone misjudged it 0.75-2x on FilmTrust,
            MovieLens 100K and the synthetic data. Empty when unknown (a synthetic shape
            before its data exists).
    """

    users: int
    items: int
    train_interactions: int
    synthetic: bool = False
    head_pairs: tuple[tuple[int, int], ...] = ()

    @classmethod
    def of(cls, split: Split) -> RunShape:
        """The shape of a loaded split."""
        return cls(
            users=int(split.n_users),
            items=int(split.n_items),
            train_interactions=int(split.n_train),
            synthetic=bool(split.report.synthetic),
            head_pairs=_head_pairs(split),
        )

    def pairs_in_head(self, head: int) -> float | None:
        """:attr:`head_pairs` at ``head`` items: interpolated linearly between the sizes
        counted, ``(head / h)^2`` of the smallest below it; None when unknown."""
        if not self.head_pairs or head < 2:
            return None if not self.head_pairs else 0.0
        lo_h, lo_p = 0, 0
        for h, pairs in self.head_pairs:
            if head <= h:
                if lo_h == 0:
                    return pairs * (head / h) ** 2
                return lo_p + (pairs - lo_p) * (head - lo_h) / (h - lo_h)
            lo_h, lo_p = h, pairs
        return float(lo_p)


#: The head sizes :attr:`RunShape.head_pairs` counts (private fedals's co-occurrence items:
#: 400 in the small population, 400-4,000 in the large one).
HEAD_SIZES = (400, 1000, 2000, 4000)


def _head_pairs(split: Split) -> tuple[tuple[int, int], ...]:
    """:attr:`RunShape.head_pairs` of a loaded split (one pass over its training pairs)."""
    import numpy as np

    users = np.arange(int(split.n_users), dtype=np.int64)
    local, items = split.train_pairs(users)
    n_items = int(split.n_items)
    order = np.argsort(-np.bincount(items, minlength=n_items), kind="stable")
    rank = np.empty(n_items, dtype=np.int64)
    rank[order] = np.arange(n_items)
    item_rank = rank[items]
    out = []
    for h in (*(h for h in HEAD_SIZES if h < n_items), n_items):
        k = np.bincount(local[item_rank < h], minlength=users.shape[0]).astype(np.int64)
        out.append((int(h), int((k * (k - 1) // 2).sum())))
    return tuple(out)


@dataclass(frozen=True, kw_only=True)
class CostEstimate:
    """Estimated peak memory, disk and time of one run.

    Attributes:
        model: Registry name of the model.
        shape: The dataset's dimensions.
        rounds: Rounds left to run.
        participants: Expected clients per round.
        state: The model's persistent tensors by ``state_dict`` entry, in bytes (exact).
        memory: Parts of the peak, in bytes: ``process``, ``data``, ``state``, ``round``
            (local training), ``aggregation`` (DP, secure aggregation), ``evaluation``,
            ``compile``; the peak is ``process + data + state + compile`` plus the larger of
            ``round + aggregation`` and ``evaluation``. ``synthetic_generation`` (synthetic
            data only) is held before the model exists, beside ``process`` alone.
        peak_memory: Estimated peak resident memory, bytes.
        checkpoint_bytes: One checkpoint as written.
        checkpoints: Checkpoints the run writes.
        disk_bytes: Disk the run directory keeps at the end (the checkpoint, the best model's
            copy when the model is not fully evaluated every round, metrics).
        disk_peak: Disk it needs at its largest (a second checkpoint while one atomically
            replaces the other).
        disk_written: Bytes written over the whole run.
        disk_final: Disk the run directory keeps once the run has finished: its released
            model (``model.pt``: the shared parameters) and metrics; the checkpoint as well
            with ``keep_private_state``.
        model_bytes: The released model's part of ``disk_final`` (``model.pt``).
        round_seconds: Local training, aggregation and server step of one round.
        secagg_seconds: Secure aggregation's part of ``round_seconds``.
        eval_seconds: One sampled evaluation; ``full_eval_seconds`` one full ranking.
        setup_seconds: One-off costs (FedRAP's ``torch.compile`` in round 1).
        seconds: The whole run.
        basis: How the time was obtained (``"probe"`` or ``"measured rounds ..."``).
        speed: The machine probe's factor (1.0: the development machine).
        in_file: The ``state`` entry held in a file, not resident (FedRAP's paged views
            ``D``), in ``file_dir`` (``""``: ``$TMPDIR``); None: all resident.
    """

    model: str
    shape: RunShape
    rounds: int
    participants: float
    state: dict[str, int]
    memory: dict[str, int]
    peak_memory: int
    checkpoint_bytes: int
    checkpoints: int
    disk_bytes: int
    disk_peak: int
    disk_written: int
    round_seconds: float
    secagg_seconds: float
    eval_seconds: float
    full_eval_seconds: float
    evaluations: int
    full_evaluations: int
    setup_seconds: float
    seconds: float
    basis: str = "probe"
    speed: float = 1.0
    notes: tuple[str, ...] = field(default_factory=tuple)
    disk_final: int = 0
    model_bytes: int = 0
    in_file: str | None = None
    file_dir: str = ""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready record (``estimate.json`` of a run directory)."""
        out = dataclasses.asdict(self)
        out["shape"] = dataclasses.asdict(self.shape)
        out["notes"] = list(self.notes)
        return out

    def summary_line(self) -> str:
        """One line: memory, disk and time."""
        return (
            f"estimate: peak memory {format_bytes(self.peak_memory)}, disk "
            f"{format_bytes(self.disk_bytes)} ({format_bytes(self.disk_peak)} while a "
            f"checkpoint is replaced, {format_bytes(self.disk_final)} once finished), time "
            f"{format_seconds(self.seconds)} ({plural(self.rounds, 'round')} "
            f"x {format_seconds(self.round_seconds + self._eval_per_round())}"
            + (f" + {format_seconds(self.setup_seconds)} setup" if self.setup_seconds else "")
            + f"; {self.basis})"
        )

    def detail_line(self) -> str:
        """One line: where the peak memory goes."""
        parts = [
            f"{k} {format_bytes(v)}"
            for k, v in self.memory.items()
            if v and k != "synthetic_generation"
        ]
        named = ", ".join(
            f"{k} {format_bytes(v)}" + (" in a file, not resident" if k == self.in_file else "")
            for k, v in _largest(self.state, 2)
        )
        text = f"          memory: {' + '.join(parts)}" + (f" (state: {named})" if named else "")
        if self.memory.get("synthetic_generation"):
            text += (
                f"; generating the synthetic data first: process + "
                f"{format_bytes(self.memory['synthetic_generation'])}"
            )
        return text

    def _eval_per_round(self) -> float:
        if not self.rounds:
            return 0.0
        sampled = self.evaluations - self.full_evaluations
        return (
            sampled * self.eval_seconds + self.full_evaluations * self.full_eval_seconds
        ) / self.rounds

    def after_rounds(self, records: Sequence[Mapping[str, Any]], *, done: int) -> CostEstimate:
        """The time re-estimated from measured rounds (``metrics.jsonl`` records).

        Training time per round is the median of the rounds after the first when there are
        any (round 1 carries one-off costs such as ``torch.compile``), else round 1 itself;
        evaluation time likewise per kind (sampled, full ranking). ``done`` rounds of the
        estimate's ``rounds`` are finished; the result's ``seconds`` is the time left.
        """
        if not records:
            return self
        train = [float(r.get("train_seconds", 0.0)) for r in records]
        warm = train[1:] if len(train) > 1 else train
        round_s = statistics.median(warm)
        full = [float(r["eval_seconds"]) for r in records if "test_full_hr@10" in r]
        sampled = [
            float(r["eval_seconds"])
            for r in records
            if "eval_seconds" in r and "test_full_hr@10" not in r
        ]
        full_s = statistics.median(full[1:] or full) if full else self.full_eval_seconds
        eval_s = statistics.median(sampled) if sampled else self.eval_seconds
        left = max(self.rounds - done, 0)
        frac = left / self.rounds if self.rounds else 0.0
        evaluations = round(self.evaluations * frac)
        fulls = round(self.full_evaluations * frac)
        seconds = left * round_s + (evaluations - fulls) * eval_s + fulls * full_s
        return dataclasses.replace(
            self,
            rounds=left,
            round_seconds=round_s,
            eval_seconds=eval_s,
            full_eval_seconds=full_s,
            evaluations=evaluations,
            full_evaluations=fulls,
            setup_seconds=0.0,
            seconds=seconds,
            basis=f"measured round{'s' if len(records) > 1 else ''} 1-{len(records)}"
            if len(records) > 1
            else "measured round 1",
        )


def plural(count: int, word: str) -> str:
    """``"1 round"``, ``"2 rounds"``."""
    return f"{count} {word}{'' if count == 1 else 's'}"


def _largest(values: Mapping[str, int], n: int) -> list[tuple[str, int]]:
    return sorted(((k, v) for k, v in values.items() if v), key=lambda kv: -kv[1])[:n]


def format_bytes(n: float) -> str:
    """``1.3 GB``-style (powers of 1000, as ``ls -h --si`` and free-space dialogs show)."""
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def format_seconds(s: float) -> str:
    """``45 s``, ``12 min``, ``2.1 h``."""
    if s < 0.95:
        return f"{s:.2f} s"
    if s < 90:
        return f"{s:.0f} s"
    if s < 5400:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"


# ---------------------------------------------------------------------------- state


def state_bytes(
    model: str, params: Any, shape: RunShape, *, written_rows: int | None = None
) -> dict[str, int]:
    """The bytes of every tensor entry of ``model``'s ``state_dict()`` at ``shape`` (exact):
    its :attr:`ModelCosts.state` formula.

    Nested entries are summed under their top-level name (FedRecGEL's ``client_adam``); plain
    values (the config, learning-rate scalars) are left out. Models without a formula (and
    unknown names) give ``{}``. ``written_rows``: state held sparsely with that many written
    rows (FedRAP's private views, :attr:`ModelCosts.written_rows`); None: held densely.
    """
    from securefed.models.registry import get_spec

    try:
        costs = get_spec(model).costs
    except ConfigError:
        return {}
    return {} if costs is None else dict(costs.state(params, shape, written_rows))


def state_bytes_of(state: Mapping[str, Any]) -> dict[str, int]:
    """The bytes of every tensor in a live ``state_dict()``, summed per top-level entry."""
    import torch

    def size(value: Any) -> int:
        if isinstance(value, torch.Tensor):
            return int(value.numel() * value.element_size())
        if isinstance(value, Mapping):
            return sum(size(v) for v in value.values())
        if isinstance(value, list | tuple):
            return sum(size(v) for v in value)
        return 0

    return {k: size(v) for k, v in state.items() if size(v)}


# ---------------------------------------------------------------------------- machine


def available_memory() -> int | None:
    """Bytes of memory this process can still use: ``MemAvailable`` of ``/proc/meminfo``,
    capped by the memory limit of every cgroup (v2 or v1) from this process's own up to the
    root, less what each has in use beyond its reclaimable file cache (``inactive_file``:
    e.g. written-back pages of paged private views); None where none can be read."""
    found: list[int] = []
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    found.append(int(line.split()[1]) * 1024)
                    break
    except (OSError, ValueError):
        pass
    for directory, limit_name, usage_name, stat_key in _cgroup_dirs():
        try:
            with open(f"{directory}/{limit_name}", encoding="ascii") as fh:
                raw = fh.read().strip()
            if raw == "max":
                continue
            limit = int(raw)
            with open(f"{directory}/{usage_name}", encoding="ascii") as fh:
                usage = int(fh.read().strip())
        except (OSError, ValueError):
            continue
        if limit < 2**60:
            found.append(max(limit - usage + _stat_value(directory, stat_key), 0))
    return min(found) if found else None


def _cgroup_dirs() -> list[tuple[str, str, str, str]]:
    """(directory, limit file, usage file, memory.stat key of inactive file pages) of this
    process's memory cgroup and its ancestors, v2 and v1 (the mount roots as well, which is
    what a container sees)."""
    paths = {"v2": "/", "v1": "/"}
    try:
        with open("/proc/self/cgroup", encoding="ascii") as fh:
            for line in fh:
                _, controllers, path = line.rstrip("\n").split(":", 2)
                if controllers == "":
                    paths["v2"] = path or "/"
                elif "memory" in controllers.split(","):
                    paths["v1"] = path or "/"
    except (OSError, ValueError):
        pass
    out = []
    for kind, root, files in (
        ("v2", "/sys/fs/cgroup", ("memory.max", "memory.current", "inactive_file")),
        (
            "v1",
            "/sys/fs/cgroup/memory",
            ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file"),
        ),
    ):
        parts = [p for p in paths[kind].split("/") if p and p != ".."]
        for depth in range(len(parts), -1, -1):
            out.append(("/".join([root, *parts[:depth]]), *files))
    return out


def _stat_value(directory: str, key: str) -> int:
    """One counter of a cgroup's ``memory.stat`` (0 when it cannot be read)."""
    try:
        with open(f"{directory}/memory.stat", encoding="ascii") as fh:
            for line in fh:
                name, _, value = line.partition(" ")
                if name == key:
                    return int(value)
    except (OSError, ValueError):
        pass
    return 0


def machine_speed(*, repeats: int = 5) -> float:
    """How much slower than the development machine this one runs a fixed workload now.

    The workload (about 8 ms there) mixes the elementwise passes over large float arrays that
    dominate FedRAP's round with small matrix products, on one thread: with several threads
    a loaded machine's scheduling made the probe vary 20-fold between calls, on one thread
    3-fold. It works in place in buffers allocated before the clock starts: allocating its
    4 MB temporaries made it depend on the allocator's state (1.1-1.5x in a fresh process,
    up to 4.8x inside an audit on the same quiet machine). The fastest of ``repeats`` runs
    after a warm-up is compared with the development machine's. 2.0 means twice as slow (other
    jobs sharing the cores count: the estimate is for the machine as it is now, and the update
    after round 1 corrects it).
    """
    import torch

    x = torch.rand(1 << 20, generator=torch.Generator().manual_seed(0))
    y = torch.empty_like(x)
    a = torch.full((192, 192), 1e-3)
    b, t = torch.empty_like(a), torch.empty_like(a)
    best = math.inf
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for rep in range(repeats + 1):
            t0 = time.perf_counter()
            y.copy_(x)
            for _ in range(4):
                y.mul_(0.5).add_(0.1).sigmoid_().mul_(x)
            b.copy_(a)
            for _ in range(8):
                torch.mm(b, a, out=t)
                torch.tanh(t, out=b)
            if rep:  # the first run warms up
                best = min(best, time.perf_counter() - t0)
    finally:
        torch.set_num_threads(threads)
    return best / _PROBE_REFERENCE_S


# ---------------------------------------------------------------------------- a model's formulas


@dataclass(frozen=True, kw_only=True)
class CostInputs:
    """What a model's cost formula (:attr:`ModelCosts.work`) reads.

    Attributes:
        config: The run's configuration (``config.params`` are the model's settings).
        shape: The dataset's dimensions.
        participants: Expected clients per round (every user for a centralized model).
        samples: Samples trained per round: the cohort's share of the training interactions,
            each with the model's ``num_negatives`` negatives (when it has that setting).
        written_rows: The bound :attr:`ModelCosts.written_rows` gives for the run (None: its
            state is held densely).
    """

    config: TrainConfig
    shape: RunShape
    participants: float
    samples: float
    written_rows: int | None = None

    @property
    def fraction(self) -> float:
        """The expected share of the users in a round."""
        return self.participants / self.shape.users if self.shape.users else 0.0


@dataclass(frozen=True, kw_only=True)
class ModelWork:
    """A model's terms of a cost estimate (:func:`estimate_run` adds the process, the data,
    the state, secure aggregation, checkpoints and the evaluation schedule). Seconds are on
    the development machine (:func:`machine_speed` scales them); bytes are resident memory.

    Attributes:
        round_bytes: One round's working memory beyond the state (local training's buffers,
            the server step's copies).
        round_seconds: One round without secure aggregation (estimated apart).
        eval_seconds: One evaluation of every user under the sampled protocol (200 items).
        full_eval_seconds: One full-ranking evaluation of every user.
        eval_bytes: Evaluation's working memory (None: :data:`EVAL_BLOCK` users' scores over
            the catalogue, three float32 copies).
        setup_seconds: Once per run (FedRAP's ``torch.compile`` in round 1).
        compile_bytes: Resident memory a compiled kernel adds for the whole run.
        in_file: The state entry held in a file, not resident (FedRAP's paged views ``D``);
            ``file_dir`` is its folder (``""``: ``$TMPDIR``).
        resident: Further memory held for the whole run, by name (the paged file's blocks
            faulted in at once).
        notes: Lines printed with the estimate.
    """

    round_bytes: int = 0
    round_seconds: float = 0.0
    eval_seconds: float = 0.0
    full_eval_seconds: float = 0.0
    eval_bytes: int | None = None
    setup_seconds: float = 0.0
    compile_bytes: int = 0
    in_file: str | None = None
    file_dir: str = ""
    resident: Mapping[str, int] = field(default_factory=dict)
    notes: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class ModelCosts:
    """A model's cost formulas, declared in its module as ``ModelSpec.costs``: the estimate
    ``securefed train`` prints, the memory check that refuses a run before it allocates, and
    the setting its refusal suggests all read them. A model without them is estimated as a
    popularity count and says so (:func:`counting_work`).

    Attributes:
        state: ``(params, shape, written_rows) -> {entry: bytes}``: exactly the tensors of its
            ``state_dict()``, nested entries summed under their top-level name, plain values
            left out (tests/test_costs.py compares it with a built model's).
        work: ``CostInputs -> ModelWork``: a round's and an evaluation's time and memory.
        released: The ``state`` entries a finished run keeps in ``model.pt`` (its shared
            parameters); None: every entry.
        written_rows: ``(config, shape, fraction) -> int | None``: for state held sparsely,
            a bound on its rows after the run's rounds at that cohort fraction (it grows every
            round, so a smaller cohort or fewer rounds can make it fit); None when dense.
        storages: ``(config, shape) -> configs``: the same run with its state held otherwise
            (the same results), in order of preference, tried when memory is short (FedRAP's
            views held dense: sparse, then paged).
        chooses_storage: ``params -> bool``: the run leaves the storage to the machine
            (FedRAP's ``views = "auto"``): it trains the fitting storage of ``storages`` with
            the lowest estimated peak.
        resolve: ``(params, shape) -> params``: settings decided from the data's size
            (fedals's ``dim``), for the smaller settings a refusal suggests.
        refusal: ``config -> (why, what to do)`` when no smaller setting fits: why the state
            must be as large as it is (``""`` or `` (...)``) and the advice (default:
            "choose a smaller dataset").
    """

    state: Callable[[Any, RunShape, int | None], Mapping[str, int]]
    work: Callable[[CostInputs], ModelWork]
    released: tuple[str, ...] | None = None
    written_rows: Callable[[TrainConfig, RunShape, float], int | None] | None = None
    storages: Callable[[TrainConfig, RunShape], Sequence[TrainConfig]] | None = None
    chooses_storage: Callable[[Any], bool] | None = None
    resolve: Callable[[Any, RunShape], Any] | None = None
    refusal: Callable[[TrainConfig], tuple[str, str]] | None = None


def counting_work(inputs: CostInputs) -> ModelWork:
    """The work of counting the cohort's interactions and scoring by one vector (MostPop;
    the estimate of a model without :class:`ModelCosts`)."""
    shape = inputs.shape
    return ModelWork(
        round_bytes=int(inputs.fraction * shape.train_interactions * 16),
        round_seconds=1e-8 * inputs.fraction * shape.train_interactions,
        eval_seconds=1e-9 * shape.users * 200,
        full_eval_seconds=1e-9 * shape.users * shape.items,
    )


# ---------------------------------------------------------------------------- estimate


def _participants(config: TrainConfig, users: int) -> float:
    if not config.spec.federated:
        return float(users)
    return float(config.cohort(users).expected_size(users))


def streamed_secagg(config: TrainConfig, m: int, dim: int) -> bool:
    """Whether a secure round of ``m`` clients' ``dim``-float uploads is encoded and masked a
    block of coordinates at a time: the model's uploads stream and the ``[m, dim]`` ring
    inputs exceed :data:`STREAM_RING_WORDS` (with distributed DP too: its rounding keeps one
    bit per coordinate, :class:`securefed.privacy.DiscreteGaussianBlocks`)."""
    p = config.privacy
    return p.secagg and config.spec.streams_uploads and m * dim > STREAM_RING_WORDS


def _secagg_k(m: int, config: TrainConfig) -> int:
    """SecAgg+ neighbours the run resolves for ``m`` clients (the protocol's own rule)."""
    p = config.privacy
    try:
        from protocols.secagg import SecAggConfig

        return int(
            SecAggConfig(
                n_clients=max(m, 2),
                neighbours=p.secagg_neighbours,
                dropout_tolerance=p.secagg_dropout,
                corrupt_fraction=p.secagg_corrupt,
                modulus_bits=64,
                mode=p.secagg_mode,
            ).k
        )
    except (ImportError, ConfigError, ValueError, TypeError):
        return min(max(m - 1, 1), 30)


def layout_size(config: TrainConfig, data: RunShape | Split) -> int:
    """Floats of one client's upload on ``data`` (the model's ``ModelSpec.layout_size``; 0 for
    a model without uploads). A loaded split is given to the model's formula as it is, a
    :class:`RunShape` as its users and items."""
    from types import SimpleNamespace

    size_fn = config.spec.layout_size
    if size_fn is None:
        return 0
    given: Any = data
    if isinstance(data, RunShape):
        given = SimpleNamespace(n_items=data.items, n_users=data.users)
    return int(size_fn(config.params, given))


def estimate_run(
    config: TrainConfig,
    shape: RunShape,
    *,
    start_round: int = 0,
    speed: float | None = None,
    state: Mapping[str, int] | None = None,
) -> CostEstimate:
    """Estimate the peak memory, disk and time of training ``config`` on data of ``shape``.

    Args:
        config: The run's configuration.
        shape: The dataset's dimensions (:meth:`RunShape.of` a loaded split).
        start_round: Rounds a resumed run keeps (they are not estimated again).
        speed: :func:`machine_speed`'s factor (None: probe now).
        state: The model's state bytes as written (:func:`state_bytes_of` a built model),
            beside the entries of :func:`state_bytes` it does not hold yet (state a later
            round creates); default: :func:`state_bytes` of the configuration.

    Returns:
        The estimate; see :class:`CostEstimate`.
    """
    params = config.params
    model = config.model
    costs = config.spec.costs
    u, i, n_train = shape.users, shape.items, shape.train_interactions
    p = config.privacy
    m = _participants(config, u)
    frac = m / u if u else 0.0
    rounds = max(config.rounds - start_round, 0)
    neg = int(getattr(params, "num_negatives", 0))
    samples = frac * n_train * (1 + neg)  # samples trained per round (positives + negatives)
    rows = None
    if costs is not None and costs.written_rows is not None:
        rows = costs.written_rows(config, shape, frac)
    formula = state_bytes(model, params, shape, written_rows=rows)
    # The live state, and what the formula says the run adds to it later (private fedals's
    # co-occurrence sum appears after its count rounds: a checkpoint 5.7x the first state).
    written = formula if state is None else {**formula, **state}
    if rows is not None:
        written = formula  # the live state grows with the rounds: its bound at the end
    inputs = CostInputs(config=config, shape=shape, participants=m, samples=samples)
    if costs is None:
        work = counting_work(inputs)
        notes = [f"no cost formula for {model}: memory and time are rough"]
    else:
        work = costs.work(dataclasses.replace(inputs, written_rows=rows))
        notes = list(work.notes)
    state_total = sum(formula.values())
    in_file = formula.get(work.in_file, 0) if work.in_file is not None else 0
    state_total -= in_file

    memory: dict[str, int] = {
        "process": PROCESS_BYTES,
        "data": int(n_train * 40 + u * 2 * 100 * 8),
        "state": state_total,
    }
    round_bytes = work.round_bytes
    compile_bytes = work.compile_bytes
    eval_bytes = EVAL_BLOCK * i * 4 * 3 if work.eval_bytes is None else work.eval_bytes
    round_s = work.round_seconds
    setup_s = work.setup_seconds
    eval_full_s = work.full_eval_seconds
    eval_s = work.eval_seconds

    if config.eval_users is not None and config.eval_users < u:
        eval_full_s *= config.eval_users / u  # full ranking of a user sample
    agg_bytes = 0
    secagg_s = 0.0
    if config.spec.federated and (p.secagg or (p.dp and p.placement == "distributed")):
        dim = layout_size(config, shape)
        mm = max(int(math.ceil(m)), 2)
        if p.secagg:
            k = _secagg_k(mm, config)
            agg_bytes = mm * dim * SECAGG_BYTES_PER_COORD + SECAGG_CHUNK_BYTES
            if streamed_secagg(config, mm, dim):
                from protocols.secagg.batched import STREAM_BLOCK_BYTES, default_workers

                block = max(STREAM_BLOCK_BYTES, mm * ENCODE_TILE * 8)  # at least one tile
                agg_bytes = default_workers() * STREAM_BLOCKS_PER_THREAD * block
                if p.ring_noise:
                    agg_bytes += mm * dim // 8  # distributed DP: a rounding bit a coordinate
                notes.append(
                    f"secure aggregation streams its {mm:,} x {dim:,} ring inputs a block of "
                    "coordinates at a time"
                )
            secagg_s = _SECAGG_S * mm * (k + 1) * dim + _KEY_AGREEMENT_S * mm * k
            if p.dp:
                secagg_s += _DDG_S * mm * dim
        else:
            agg_bytes = mm * dim * 8
            secagg_s = _DDG_S * mm * dim * 0.3
    round_s += secagg_s

    memory["round"] = round_bytes
    memory["aggregation"] = agg_bytes
    memory["evaluation"] = eval_bytes
    memory["compile"] = compile_bytes
    memory.update(work.resident)
    base = memory["process"] + memory["data"] + state_total + compile_bytes
    base += sum(work.resident.values())
    peak = base + max(round_bytes + agg_bytes, eval_bytes)
    if shape.synthetic:
        # make_synthetic, before the model exists: float64 logits and Gumbel noise, an int64
        # argsort and a bool mask over users x items.
        memory["synthetic_generation"] = u * i * 25
        peak = max(peak, memory["process"] + memory["synthetic_generation"])

    speed = machine_speed() if speed is None else speed
    evals = _count(start_round, config.rounds, config.eval_every)
    fulls = _count_full(start_round, config.rounds, config.eval_every, config)
    ckpts = _count(start_round, config.rounds, config.resolved_checkpoint_every())
    checkpoint = sum(written.values()) + CHECKPOINT_OVERHEAD
    best = checkpoint if config.resolved_full_eval_every() > config.eval_every else 0
    metrics_bytes = METRICS_BYTES_PER_ROUND * rounds
    disk = checkpoint + best + metrics_bytes
    kept = formula if costs is None or costs.released is None else costs.released
    released = sum(v for k, v in formula.items() if k in kept)
    final = (checkpoint if config.keep_private_state else 0) + metrics_bytes
    final += released + CHECKPOINT_OVERHEAD
    seconds_train = rounds * round_s + setup_s
    seconds_eval = (evals - fulls) * eval_s + fulls * eval_full_s
    if best and rounds:
        seconds_eval += eval_full_s  # the selected round's full ranking from best_model.pt
    return CostEstimate(
        model=model,
        shape=shape,
        rounds=rounds,
        participants=m,
        state=dict(written),
        memory=memory,
        peak_memory=int(peak),
        checkpoint_bytes=int(checkpoint),
        checkpoints=ckpts,
        disk_bytes=int(disk),
        disk_peak=int(disk + checkpoint),
        disk_written=int(ckpts * checkpoint + best * min(evals, 10) + metrics_bytes),
        disk_final=int(final),
        model_bytes=int(released + CHECKPOINT_OVERHEAD),
        round_seconds=round_s * speed,
        secagg_seconds=secagg_s * speed,
        eval_seconds=eval_s * speed,
        full_eval_seconds=eval_full_s * speed,
        evaluations=evals,
        full_evaluations=fulls,
        setup_seconds=setup_s * speed,
        seconds=(seconds_train + seconds_eval) * speed,
        basis=(
            f"rough: machine probe x{speed:.1f}, updated after round 1"
            if formula
            else f"no cost formula for {config.model} (its ModelSpec has no costs): a "
            "popularity count's, updated after round 1"
        ),
        speed=speed,
        notes=tuple(notes),
        in_file=work.in_file,
        file_dir=work.file_dir,
    )


def _count(start: int, rounds: int, every: int) -> int:
    """Rounds in ``start+1 .. rounds`` that are multiples of ``every``, plus the last one."""
    if rounds <= start:
        return 0
    n = rounds // every - start // every
    return n + (0 if rounds % every == 0 else 1)


def _count_full(start: int, rounds: int, eval_every: int, config: TrainConfig) -> int:
    """Rounds in ``start+1 .. rounds`` evaluated with full ranking: the multiples of both
    ``eval_every`` and the full-ranking cadence before the last round, plus the last one.
    Closed form: ``--rounds 1000000000`` is counted at once (a loop over the rounds hung)."""
    return _count_both(start, rounds, eval_every, config.resolved_full_eval_every())


def _count_both(start: int, rounds: int, every: int, other: int) -> int:
    """Rounds ``r`` in ``start+1 .. rounds`` with ``r % every == 0 and r % other == 0``, or
    ``r == rounds`` (the multiples of their least common multiple, and the last round)."""
    if rounds <= start:
        return 0
    step = math.lcm(every, other)
    return (rounds - 1) // step - start // step + 1


# ---------------------------------------------------------------------------- refusal


def check_memory(config: TrainConfig, estimate: CostEstimate, available: int | None = None) -> None:
    """Refuse a run whose estimated peak exceeds the available memory.

    Args:
        config: The run's configuration (for the suggestion).
        estimate: Its estimate.
        available: Bytes available (default: the free GPU memory for a ``cuda`` device, else
            :func:`available_memory`; None there: no check).

    Raises:
        InsufficientMemory: one line with the estimate, what is available, what dominates
            and the flag that would make the run fit.
    """
    if available is None:
        available = _available_for(config.device)
    if available is None or estimate.peak_memory <= available:
        return
    part, size = _largest(estimate.memory, 1)[0]
    what = part
    if part == "state" and estimate.state:
        name, size = _largest(estimate.state, 1)[0]
        what = f"the model state's {name}"
    elif part == "aggregation":
        what = "secure aggregation's [clients x d] inputs" if config.privacy.secagg else part
    elif part == "round":
        what = "one round's local training"
    elif part == "synthetic_generation":
        what = "generating the synthetic data"
    raise InsufficientMemory(
        f"this run needs about {format_bytes(estimate.peak_memory)} of memory "
        f"(mostly {what}: {format_bytes(size)}) but {format_bytes(available)} is available; "
        + _suggest(config, estimate, available)
    )


def check_disk(
    config: TrainConfig,
    estimate: CostEstimate,
    run_dir: str | Path,
    free: int | None = None,
) -> None:
    """Refuse a run whose disk at its largest (``estimate.disk_peak``: the checkpoint, its
    second copy while it is replaced, the best model's copy and ``metrics.jsonl``) exceeds the
    free space of the file system that holds ``run_dir``.

    Args:
        config: The run's configuration (for the suggestion).
        estimate: Its estimate.
        run_dir: Where the run directory goes (need not exist: its nearest existing folder
            says which file system). What a resumed run's directory already holds is
            counted as free: the run replaces it.
        free: Free bytes there (default: read from the file system; None there: no check).

    Raises:
        InsufficientDisk: one line with what the run needs, what is free where, and the
            setting that would make it fit.
    """
    where, read = free_disk_at(run_dir)
    if free is None:
        free = read
    if free is None:
        return
    if where == Path(run_dir) and where.is_dir():
        free += sum(p.stat().st_size for p in where.rglob("*") if p.is_file())
    if estimate.disk_peak <= free:
        return
    checkpoint = estimate.checkpoint_bytes
    metrics = METRICS_BYTES_PER_ROUND * estimate.rounds
    parts = f"{format_bytes(checkpoint)} checkpoint, twice while it is replaced"
    if estimate.disk_peak - metrics > 2 * checkpoint:
        parts += ", and the best round's copy"
    rounds = f"{estimate.rounds:,} round{'' if estimate.rounds == 1 else 's'}"
    parts += f"; {format_bytes(metrics)} of metrics for {rounds}"
    resuming = (Path(run_dir) / "config.toml").is_file()
    raise InsufficientDisk(
        f"this run needs about {format_bytes(estimate.disk_peak)} of disk at its largest "
        f"({parts}) but {format_bytes(free)} is free on the file system holding {where}; "
        + _suggest_disk(config, estimate, free, resuming=resuming, run_dir=Path(run_dir))
    )


def run_files_bytes(config: TrainConfig) -> int:
    """Disk of a run directory's small files beyond its metrics and model files (which
    :func:`estimate_run` counts): the config, data record and summary
    (:data:`RUN_FILES_BYTES`) and, for a DP run, one ledger event per release (every round's,
    each local DP-SGD release at the interaction level, the private prior's)."""
    p = config.privacy
    if not p.dp:
        return RUN_FILES_BYTES
    per_round = 1
    if p.interaction_dp:
        from securefed.privacy import interaction_steps_per_round

        per_round = interaction_steps_per_round(config)
    events = config.rounds * per_round + (1 if p.prior_share else 0)
    return RUN_FILES_BYTES + LEDGER_EVENT_BYTES * events


def free_disk_at(target: str | Path) -> tuple[Path, int | None]:
    """Where ``target`` (a directory that need not exist yet) would be written: its nearest
    existing folder, and the free bytes of the file system holding it (None: they cannot be
    read). The disk checks of ``train``, ``audit`` and ``report`` read it."""
    where = Path(target)
    while not where.exists() and where.parent != where:
        where = where.parent
    return where, _free_disk_for(where)


def _free_disk_for(directory: Path) -> int | None:
    """Free bytes on the file system holding ``directory`` (None: it cannot be read)."""
    import shutil

    try:
        return int(shutil.disk_usage(directory).free)
    except OSError:
        return None


def _suggest_disk(
    config: TrainConfig,
    estimate: CostEstimate,
    free: int,
    *,
    resuming: bool = False,
    run_dir: Path | None = None,
) -> str:
    """Fewer ``--rounds`` when they make the run fit (its metrics grow with them), else
    another ``--out``; found by re-estimating (no probe, nothing written). A resumed run
    takes neither flag (found in review): its ``config.toml``'s ``rounds``, or space freed
    where it lies."""
    shape, speed = estimate.shape, estimate.speed
    start = max(config.rounds - estimate.rounds, 0)
    state = estimate.state if estimate.state else None
    rounds = config.rounds
    while rounds > start + 1:
        rounds = start + (rounds - start) // 2
        cfg = dataclasses.replace(config, rounds=rounds)
        if estimate_run(cfg, shape, start_round=start, speed=speed, state=state).disk_peak <= free:
            if resuming:
                return (
                    f"rounds = {rounds} in {run_dir / 'config.toml' if run_dir else 'config.toml'}"
                    " would fit (or free space on that file system)"
                )
            return (
                f"--rounds {rounds} would fit (or an --out on a file system with more free space)"
            )
    if resuming:
        return "free space on that file system, then resume again"
    return "choose an --out on a file system with more free space, or free space there"


def _available_for(device: str) -> int | None:
    """Free memory where the model lives: the GPU's for ``cuda`` devices, else RAM."""
    if device.startswith("cuda"):
        import torch

        if torch.cuda.is_available():
            index = torch.device(device).index
            return int(torch.cuda.mem_get_info(index if index is not None else 0)[0])
    return available_memory()


def _suggest(config: TrainConfig, estimate: CostEstimate, available: int) -> str:
    """The flag that makes the run fit, found by re-estimating (no probe, no allocation)."""
    shape = estimate.shape
    speed = estimate.speed
    costs = config.spec.costs

    def fits(cfg: TrainConfig) -> bool:
        return estimate_run(cfg, shape, speed=speed).peak_memory <= available

    params = config.params
    dim_field = next(
        (f for f in ("dim", "gmf_dim") if params is not None and hasattr(params, f)), None
    )
    fitting = _storages_that_fit(config, shape, speed, available)
    if fitting:
        return f"{_param_flags(params, fitting[0][0].params)} would fit"
    # State held sparsely grows with the cohort: a smaller fraction can fit it too.
    grows = _grows(config, shape)
    if config.spec.federated and (grows or estimate.memory.get("state", 0) < available):
        for fraction in (0.5, 0.2, 0.1, 0.05, 0.02, 0.01):
            cfg = dataclasses.replace(config, client_fraction=fraction, clients_per_round=None)
            if fits(cfg):
                return f"--client-fraction {fraction:g} would fit"
    if dim_field is not None:
        resolved = (
            params if costs is None or costs.resolve is None else costs.resolve(params, shape)
        )
        current = getattr(resolved, dim_field)  # fedals's dim=None: by catalogue
        if isinstance(current, int):
            for dim in (current // 2**k for k in range(1, 12)):
                if dim < 1:
                    break
                cfg = dataclasses.replace(
                    config, params=dataclasses.replace(params, **{dim_field: dim})
                )
                if fits(cfg):
                    return f"--param {dim_field}={dim} would fit"
    why, other = ("", "")
    if costs is not None and costs.refusal is not None:
        why, other = costs.refusal(config)
    if grows:
        for rounds in (config.rounds // 2**k for k in range(1, 12)):
            if rounds < 1:
                break
            if fits(dataclasses.replace(config, rounds=rounds)):
                return f"--rounds {rounds} would fit (sparse private views grow every round)"
        return (
            f"no --client-fraction, smaller dim or fewer --rounds fits {config.model} on "
            f"{shape.users:,} users x {shape.items:,} items here: "
            f"{other or 'choose a smaller dataset'} or a machine with more memory"
        )
    secagg_dominates = config.privacy.secagg and estimate.memory.get(
        "aggregation", 0
    ) >= estimate.memory.get("round", 0)
    if not other:
        other = (
            "run without --secagg (its blocks dominate)"
            if secagg_dominates
            else "choose a smaller dataset"
        )
    return (
        f"no --client-fraction or smaller dim fits {config.model}{why} on {shape.users:,} "
        f"users x {shape.items:,} items here: {other} or use a machine with more memory"
    )


def _grows(config: TrainConfig, shape: RunShape) -> bool:
    """Whether the run's state is held sparsely and grows every round
    (:attr:`ModelCosts.written_rows`)."""
    costs = config.spec.costs
    if costs is None or costs.written_rows is None:
        return False
    return costs.written_rows(config, shape, 1.0) is not None


def _param_flags(before: Any, after: Any) -> str:
    """``--param key=value`` for each setting that differs between two settings objects."""
    return " ".join(
        f"--param {f.name}={getattr(after, f.name)}"
        for f in dataclasses.fields(after)
        if getattr(before, f.name) != getattr(after, f.name)
    )


def choose_views(
    config: TrainConfig, estimate: CostEstimate, available: int | None
) -> tuple[TrainConfig, CostEstimate] | None:
    """A run that leaves its state's storage to the machine (FedRAP's ``views="auto"``,
    :attr:`ModelCosts.chooses_storage`) on a machine too small for it as held: the run's
    config with the storage that fits (FedRAP: ``sparse``, or ``paged`` when its file also
    fits the free disk; of those that fit, the lower estimated peak) and its estimate. None
    when the run fits as it is, leaves no choice, or nothing fits (:func:`check_memory` then
    refuses it)."""
    costs = config.spec.costs
    if available is None or estimate.peak_memory <= available or costs is None:
        return None
    if costs.chooses_storage is None or not costs.chooses_storage(config.params):
        return None
    fitting = _storages_that_fit(config, estimate.shape, estimate.speed, available)
    if not fitting:
        return None
    return min(fitting, key=lambda f: f[1].peak_memory)


def _storages_that_fit(
    config: TrainConfig, shape: RunShape, speed: float, available: int
) -> list[tuple[TrainConfig, CostEstimate]]:
    """The model's other storages of its state (:attr:`ModelCosts.storages`; FedRAP's views
    held dense: sparse, then paged, only paged with interaction-level DP-SGD, which writes
    every row), in order, that fit ``available`` memory, each with a file only when the file
    also fits the free disk there: ``(config, estimate)`` each. Other storages give the same
    results."""
    costs = config.spec.costs
    if costs is None or costs.storages is None:
        return []
    fitting = []
    for cfg in costs.storages(config, shape):
        est = estimate_run(cfg, shape, speed=speed)
        on_disk = est.state.get(est.in_file, 0) if est.in_file is not None else 0
        if est.peak_memory <= available and on_disk <= free_disk(est.file_dir):
            fitting.append((cfg, est))
    return fitting


def free_disk(directory: str = "") -> int:
    """Free bytes where a state file would go (FedRAP's paged views; ``directory``, else
    ``$TMPDIR``); 0 when it cannot be read."""
    import tempfile

    free = _free_disk_for(Path(directory or tempfile.gettempdir()))
    return 0 if free is None else free


def fit_memory(
    config: TrainConfig, estimate: CostEstimate
) -> tuple[TrainConfig, CostEstimate, int | None]:
    """The run to start on this machine: ``config`` and ``estimate``, or FedRAP's with the
    storage of its private views that fits (:func:`choose_views`), checked against the
    memory available (read once), which is returned too (None: unknown).

    Raises:
        InsufficientMemory: see :func:`check_memory`.
    """
    available = _available_for(config.device)
    chosen = choose_views(config, estimate, available)
    if chosen is not None:
        config, estimate = chosen
    check_memory(config, estimate, available)
    return config, estimate, available


def check_synthetic_fits(config: TrainConfig, *, speed: float | None = None) -> float | None:
    """A synthetic dataset's generator holds dense ``users x items`` arrays: refuse one that
    cannot fit before generating it (the shape is known from the config). Other datasets
    pass (their estimate needs the loaded split). Returns the machine speed used (None for
    other datasets).

    Raises:
        InsufficientMemory: see :func:`check_memory`.
    """
    if config.dataset != "synthetic":
        return None
    users, items = config.synthetic_users, config.synthetic_items
    shape = RunShape(
        users=users,
        items=items,
        train_interactions=users * min(106, max(items // 2, 3)),
        synthetic=True,
    )
    speed = machine_speed() if speed is None else speed
    # Dense views that would not fit are no refusal: the run picks their storage later.
    fit_memory(config, estimate_run(config, shape, speed=speed))
    return speed


def refuse_if_too_large(
    config: TrainConfig, split: Split, *, run_dir: str | Path = "runs"
) -> TrainConfig:
    """``train(config, before_build=refuse_if_too_large)``: the memory and disk checks of
    ``securefed train`` for Python callers (no probe: memory and disk are checked, not time).
    Returns the config to train: ``config``, or FedRAP's with the storage of its private views
    that fits (:func:`choose_views`).

    Disk is checked on the file system of ``run_dir`` (default: ``runs``, where
    :func:`securefed.training.train` puts a run without ``out``); for another ``out`` pass
    ``functools.partial(refuse_if_too_large, run_dir=out)``.

    Raises:
        InsufficientMemory: see :func:`check_memory`.
        InsufficientDisk: see :func:`check_disk`.
    """
    config, estimate, _ = fit_memory(config, estimate_run(config, RunShape.of(split), speed=1.0))
    check_disk(config, estimate, run_dir)
    return config
