"""``attacks.audit``: attack a federated run under explicit threat models and audit its DP.

One call trains a run (or re-simulates a recorded one) with an observer that records what
each threat model's observer sees (:mod:`attacks.recorder`), then scores the chosen attacks
and the canary audit. A DP run the audit trains itself replays its noise and cohorts from the
seed (``PrivacyConfig.replay``), so it can be re-simulated; a run trained with OS randomness
(the default) can be audited only from statistics recorded while it trained::

    from attacks.audit import AuditConfig, audit
    from securefed import TrainConfig, PrivacyConfig

    cfg = AuditConfig(train=TrainConfig(model="fedrap", dataset="ml-100k", rounds=5,
                                        privacy=PrivacyConfig(epsilon=2.0)))
    result = audit(cfg, out="audits/fedrap-eps2")
    result.report["audit"]["epsilon_lower_bound"]

Writes ``audit.json`` (schema in ``docs/attacks.md``), ``scores.npz`` (per attack the
``[users, items]`` scores with NaN for non-candidates, and the membership labels, so every
ROC curve can be recomputed) and the audit's training run (``run/`` or ``replay/``: config,
metrics, summary; no checkpoint). What the observer streamed to disk is removed after scoring
unless ``keep_recording`` keeps it (``<run>/audit/record/``, with the accumulated statistics
that a later ``--run`` audit rescores without training).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from attacks.registry import attack_names, get_attack, per_client_attacks, recorder_groups
from attacks.results import (
    RELEASE_NOTE,
    RELEASED_FILE,
    AttackResult,
    AuditConfig,
)
from protocols.seeding import numpy_generator
from securefed import runs
from securefed.data.split import DEFAULT_EVAL_NEGATIVES
from securefed.errors import ConfigError
from securefed.training import (
    TrainConfig,
    build_model,
    check_run_dir_writable,
    default_run_dir,
    load_config_file,
    load_split,
    public_state,
    refuse_foreign_files,
    stamped_dir,
    train,
)

if TYPE_CHECKING:
    from securefed.costs import CostEstimate, RunShape
    from securefed.data.types import Split

__all__ = [
    "AttackResult",
    "AuditConfig",
    "AuditDisk",
    "AuditResult",
    "audit",
    "AuditSetup",
    "audit_canaries",
    "audit_memory_bytes",
    "estimate_audit_disk",
    "estimate_audit_seconds",
    "items_per_canary",
    "kept_bytes_bound",
    "prepare_audit_config",
    "replayed_shape",
    "ResumedRun",
]

AUDIT_FILE = "audit.json"
SCORES_FILE = "scores.npz"
_META = "audit_meta.json"
_ACC = "accumulators.npz"
#: Prefix of the temporary folder inside the output directory that holds a recording that is
#: not kept (see :attr:`AuditConfig.keep_recording`).
_SCRATCH = ".recording-"
#: ``scores.npz`` over the raw size of its arrays, above every audit measured: FedRAP with DP
#: on MovieLens 100K, 13.2 MB for seven ``[943, 1682]`` float32 score matrices and the labels
#: (0.29; fedals's 2-round audit: 1.95 MB for five, 0.06); FedRAP's 2-round audits of 60
#: synthetic users, whose every user is observed, 0.49 without DP and 0.52 at epsilon 2
#: (2026-12-08; 0.3 before, which those exceeded); FedRecGEL's 0.13, fedals's 0.20.
SCORES_COMPRESSION_BOUND = 0.6
#: Canary clients an audit adds to the replayed run (``AuditConfig.canaries``).
DEFAULT_CANARIES = 256
# Fitted 2026-12-05 on the quiet machine (probe x1.0) to one-round audits of MovieLens 100K
# (`securefed audit --model M --dataset ml-100k --rounds 1`: FedRAP 31.8 s, fedals 10.3 s,
# FedRecGEL 47.1 s; the constants before, from the loaded machine, said 79 s, 31 s and 7 min).
#: The replay's work beyond training, per (observed client, item) of the replayed split
#: (canaries included): building the canaries, recording, evaluating. FedRAP's replay took
#: 16.7 s against 5.75 s of estimated training (2.6 us an entry; fedals 0.6 us).
_REPLAY_S_PER_ENTRY = 2.5e-6
#: The recorder's work each round per observed client: per upload coordinate (the uploads
#: made dense in chunks with the observer's noise share, the canaries' clipped uploads) and
#: per item (the attacks' statistics of the item rows). Fitted 2026-12-07, under load average
#: 4-5, to two audits of MovieLens 100K's 943 users and 256 canaries (`securefed report
#: --models fedals --references none --epsilons 2,inf --defenses none,dp --seeds 1 --dataset
#: ml-100k`): private fedals, 453,000 floats an upload (its co-occurrence part over 912
#: items) x 2,194 items x 3 rounds, 41.5 s in the recorder; fedals without DP, 56,500 floats x
#: 1,682 items x 20 rounds, about 110 s. The per-entry constant above was fitted to one-round
#: audits and missed that this grows with the rounds and the upload's width.
_RECORD_S_PER_COORD = 1.5e-8
_RECORD_S_PER_ITEM = 2.2e-6
#: Scoring the attacks, per (observed user, item) entry of a score matrix (bootstrap
#: intervals): 0.14 us (fedals) to 0.21 us (FedRAP) measured.
_SCORE_S_PER_ENTRY = 2.5e-7
#: The membership metrics' passes over a whole ``[users, items]`` score matrix and its labels,
#: per entry: 3.5 ns (FedRAP's IMIA on Gowalla, 29,858 x 40,981, 300 users observed).
_METRIC_S_PER_ENTRY = 3.5e-9
#: Starting the command, loading the split and writing the audit (6-7 s measured).
_AUDIT_START_S = 6.0
#: ``audit.json`` and the canary arrays, about (14 kB measured).
_AUDIT_SMALL_BYTES = 64 * 1024
#: One array of an ``.npz`` beyond its data: its zip entry and ``.npy`` header (210-218 bytes
#: measured, numpy 2, compressed or not).
_NPZ_MEMBER_BYTES = 256
#: The recorder's per-user accumulators (:class:`attacks.recorder._Acc`): five int64 and two
#: float64 arrays, kept in ``accumulators.npz`` with ``--keep-recording``.
_ACC_PER_USER_BYTES = 7 * 8
#: A kept recording's ``audit_meta.json`` per canary: its user, item, partner and inclusion
#: as JSON numbers (at most 20 characters each with their separators).
_CANARY_META_BYTES = 4 * 20


@dataclass(frozen=True)
class AuditResult:
    """What :func:`audit` returns: the report (also ``audit.json``) and where it lies."""

    out_dir: Path
    report: dict[str, Any]
    attacks: list[AttackResult]
    bytes_recorded: int
    #: Whether the recording stays on disk (``keep_recording``, or a ``run`` that held one).
    kept_recording: bool = False

    @property
    def epsilon_lower_bound(self) -> float | None:
        """The canary audit's empirical lower bound on epsilon (None: no canary audit)."""
        a = self.report.get("audit")
        return None if a is None else a["epsilon_lower_bound"]

    @property
    def accounted_epsilon(self) -> float | None:
        """The epsilon the audited run's ledger accounts (None: a run without DP)."""
        return self.report.get("accounted_epsilon")


@dataclass(frozen=True)
class AuditSetup:
    """What an audit that trains will do, told to ``before_train`` (for its estimate).

    Attributes:
        attacks: The attacks that will be scored (the chosen ones the run supports).
        array_bytes: Memory of its ``[users, items]`` arrays beside the replay training
            (:func:`audit_memory_bytes`: the recorder's tables, the scores, the labels).
        canaries: Canaries planted in the split ``before_train`` is given (0: none).
        disk: The disk it will write (:func:`estimate_audit_disk`), checked to fit.
    """

    attacks: tuple[str, ...]
    array_bytes: int
    canaries: int = 0
    disk: AuditDisk | None = None


def audit_canaries(train_cfg: TrainConfig, users: int, canaries: int | None = None) -> int:
    """Canary clients an audit of ``train_cfg`` plants on a split of ``users`` users:
    ``canaries`` (:attr:`AuditConfig.canaries`) when given, else :data:`DEFAULT_CANARIES`, at
    most one per user under interaction-level DP (a zero-out canary needs a host of its own)."""
    if canaries is not None:
        return canaries
    if train_cfg.privacy.interaction_dp:
        return min(DEFAULT_CANARIES, users)
    return DEFAULT_CANARIES


def items_per_canary(train_cfg: TrainConfig) -> int:
    """Fresh items each canary appends to the catalogue: one for an interaction-level canary
    (a planted positive of its host), else the model's ``ObserverHooks.canary_items`` (two for
    a model that releases item pairs, so that each canary owns a pair)."""
    hooks = train_cfg.spec.observer
    if train_cfg.privacy.interaction_dp or hooks is None:
        return 1
    return int(hooks.canary_items)


def prepare_audit_config(train_cfg: TrainConfig, canaries: int) -> TrainConfig:
    """The config an audit that plants ``canaries`` user-level canaries trains: as the model's
    ``ObserverHooks.prepare_audit`` adapts it to the canaries' items, the last ``canaries x``
    :func:`items_per_canary` of the planted catalogue (private fedals puts them in its
    co-occurrence set, so the canary test reads those releases too); ``train_cfg`` itself
    without canaries, for interaction-level canaries, or for a model without the hook.

    The audit trains this config, and the report's sweep estimates the audit with it.
    """
    hooks = train_cfg.spec.observer
    if canaries <= 0 or train_cfg.privacy.interaction_dp:
        return train_cfg
    if hooks is None or hooks.prepare_audit is None:
        return train_cfg
    prepared: TrainConfig = hooks.prepare_audit(train_cfg, canaries * items_per_canary(train_cfg))
    return prepared


def replayed_shape(
    train_cfg: TrainConfig, users: int, items: int, canaries: int
) -> tuple[int, int]:
    """Users and items of the split an audit of ``train_cfg`` replays, from the run's
    ``users`` and ``items`` with ``canaries`` canaries planted: a user-level canary is a
    client of its own with :func:`items_per_canary` fresh items, an interaction-level one a
    fresh item of a user already there (:mod:`attacks.canaries`)."""
    added = canaries * items_per_canary(train_cfg)
    if train_cfg.privacy.interaction_dp:
        return users, items + added
    return users + canaries, items + added


def _unplanted_shape(
    train_cfg: TrainConfig, users: int, items: int, canaries: int
) -> tuple[int, int]:
    """The run's users and items from the replayed split's (:func:`replayed_shape` undone)."""
    more_users, more_items = replayed_shape(train_cfg, 0, 0, canaries)
    return max(users - more_users, 0), max(items - more_items, 0)


def _score_matrices(attacks: Sequence[str] | set[str]) -> int:
    """How many ``[users, items]`` float32 score matrices ``attacks`` keep."""
    return sum(get_attack(a).score_matrices for a in attacks)


def _label_matrices(attacks: Sequence[str] | set[str]) -> int:
    """How many ``[users, items]`` boolean label matrices ``attacks`` keep (one is shared)."""
    return 1 + sum(get_attack(a).label_matrices for a in attacks)


def _default_attacks(train_cfg: TrainConfig) -> tuple[list[str], int]:
    """The attacks a default audit of ``train_cfg`` runs, and how many of them keep a
    ``[users, items]`` float32 score matrix."""
    chosen, _ = _resolve_attacks(AuditConfig(), train_cfg)
    return chosen, _score_matrices(chosen)


def kept_bytes_bound(
    train_cfg: TrainConfig, users: int, items: int, *, attacks: Sequence[str] | None = None
) -> int:
    """Disk an audit of ``train_cfg`` with every attack (or ``attacks``) keeps
    (``scores.npz``, ``audit.json``).

    Every chosen attack keeps its ``[users, items]`` float32 score matrices
    (:attr:`AttackSpec.score_matrices`: one, none for ``attribute``) beside the boolean
    membership-label matrices (one, two with ``released``); the recording is
    removed after scoring. Compressed at :data:`SCORES_COMPRESSION_BOUND`, the largest ratio
    measured, so this is a bound rather than a prediction (fedals's audits compress 5x
    better).

    Args:
        train_cfg: The audited run's configuration (its model and defenses choose the attacks).
        users: Real users of the split (canaries are not kept).
        items: Items of the split.
        attacks: The attacks that will run (default: those of a default audit).
    """
    if attacks is None:
        chosen, matrices = _default_attacks(train_cfg)
    else:
        chosen, matrices = list(attacks), _score_matrices(attacks)
    raw = (4 * matrices + _label_matrices(chosen)) * users * items
    return int(raw * SCORES_COMPRESSION_BOUND) + _AUDIT_SMALL_BYTES


@dataclass(frozen=True, kw_only=True)
class AuditDisk:
    """Disk an audit writes, in bytes (:func:`estimate_audit_disk`): bounds, every array
    counted as if it did not compress, the scores at their worst measured compression.

    Attributes:
        replay: The replay training's run directory at its largest (``disk_peak`` of
            :func:`securefed.costs.estimate_run` on the split with the canaries: its
            checkpoints while it trains); 0 when the audit rescores a kept recording.
        replay_kept: What that directory keeps once the audit has removed its checkpoint and
            released model (metrics, summary, ledger).
        recording: What the observers' recorder streams to disk (:mod:`attacks.recorder`:
            each round's participants, aggregate statistic and canary scores; the inversion
            targets' uploads with the round's global model; the released model) and, with
            ``keep_recording``, its accumulated statistics.
        scores: ``scores.npz`` and ``audit.json`` (:func:`kept_bytes_bound`).
        keep_recording: The recording stays (else it is removed after scoring).
    """

    replay: int
    replay_kept: int
    recording: int
    scores: int
    keep_recording: bool = False

    @property
    def peak(self) -> int:
        """At its largest: the replay's checkpoints beside the recording while it trains, or
        the recording beside the scores while they are written (the recording goes last)."""
        return max(self.replay + self.recording, self.replay_kept + self.recording + self.scores)

    @property
    def kept(self) -> int:
        """What the audit's directory keeps once it has finished."""
        return self.replay_kept + self.scores + (self.recording if self.keep_recording else 0)


def estimate_audit_disk(
    train_cfg: TrainConfig,
    shape: RunShape,
    *,
    canaries: int | None = None,
    canaries_included: bool = False,
    attacks: Sequence[str] | None = None,
    target_users: int = 16,
    keep_recording: bool = False,
) -> AuditDisk:
    """Disk an audit of ``train_cfg`` on data of ``shape`` writes (:class:`AuditDisk`).

    Args:
        train_cfg: The config the audit trains (:func:`prepare_audit_config` for its
            canaries).
        shape: The split's dimensions (with the canaries planted when
            ``canaries_included``: :func:`replayed_shape`).
        canaries: Canaries the audit plants (None: the audit's default,
            :func:`audit_canaries`).
        canaries_included: ``shape`` is the split's with the canaries planted.
        attacks: The attacks that will run (default: those of a default audit).
        target_users: Targets of the optimisation inversion (:attr:`AuditConfig.target_users`).
        keep_recording: :attr:`AuditConfig.keep_recording`.
    """
    from securefed.costs import estimate_run

    n = audit_canaries(train_cfg, shape.users, canaries)
    if canaries_included:
        replay = shape
        real_users, real_items = _unplanted_shape(train_cfg, shape.users, shape.items, n)
    else:
        users, items = replayed_shape(train_cfg, shape.users, shape.items, n)
        replay = dataclasses.replace(
            shape,
            users=users,
            items=items,
            train_interactions=shape.train_interactions + n * items_per_canary(train_cfg),
        )
        real_users, real_items = shape.users, shape.items
    chosen = _default_attacks(train_cfg)[0] if attacks is None else list(attacks)
    return _audit_disk(
        train_cfg,
        estimate_run(train_cfg, replay, speed=1.0),
        chosen,
        real_users=real_users,
        real_items=real_items,
        canaries=n,
        target_users=target_users,
        keep_recording=keep_recording,
    )


def _audit_disk(
    train_cfg: TrainConfig,
    replay: CostEstimate,
    chosen: Sequence[str],
    *,
    real_users: int,
    real_items: int,
    canaries: int,
    target_users: int,
    keep_recording: bool,
) -> AuditDisk:
    """:func:`estimate_audit_disk` from the replay training's estimate (on the split with
    the canaries) and the chosen attacks."""
    from attacks.recorder import recorded_groups, recorder_tables
    from securefed.costs import CHECKPOINT_OVERHEAD, run_files_bytes

    attacks = set(chosen)
    upload = bool(per_client_attacks() & attacks)  # an upload channel is observed
    groups = recorded_groups(attacks, upload=upload)
    users = replay.shape.users  # the recorder's users: the canary clients too
    # Each round's file: the participants (int64), the aggregate's row statistic (float32 per
    # real item, for union) and the canaries' scores (float64).
    per_round = 8 * users + 8 * canaries + 3 * _NPZ_MEMBER_BYTES
    if "union" in groups:
        per_round += 4 * real_items
    recording = max(train_cfg.rounds, 1) * per_round
    if "targets" in groups:  # each target's upload (float32) and the round's global model
        layout = _layout(train_cfg, users, replay.shape.items)
        each = 4 * layout + replay.model_bytes + CHECKPOINT_OVERHEAD
        recording += min(target_users, real_users) * each
    if "release" in groups:
        recording += replay.model_bytes
    if keep_recording:  # accumulators.npz and audit_meta.json
        tables = len(recorder_tables(attacks, upload=upload))
        recording += 4 * tables * users * real_items + _ACC_PER_USER_BYTES * users
        recording += 8 * canaries + _AUDIT_SMALL_BYTES + _CANARY_META_BYTES * canaries
    kept = replay.disk_final - replay.model_bytes + run_files_bytes(train_cfg)
    if train_cfg.keep_private_state:
        kept -= replay.checkpoint_bytes
    return AuditDisk(
        replay=replay.disk_peak,
        replay_kept=max(kept, 0),
        recording=int(recording),
        scores=kept_bytes_bound(train_cfg, real_users, real_items, attacks=chosen),
        keep_recording=keep_recording,
    )


def estimate_audit_seconds(
    train_cfg: TrainConfig,
    users: int,
    items: int,
    train_seconds: float,
    *,
    full_eval_seconds: float = 0.0,
    speed: float = 1.0,
    canaries: int | None = None,
    canaries_included: bool = False,
    attacks: Sequence[str] | None = None,
) -> float:
    """Seconds an audit of ``train_cfg`` takes, roughly: with every attack, or ``attacks``.

    Args:
        train_cfg: The audited run's configuration.
        users: Users of the split (without the canary clients unless ``canaries_included``).
        items: Items of the split (without the canaries' items unless ``canaries_included``).
        train_seconds: The training's estimate (:func:`securefed.costs.estimate_run`) on that
            split.
        full_eval_seconds: One full-ranking evaluation of the model (the estimate's
            ``full_eval_seconds``, already scaled by ``speed``): the released-model and
            optimization attacks score the model many times.
        speed: The machine probe's factor (:func:`securefed.costs.machine_speed`).
        canaries: Canaries the audit plants (:attr:`AuditConfig.canaries`; None: the
            audit's default, :func:`audit_canaries`).
        canaries_included: ``users``, ``items`` and ``train_seconds`` are the split's with
            the canaries planted (:func:`replayed_shape`).
        attacks: The attacks that will run (default: those of a default audit).

    The replay trains with the canaries added (its estimate scaled by the users they add;
    interaction-level canaries add items to users already there) and the recorder attached
    (:data:`securefed.costs.AUDIT_COST_FACTOR`), plus a fixed
    cost per (observed client, item), each round's recording per (observed client, upload
    coordinate and item) (:data:`_RECORD_S_PER_COORD`), the scoring of every chosen attack's score
    matrix over the observed users and the metrics' passes over all of it, and the iterative
    attacks in units of full evaluations, and the command's start. The observed clients are
    at most the round's expected cohort times the rounds (plus the canaries): an audit of 300
    clients of Gowalla's 29,858 records and scores 300 users' rows (the estimate said 2.9 h
    for that 98 s audit before it counted them). Rough: the constants were measured on
    MovieLens 100K for one-round runs of each model on the quiet development machine.
    """
    from securefed.costs import AUDIT_COST_FACTOR

    n_canaries = audit_canaries(train_cfg, users, canaries)
    if canaries_included:
        replayed, replayed_items = users, items
        real, real_items = _unplanted_shape(train_cfg, users, items, n_canaries)
    else:
        real, real_items = users, items
        replayed, replayed_items = replayed_shape(train_cfg, users, items, n_canaries)
    replay = train_seconds * (1.0 if canaries_included else replayed / max(users, 1))
    per_round = train_cfg.cohort(max(real, 1)).expected_size(max(real, 1))
    seen = min(real, math.ceil(per_round * max(train_cfg.rounds or 1, 1)))
    if attacks is None:
        chosen, matrices = _default_attacks(train_cfg)
    else:
        chosen, matrices = list(attacks), _score_matrices(attacks)
    rounds = max(train_cfg.rounds or 1, 1)
    # Each round the recorder reads the cohort's uploads (per-client attacks) and the
    # canaries' own.
    per_round_seen = n_canaries
    if per_client_attacks() & set(chosen):
        per_round_seen += min(real, math.ceil(per_round))
    layout = _layout(train_cfg, replayed, replayed_items)
    fixed = (
        _REPLAY_S_PER_ENTRY * (seen + replayed - real) * replayed_items
        + (_RECORD_S_PER_COORD * layout + _RECORD_S_PER_ITEM * replayed_items)
        * per_round_seen
        * rounds
        + _SCORE_S_PER_ENTRY * matrices * max(seen, 1) * real_items
        + _METRIC_S_PER_ENTRY * matrices * max(real, 1) * real_items
    )
    cfg = AuditConfig()  # the defaults the report's audits run with
    evals = sum(
        spec.full_evals(cfg) for spec in map(get_attack, chosen) if spec.full_evals is not None
    )
    return AUDIT_COST_FACTOR * replay + speed * (fixed + _AUDIT_START_S) + evals * full_eval_seconds


def audit_memory_bytes(
    attacks: Sequence[str],
    users: int,
    items: int,
    *,
    upload: bool,
    canaries: int = 0,
    layout: int = 0,
) -> int:
    """Memory an audit's arrays take beside its replay training: the recorder's ``[users,
    items]`` tables (:func:`attacks.recorder.recorder_tables`), then at scoring one float32
    score matrix per membership attack (:attr:`AttackSpec.score_matrices`, kept for
    ``scores.npz``), the boolean membership labels (:attr:`AttackSpec.label_matrices`) and
    two bytes of candidate masks; and each round the ``canaries`` canary clients' uploads of
    ``layout`` floats, dense and clipped (two float32 copies each), that the canary test reads:
    private fedals's audit puts the canaries' 512 items in its co-occurrence set, 453,000
    floats an upload on MovieLens 100K, 0.93 GB for 256 canaries (2.24 GB peak RSS measured,
    1.31 GB outside the canary test; not counted before).
    """
    from attacks.recorder import recorder_bytes

    chosen = set(attacks)
    matrices = _score_matrices(chosen)
    per_entry = 4 * matrices + _label_matrices(chosen) + 2 if matrices else 0
    return (
        recorder_bytes(chosen, users, items, upload=upload)
        + per_entry * users * items
        + 2 * 4 * canaries * layout
    )


def _layout(train_cfg: TrainConfig, users: int, items: int) -> int:
    """Floats of one client's upload (:func:`securefed.costs.layout_size`)."""
    from securefed.costs import RunShape, layout_size

    return layout_size(train_cfg, RunShape(users=users, items=items, train_interactions=0))


def _check_audit_memory(
    train_cfg: TrainConfig,
    split: Split,
    chosen: list[str],
    *,
    upload: bool,
    canaries: int = 0,
    available: int | None = None,
    estimate: CostEstimate | None = None,
) -> int:
    """Refuse an audit whose replay training plus its arrays (:func:`audit_memory_bytes`,
    with the ``canaries`` canary clients' uploads) would not fit; returns those arrays'
    bytes. ``estimate``: the replay training's, when the caller has it.

    Raises:
        InsufficientMemory: one line with the estimate, what is available and the chosen
            attacks that would fit (or that none would).
    """
    from attacks.recorder import recorder_bytes, recorder_tables
    from securefed.costs import (
        InsufficientMemory,
        RunShape,
        available_memory,
        check_memory,
        estimate_run,
        format_bytes,
    )

    u, i = split.n_users, split.n_items
    tables = recorder_bytes(set(chosen), u, i, upload=upload)
    layout = _layout(train_cfg, u, i)
    arrays = audit_memory_bytes(chosen, u, i, upload=upload, canaries=canaries, layout=layout)
    if available is None:
        available = available_memory()
    if available is None or arrays == 0:
        return arrays
    if estimate is None:
        estimate = estimate_run(train_cfg, RunShape.of(split), speed=1.0)
    training = estimate.peak_memory
    if training + arrays <= available:
        return arrays
    if training > available:  # no choice of attacks helps: the training's own refusal
        check_memory(train_cfg, estimate, available)

    def need(attacks: set[str]) -> int:
        return training + audit_memory_bytes(
            sorted(attacks), u, i, upload=upload, canaries=canaries, layout=layout
        )

    # The attacks that fit: the upload attacks (one shared set of tables) as one unit, every
    # other attack alone; cheapest units first.
    sharing = {a for a in chosen if "upload" in get_attack(a).reads}
    units = ([sharing] if sharing else []) + [{a} for a in chosen if a not in sharing]
    keep: set[str] = set()
    for unit in sorted(units, key=need):
        if need(keep | unit) <= available:
            keep |= unit
    order = [a for a in chosen if a in keep]
    hint = (
        f"--attacks {','.join(order)} would fit"
        if order
        else "audit a dataset with fewer users x items (a sample of its users)"
    )
    n_tables = len(recorder_tables(set(chosen), upload=upload))
    uploads = 2 * 4 * canaries * layout
    canary_text = (
        f"; the {canaries:,} canaries' uploads, {format_bytes(uploads)}" if uploads else ""
    )
    raise InsufficientMemory(
        f"this audit needs about {format_bytes(training + arrays)} of memory (mostly its "
        f"users x items arrays, {u:,} x {i:,}: {n_tables} recorder tables, "
        f"{format_bytes(tables)}, and the attack scores, "
        f"{format_bytes(arrays - tables - uploads)}{canary_text}) "
        f"but {format_bytes(available)} is available; {hint}"
    )


def _check_audit_disk(
    train_cfg: TrainConfig,
    replay: CostEstimate | None,
    chosen: Sequence[str],
    out_dir: Path,
    *,
    real_users: int,
    real_items: int,
    canaries: int,
    target_users: int,
    keep_recording: bool,
    with_canaries: Callable[[int], AuditDisk] | None = None,
    free: int | None = None,
) -> AuditDisk:
    """Refuse an audit whose disk at its largest (:class:`AuditDisk`) exceeds the free space
    of the file system ``out_dir`` goes on, before anything is written; returns the estimate.
    ``replay``: the replay training's estimate (None: a kept recording is rescored, nothing
    trains); ``with_canaries``: the same audit's disk with fewer canaries (for the advice);
    ``free``: free bytes there (default: read; unknown: no check).

    Raises:
        InsufficientDisk: one line with what the audit needs, its parts, what is free where,
            and what would fit: no ``--keep-recording``, fewer attacks, fewer canaries (each
            adds a client and its items to the replay), or another ``--out``.
    """
    from securefed.costs import InsufficientDisk, format_bytes, free_disk_at

    def estimate(attacks: Sequence[str], keep: bool) -> AuditDisk:
        if replay is None:
            scores = kept_bytes_bound(train_cfg, real_users, real_items, attacks=attacks)
            return AuditDisk(replay=0, replay_kept=0, recording=0, scores=scores)
        return _audit_disk(
            train_cfg,
            replay,
            attacks,
            real_users=real_users,
            real_items=real_items,
            canaries=canaries,
            target_users=target_users,
            keep_recording=keep,
        )

    disk = estimate(chosen, keep_recording)
    where, read = free_disk_at(out_dir)
    if free is None:
        free = read
    if free is None or disk.peak <= free:
        return disk
    elsewhere = "an --out on a file system with more free space"
    hint = f"choose {elsewhere}, or free space there"
    if keep_recording and estimate(chosen, False).peak <= free:
        hint = f"without --keep-recording it would fit (or {elsewhere})"
    else:
        # The attacks that fit: the upload attacks (one shared recording) as one unit, every
        # other attack alone; cheapest first.
        sharing = {a for a in chosen if "upload" in get_attack(a).reads}
        units = ([sharing] if sharing else []) + [{a} for a in chosen if a not in sharing]

        def need(attacks: set[str]) -> int:
            return estimate([a for a in chosen if a in attacks], keep_recording).peak

        keep: set[str] = set()
        for unit in sorted(units, key=need):
            if need(keep | unit) <= free:
                keep |= unit
        if keep:
            order = ",".join(a for a in chosen if a in keep)
            hint = f"--attacks {order} would fit (or {elsewhere})"
        elif with_canaries is not None and canaries > 0:
            n = canaries
            while n > 0:
                n //= 2
                if with_canaries(n).peak <= free:
                    what = " (no DP audit)" if n == 0 else ""
                    hint = f"--canaries {n}{what} would fit (or {elsewhere})"
                    break
    parts = [
        (disk.replay, "the replay training's checkpoints"),
        (disk.recording, "the observers' recording" + (", kept" if keep_recording else "")),
        (disk.scores, "the attack scores"),
    ]
    named = "; ".join(f"{what} {format_bytes(size)}" for size, what in parts if size)
    raise InsufficientDisk(
        f"this audit needs about {format_bytes(disk.peak)} of disk at its largest ({named}) "
        f"but {format_bytes(free)} is free on the file system holding {where}; {hint}"
    )


def _resolve_attacks(cfg: AuditConfig, train_cfg: TrainConfig) -> tuple[list[str], dict[str, str]]:
    spec = train_cfg.spec
    if not spec.federated:
        raise ConfigError(
            f"{spec.name} is a centralized reference (the server sees every interaction): there "
            "is no federated channel to attack; audit a federated model"
        )
    secagg = train_cfg.privacy.secagg
    unsupported = dict(spec.unsupported_attacks)
    names = attack_names()
    for a in names:
        written_for = get_attack(a).models
        if written_for is not None and spec.name not in written_for:
            unsupported.setdefault(
                a, f"the {a} attack is written for {', '.join(written_for)} only"
            )
    if spec.observer is None:
        for a in per_client_attacks():
            unsupported.setdefault(a, f"{spec.name}'s uploads have no per-item rows")
    skipped: dict[str, str] = {}
    if cfg.attacks == ("all",):
        chosen = list(names)
        per_client = per_client_attacks()
        for a in names:  # report order, so the skipped lines read the same in every run
            if secagg and a in per_client:
                skipped[a] = "secure aggregation: no per-client upload is visible"
            elif a in unsupported:
                skipped[a] = unsupported[a]
        return [a for a in chosen if a not in skipped], skipped
    chosen = list(cfg.attacks)
    if secagg:
        per_client = per_client_attacks()
        bad = [a for a in chosen if a in per_client]
        if bad:
            usable = [a for a in names if a not in per_client and a not in unsupported]
            raise ConfigError(
                f"attack {bad[0]!r} needs per-client uploads, but secure aggregation is on: the "
                "server sees only per-round sums, so per-client attacks have no input; use "
                f"--attacks {','.join(usable)} or a run without --secagg"
            )
    for a in chosen:
        if a in unsupported:
            raise ConfigError(
                f"attack {a!r} does not apply to {spec.name} ({unsupported[a]}); drop it"
            )
    return chosen, skipped


def _load_run(run: Path) -> TrainConfig:
    if not (run / runs.CONFIG_FILE).exists():
        raise ConfigError(f"{run} is not a run directory (no {runs.CONFIG_FILE}); check --run")
    return TrainConfig.from_dict(load_config_file(run / runs.CONFIG_FILE))


class ResumedRun(ConfigError):
    """``audit --run`` of a run that was resumed after releasing rounds it then released
    again: a re-simulation from its seed is not that run (its noise was refit). Auditing its
    config without ``--run`` trains the audit's own replay (what ``securefed report`` does for
    such a cell)."""


def _check_replayable(run: Path, config: TrainConfig) -> None:
    """``audit --run`` re-simulates a run from its ``config.toml``: refuse when that is not
    the run its ``summary.json`` and ledger record (found in a walkthrough: a replay run's
    ``config.toml`` edited from epsilon 2 to 8 was audited as an epsilon-8 run, its
    ``audit.json`` claiming 7.99 for a directory whose ledger says 1.991).

    Raises:
        ConfigError: the config's model, seed, rounds or privacy settings differ from what
            the run recorded.
        ResumedRun: the run was resumed and released rounds again (a replay from the seed
            does not re-release them): its summary's model releases beyond its rounds, or an
            interaction-level run's ledger holding a round's DP-SGD releases twice.
    """
    summary_path = run / runs.SUMMARY_FILE
    if not summary_path.exists():
        return  # not finished: the re-simulation is of config.toml, as the user asks
    summary = json.loads(summary_path.read_text())
    p = config.privacy
    now = {
        "model": config.model,
        "seed": config.seed,
        "rounds": config.rounds,
        "target epsilon": p.epsilon,
        "delta": p.delta if p.dp else None,
        "privacy unit": p.privacy_unit if p.dp else None,
        "secure aggregation": bool(p.secagg),
    }
    then = {
        "model": summary.get("model"),
        "seed": summary.get("seed"),
        "rounds": summary.get("rounds_planned", summary.get("rounds")),
        "target epsilon": summary.get("target_epsilon"),
        "delta": summary.get("delta"),
        "privacy unit": summary.get("privacy_unit"),
        "secure aggregation": bool(summary.get("secagg", False)),
    }
    if then["privacy unit"] is None:  # no DP: the summary records no defenses
        del now["secure aggregation"], then["secure aggregation"]
    else:
        # Where the noise came from, its scale and the clip (found in review: a run from OS
        # randomness edited to replay = true was re-simulated as a replay run; a replay run's
        # noise_multiplier edited from 2 to 0.3 passed, both target epsilons None).
        if summary.get("randomness") is not None:
            now["noise source"] = "replay" if p.replay else "os"
            then["noise source"] = summary["randomness"]
        if p.noise_multiplier is not None:
            now["noise multiplier"] = p.noise_multiplier
            then["noise multiplier"] = summary.get("noise_multiplier")
        clip = p.clip if p.clip is not None else config.spec.default_clip(config.params)
        if p.privacy_unit == "user" and clip is not None and "clip" in summary:
            now["clip"], then["clip"] = clip, summary.get("clips") or summary.get("clip")
    now["dataset"], then["dataset"] = config.dataset, summary.get("dataset")
    # The table's column names and the evaluation's negatives change the data or its
    # metrics (both landed beside this check; a summary written without them had neither).
    now["columns"], then["columns"] = config.columns or None, summary.get("columns")
    now["evaluation negatives"] = config.eval_negatives
    then["evaluation negatives"] = summary.get("eval_negatives", DEFAULT_EVAL_NEGATIVES)
    differ = [
        f"{key} {now[key]} in {runs.CONFIG_FILE}, {then[key]} when it ran"
        for key in now
        if not _same(now[key], then[key])
    ]
    if differ:
        raise ConfigError(
            f"{run}'s {runs.CONFIG_FILE} no longer describes the run its "
            f"{runs.SUMMARY_FILE} records ({'; '.join(differ)}), and audit --run re-simulates "
            f"{runs.CONFIG_FILE}: restore it, or audit without --run"
        )
    releases, released = summary.get("releases"), summary.get("released_rounds")
    if isinstance(releases, int) and summary.get("prior_noise_multiplier") is not None:
        releases -= 1  # the popularity prior's one release, beside round 1's (never again)
    again, detail = 0, ""
    if isinstance(releases, int) and isinstance(released, int) and releases > released:
        again, detail = releases - released, f"{releases} model releases for {released} rounds"
    elif summary.get("privacy_unit") == "interaction":
        # Its summary counts no model releases: every round's local DP-SGD releases are in
        # its ledger, and a round released again holds them twice (found in review).
        again, detail = _interaction_rounds_again(run, summary, config)
    if again:
        raise ResumedRun(
            f"{run} was resumed and released {again} round(s) a second time ({detail}; its "
            "noise was refit for the rest), which a re-simulation from its seed does not "
            "reproduce; audit without --run (the audit trains its own replay run)"
        )


def _interaction_rounds_again(
    run: Path, summary: dict[str, Any], config: TrainConfig
) -> tuple[int, str]:
    """Rounds an interaction-level run released more than once, and the record that says so:
    its ledger's DP-SGD events per round (each round's local DP-SGD makes
    ``releases_per_round`` of them, accounted before any client trains; a run resumed from
    an earlier checkpoint runs the rounds after it again and records their releases again),
    else, where the ledger cannot be read, its summary's ``dpsgd_steps`` against its
    ``released_rounds``."""
    from securefed.errors import IntegrityError
    from securefed.privacy import interaction_steps_per_round, read_ledger_file

    per = summary.get("releases_per_round")
    if not isinstance(per, int) or per < 1:
        per = interaction_steps_per_round(config)
    try:
        events = read_ledger_file(run / runs.LEDGER_FILE).events
    except IntegrityError:
        steps, rounds = summary.get("dpsgd_steps"), summary.get("released_rounds")
        if isinstance(steps, int) and isinstance(rounds, int) and steps > rounds * per:
            again = -(-(steps - rounds * per) // per)
            return again, f"{steps} DP-SGD releases for {rounds} rounds of {per} each"
        return 0, ""
    counts: dict[int, int] = {}
    for event in events:
        counts[int(event.round)] = counts.get(int(event.round), 0) + 1
    twice = sorted(r for r, n in counts.items() if n > per)
    if not twice:
        return 0, ""
    names = ", ".join(str(r + 1) for r in twice)
    held = sum(counts[r] for r in twice)
    return len(twice), (
        f"its ledger holds {held} DP-SGD releases for round(s) {names}, {per} a round"
    )


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, int | float) and isinstance(b, int | float) and not isinstance(a, bool):
        return math.isclose(float(a), float(b), rel_tol=1e-9)
    return a == b


def _replay_config(config: TrainConfig) -> TrainConfig:
    """The audit's own run replays its DP randomness from the seed (``replay=True``), so the
    audit can be re-simulated and reproduced; the mechanism and its accounting are the run's."""
    p = config.privacy
    if not p.dp or p.replay:
        return config
    return dataclasses.replace(config, privacy=dataclasses.replace(p, replay=True))


def audit(
    config: AuditConfig | TrainConfig | None = None,
    *,
    out: str | Path | None = None,
    progress: Any = None,
    before_train: Callable[[TrainConfig, Split, AuditSetup], None] | None = None,
) -> AuditResult:
    """Train (or load) a run, record what each observer sees, score the attacks and audit.

    The recording lives in a temporary folder inside ``out`` (removed when the audit ends,
    however it ends) unless :attr:`AuditConfig.keep_recording` keeps it under the audit's run
    directory. The audit's own training run keeps its metrics, summary and ledger but not its
    checkpoint: the audit never resumes it, and it can be re-simulated from its config.

    Args:
        config: An :class:`AuditConfig`, or a :class:`TrainConfig` to audit with every attack.
        out: Output directory (created; must not hold another audit); default a new
            ``audits/<UTC time>-<model>-<dataset>`` (``audits/<time>-of-<run>`` with
            :attr:`AuditConfig.run`), as ``securefed audit`` writes without ``--out``.
        progress: Passed to :func:`securefed.train` (called after every round).
        before_train: Called with the replay's config, split (canaries planted) and
            :class:`AuditSetup` (the attacks that will run, their arrays' bytes) before
            any model is built, when the audit trains (a cost estimate and memory check:
            :mod:`securefed.costs`); an exception it raises stops the audit.

    Returns:
        The report (also written to ``out/audit.json``), per-attack results and the bytes
        the recorder streamed to disk.

    Raises:
        ConfigError: Bad settings, a per-client attack under secure aggregation, or a
            DP run with OS randomness (the default) to re-simulate.
        InsufficientMemory: The replay training and the attack recorder's tables would not
            fit in the available memory (one line naming the attacks that would).
        InsufficientDisk: The replay's checkpoints, the recording and the scores
            (:func:`estimate_audit_disk`) would not fit in the free space where ``out`` goes;
            refused before anything is written (one line naming what would fit).
        DataError: The dataset or a recorded file is missing or malformed.
    """
    cfg = config if isinstance(config, AuditConfig) else AuditConfig(train=config or TrainConfig())
    out_dir = Path(out) if out is not None else default_audit_dir(cfg)
    created = not out_dir.exists()
    try:
        return _audit(cfg, out_dir, progress, before_train)
    finally:
        # Ours, or left by an audit killed mid-way (only an audit in progress holds one).
        for scratch in out_dir.glob(f"{_SCRATCH}*"):
            shutil.rmtree(scratch, ignore_errors=True)
        if created and out_dir.is_dir() and not any(out_dir.iterdir()):
            out_dir.rmdir()  # refused before writing anything: leave nothing behind


def default_audit_dir(cfg: AuditConfig) -> Path:
    """A fresh ``audits/<UTC time>-<model>-<dataset>`` for an audit that trains, or
    ``audits/<UTC time>-of-<run>`` for one of :attr:`AuditConfig.run` (a path that does not
    exist yet), as ``train`` writes ``runs/<...>``."""
    if cfg.run is None:
        return default_run_dir(cfg.train, "audits")
    return stamped_dir("audits", f"of-{Path(cfg.run).resolve().name}")


def _audit(
    cfg: AuditConfig,
    out_dir: Path,
    progress: Any,
    before_train: Callable[[TrainConfig, Split, AuditSetup], None] | None,
) -> AuditResult:
    from attacks.canaries import plant_canaries, plant_interaction_canaries
    from attacks.recorder import (
        RECORDING_VERSION,
        AttackRecorder,
        RecordPlan,
        load_accumulators,
        save_accumulators,
    )
    from attacks.threat import clip_bound, privacy_parameters, sum_noise_std, upload_channel

    if (out_dir / AUDIT_FILE).exists():
        raise ConfigError(f"{out_dir} already holds an audit; choose another --out")
    refuse_foreign_files(out_dir, kind="audit directory")
    check_run_dir_writable(out_dir, kind="audit directory")
    run_dir = Path(cfg.run) if cfg.run is not None else None
    train_cfg = _load_run(run_dir) if run_dir is not None else _replay_config(cfg.train)
    chosen, skipped = _resolve_attacks(cfg, train_cfg)
    reuse = run_dir is not None and (run_dir / "audit" / _ACC).exists()
    if run_dir is not None and not reuse:
        _check_replayable(run_dir, train_cfg)
    if run_dir is not None and not reuse and train_cfg.privacy.os_randomness:
        raise ConfigError(
            f"{run_dir} drew its DP noise and cohorts from the OS (the default) and recorded no "
            "attack statistics, so it cannot be re-simulated; audit without --run (the audit "
            "trains its own replay run) or audit a run trained with --replay-from-seed"
        )
    from securefed.costs import check_synthetic_fits

    check_synthetic_fits(train_cfg)  # before generating the data: nothing allocated yet
    split = load_split(train_cfg)
    n_real, n_real_users = split.n_items, split.n_users
    rng = numpy_generator(train_cfg.seed, "audit-canaries")
    interaction = train_cfg.privacy.interaction_dp
    n_canaries = audit_canaries(train_cfg, split.n_users, cfg.canaries)
    meta: dict[str, Any] = {}
    if reuse:
        assert run_dir is not None
        meta = json.loads((run_dir / "audit" / _META).read_text())
        version = meta.get("recording_version", 1)
        if version != RECORDING_VERSION:
            raise ConfigError(
                f"{run_dir} holds an attack recording of version {version}, and this securefed "
                f"scores version {RECORDING_VERSION} (its statistics were computed by other "
                "code); audit without --run to record anew, or rescore with the securefed that "
                "recorded it"
            )
        recorded = meta.get("canaries")
        n_canaries = 0 if recorded is None else len(recorded["users"])
    canaries = None
    run_cfg, unplanted = train_cfg, split  # before the canaries (the disk refusal's advice)
    if n_canaries > 0 and train_cfg.privacy.dp:
        # The bounds' delta must fit the canaries before anything trains (attacks.report).
        from attacks.canaries import check_canary_delta
        from attacks.report import canary_significance

        prior = not interaction and bool(train_cfg.privacy.prior_share)
        alpha = canary_significance(cfg, prior=prior)
        check_canary_delta(n_canaries, train_cfg.privacy.delta, alpha)
    if n_canaries > 0:
        if interaction:
            split, canaries = plant_interaction_canaries(split, n_canaries, rng)
        else:
            # A model that releases item pairs gets canaries that own a pair, and the run is
            # told which items are canaries (the last ones) where it releases a chosen subset.
            per = items_per_canary(train_cfg)
            split, canaries = plant_canaries(split, n_canaries, rng, items_per_canary=per)
            train_cfg = prepare_audit_config(train_cfg, n_canaries)

    # Disk before anything is written: the replay's checkpoints, the recording, the scores.
    from securefed.costs import RunShape, estimate_run

    replay_estimate = None
    if not reuse:
        replay_estimate = estimate_run(train_cfg, RunShape.of(split), speed=1.0)

    def with_canaries(n: int) -> AuditDisk:
        return estimate_audit_disk(
            prepare_audit_config(run_cfg, n),
            RunShape.of(unplanted),
            canaries=n,
            attacks=chosen,
            target_users=cfg.target_users,
            keep_recording=cfg.keep_recording,
        )

    disk = _check_audit_disk(
        train_cfg,
        replay_estimate,
        chosen,
        out_dir,
        real_users=n_real_users,
        real_items=n_real,
        canaries=0 if canaries is None else n_canaries,
        target_users=cfg.target_users,
        keep_recording=cfg.keep_recording,
        with_canaries=None if reuse else with_canaries,
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    bytes_recorded = 0
    train_seconds: float | None = None  # None: the recording was reused, nothing trained
    prior_dir = run_dir  # where the run's released popularity prior lies, if it has one
    summary: dict[str, Any]
    if reuse:
        assert run_dir is not None
        # What the recording holds is what its attacks read (AttackSpec.reads): any attack
        # reading only that is scored from it, a new one too (found in a walkthrough: a new
        # attack reading the same upload tables was refused by name).
        known = set(attack_names())
        have = recorder_groups(a for a in meta["attacks"] if a in known)

        def recorded(a: str) -> bool:
            return a in meta["attacks"] or set(get_attack(a).reads) <= have

        missing = [a for a in chosen if not recorded(a)]
        if missing and cfg.attacks == ("all",):
            for a in missing:
                skipped[a] = f"not recorded in {run_dir} (audit the run again to record it)"
            chosen = [a for a in chosen if recorded(a)]
        elif missing:
            raise ConfigError(
                f"{run_dir} recorded statistics for {', '.join(meta['attacks'])}, not what "
                f"{', '.join(missing)} read; audit it again without those attacks"
            )
        acc = load_accumulators(run_dir / "audit" / _ACC)
        union_by_k = {int(k): v for k, v in meta.get("union_by_k", {}).items()}
        targets = list(meta.get("targets", []))
        record_dir = run_dir / "audit" / "record"
        summary = json.loads((run_dir / runs.SUMMARY_FILE).read_text())
        bytes_recorded = int(meta.get("bytes_recorded", 0))
        observes = dict(meta.get("observes", {}))
    else:
        cohort = train_cfg.cohort(split.n_users)
        params = privacy_parameters(train_cfg, split)
        channel = None
        if per_client_attacks() & set(chosen):
            channel = upload_channel(
                train_cfg,
                split,
                cohort_size=int(round(cohort.expected_size(split.n_users))),
                params=params,
            )
        noise_std = sum_noise_std(params)
        observes = {
            "upload": channel.note if channel is not None else "",
            "aggregate": _aggregate_note(train_cfg, noise_std),
            "release": RELEASE_NOTE,
        }
        array_bytes = _check_audit_memory(
            train_cfg,
            split,
            chosen,
            upload=channel is not None,
            canaries=0 if canaries is None else n_canaries,
            estimate=replay_estimate,
        )
        if before_train is not None:
            setup = AuditSetup(
                attacks=tuple(chosen),
                array_bytes=array_bytes,
                canaries=0 if canaries is None else n_canaries,
                disk=disk,
            )
            before_train(train_cfg, split, setup)
        initial = build_model(train_cfg, split)
        hooks = train_cfg.spec.observer
        private = (
            hooks.private_vectors(initial) if hooks is not None else torch.zeros(split.n_users, 1)
        )
        plan = RecordPlan(
            attacks=frozenset(chosen),
            model=train_cfg.model,
            n_users=split.n_users,
            n_items=n_real,
            upload=channel,
            sum_noise_std=noise_std,
            clip=clip_bound(params),
            canaries=canaries,
            initial_private=private,
            seed=train_cfg.seed,
            target_users=cfg.target_users,
            real_users=n_real_users,
            imia_iterations=cfg.imia_iterations,
        )
        train_out = out_dir / "run" if run_dir is None else out_dir / "replay"
        # Recorded beside the run, never inside it: train() writes a folder of its own (it
        # refuses one holding other files); a kept recording moves in once the run is done.
        record_dir = Path(tempfile.mkdtemp(dir=out_dir, prefix=_SCRATCH))
        recorder = AttackRecorder(plan, record_dir)
        started = time.perf_counter()
        result = train(train_cfg, out=train_out, split=split, observer=recorder, progress=progress)
        train_seconds = time.perf_counter() - started
        prior_dir = train_out
        for name in (runs.CHECKPOINT_FILE, runs.MODEL_FILE):
            (train_out / name).unlink(missing_ok=True)
        summary = result.summary
        if "release" in recorder_groups(chosen):
            recorder.write_torch(RELEASED_FILE, public_state(result.model))
        bytes_recorded = recorder.bytes_written
        acc = {k: v for k, v in vars(recorder.acc).items() if isinstance(v, np.ndarray)}
        union_by_k = dict(recorder.acc.union_by_k)
        targets = list(recorder.acc.targets)
        if cfg.keep_recording:
            kept = train_out / "audit" / "record"
            kept.parent.mkdir(parents=True, exist_ok=True)
            os.replace(record_dir, kept)  # within out_dir: a rename
            record_dir = recorder.dir = kept
            bytes_recorded += save_accumulators(recorder, train_out / "audit" / _ACC)
            runs.write_json(
                train_out / "audit" / _META,
                {
                    "attacks": chosen,
                    "union_by_k": {str(k): v for k, v in union_by_k.items()},
                    "targets": targets,
                    "recording_version": RECORDING_VERSION,
                    "bytes_recorded": bytes_recorded,
                    "observes": observes,
                    "canaries": None
                    if canaries is None
                    else {
                        "users": canaries.users.tolist(),
                        "items": canaries.items.tolist(),
                        "partners": None
                        if canaries.partners is None
                        else canaries.partners.tolist(),
                        "included": canaries.included.tolist(),
                    },
                },
            )

    from attacks.report import score_attacks

    started = time.perf_counter()
    prior_scores = None
    if canaries is not None and canaries.unit == "user" and train_cfg.privacy.prior_share:
        # The popularity prior is its own release before the rounds (attacks.prior).
        from attacks.prior import load_prior_counts, prior_canary_scores

        assert prior_dir is not None
        prior_scores = prior_canary_scores(
            load_prior_counts(prior_dir), split, canaries, train_cfg.privacy, seed=train_cfg.seed
        )
    attack_results, score_arrays, audit_block = score_attacks(
        chosen=chosen,
        acc=acc,
        union_by_k=union_by_k,
        targets=targets,
        record_dir=record_dir,
        split=split,
        n_real=n_real,
        n_real_users=n_real_users,
        train_cfg=train_cfg,
        canaries=canaries,
        cfg=cfg,
        summary=summary,
        observes=observes,
        prior_scores=prior_scores,
    )
    for name, why in skipped.items():
        attack_results.append(_skipped(name, why))
    privacy = train_cfg.privacy
    report = {
        "model": train_cfg.model,
        "dataset": train_cfg.dataset,
        "epsilon": privacy.epsilon,
        "delta": privacy.delta if privacy.dp else None,
        "secagg": privacy.secagg,
        "accounted_epsilon": summary.get("epsilon"),
        "rounds": summary.get("rounds"),
        "seed": train_cfg.seed,
        "replay": train_cfg.privacy.dp and train_cfg.privacy.replay,
        "users": n_real_users,
        "items": n_real,
        "noise_multiplier": summary.get("noise_multiplier"),
        "clip": summary.get("clip"),
        "attacks": [a.as_dict() for a in attack_results],
        "audit": audit_block,
        "recorded_bytes": bytes_recorded,
        "seconds": {"train": train_seconds, "scoring": time.perf_counter() - started},
        "scores_file": SCORES_FILE,
        "config": train_cfg.to_dict(),
    }
    arrays: dict[str, Any] = dict(score_arrays)
    np.savez_compressed(out_dir / SCORES_FILE, **arrays)
    runs.write_json(out_dir / AUDIT_FILE, _jsonable(report), strict=True)
    return AuditResult(
        out_dir=out_dir,
        report=report,
        attacks=attack_results,
        bytes_recorded=bytes_recorded,
        kept_recording=reuse or cfg.keep_recording,
    )


def _aggregate_note(train_cfg: TrainConfig, noise_std: float) -> str:
    if train_cfg.privacy.interaction_dp:
        what = "per-round sums of uploads that each carry the client's own DP-SGD noise"
    else:
        what = "per-round sums of the clipped uploads"
        if train_cfg.privacy.secagg:
            what += " (decoded from secure aggregation)"
        if noise_std > 0:
            what += f" with DP noise of std sigma*C = {noise_std:.4g}"
    return what + ", and the public global model of every round"


def _skipped(name: str, why: str) -> AttackResult:
    return AttackResult(
        name=name,
        threat_model=get_attack(name).threat.value,
        metrics={},
        ci95={},
        baseline={},
        note=f"skipped: {why}",
    )


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.floating):
        return float(obj)
    if isinstance(obj, torch.Tensor):
        return obj.tolist()
    return obj


def remove_recording(out_dir: str | Path) -> None:
    """Delete what the recorder streamed under an audit's run directory (keeps audit.json)."""
    for sub in ("run", "replay"):
        rec = Path(out_dir) / sub / "audit" / "record"
        if rec.exists():
            shutil.rmtree(rec)
