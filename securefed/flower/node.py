"""The node side: one SuperNode holds one partition of users and acts as their devices.

Per round a node receives the shared model, trains its participants (batched, exactly as
``securefed.train`` trains them), runs the client half of the privacy pipeline
(:func:`securefed.flower.pipeline.encode_updates`) and then speaks for each of its
participants as one :class:`~protocols.secagg.SecAggClient`: four stage messages per user, in
securefed's own wire format, routed by the server. Nothing of a user leaves the node except
those wire messages: its training counters ride in its masked input
(:data:`~securefed.flower.pipeline.COUNTERS`), its evaluation hits in the masked input of a
secure evaluation round (:meth:`NodeRuntime.evaluate`).

A node's process may serve one message (Flower's per-message ClientApp processes) or all of
them (:mod:`securefed.flower.worker`, which keeps a :class:`NodeRuntime` and the round session
in memory); either way everything here can be rebuilt from two stores the node owns:

* the **state directory** (``<state_dir>/<run_token>/partition-<id>.pt``): every user's
  private model state, written atomically after each local training; a restarted SuperNode
  continues from it. Beside it, ``partition-<id>.at-<R>.pt`` keeps the state as of round
  ``R`` for the last two checkpoint rounds ``R`` (multiples of ``checkpoint_every``, and 0)
  the node trained past, so that a resumed run (the server back at its checkpoint of round
  ``R``) rewinds the node to exactly that state; and, beside the runs rather than in one,
  ``<state_dir>/partition-<id>.<unit>.ledger.json``: the node's own count of its users'
  releases in every run on this state directory, per privacy unit
  (:class:`~securefed.flower.pipeline.ReleaseLedger`), never rewound;
* the **round session** (:class:`NodeSession`: in the long-lived process's memory, or kept
  by Flower in the node's ``Context.state``, i.e. in the SuperNode's memory; never on disk):
  the round's SecAgg stage machines (fresh key pairs, seeds, received shares) and the encoded
  inputs, needed between stages only.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import torch

from protocols.secagg import SecAggClient, wire
from protocols.secagg.identity import ClientIdentity, IdentityDirectory
from protocols.secagg.primitives import MaskExpander
from securefed import runs
from securefed.data.split import leave_one_out
from securefed.errors import ConfigError, IntegrityError, PrivacyBudgetError, ProtocolError
from securefed.evaluation import evaluate_splits
from securefed.flower import enrollment, models
from securefed.flower.messages import DATA_SETTINGS
from securefed.flower.pipeline import (
    EVAL_RING_BITS,
    EVAL_ROUND_OFFSET,
    EvalParameters,
    ReleaseLedger,
    RoundParameters,
    encode_updates,
    evaluation_counters,
    evaluation_parameters,
    round_parameters,
)
from securefed.flower.session import NodeSession
from securefed.privacy import PrivateAggregator
from securefed.training import (
    TrainConfig,
    build_model,
    load_interactions,
    load_split,
    training_generator,
)

if TYPE_CHECKING:
    from securefed.data.types import Split

# ----------------------------------------------------------------------------- partitions


def partition_users(n_users: int, partition_id: int, num_partitions: int) -> torch.Tensor:
    """Users of one partition: ``u % num_partitions == partition_id`` (sorted)."""
    if not isinstance(num_partitions, int) or num_partitions < 1:
        raise ConfigError(f"num-partitions must be a positive integer, got {num_partitions!r}")
    if not isinstance(partition_id, int) or not 0 <= partition_id < num_partitions:
        raise ConfigError(f"partition-id must be in [0, {num_partitions}), got {partition_id!r}")
    return torch.arange(partition_id, n_users, num_partitions, dtype=torch.long)


#: The splits this process loaded for the run in progress: key -> split
#: (:func:`node_split`); one in a SuperNode's process, one per partition where several nodes
#: share a process (the in-process transport).
_SPLITS: dict[tuple[Any, ...], Split] = {}


def node_split(
    config: TrainConfig, run_token: str, partition: tuple[int, int] | None = None
) -> Split:
    """The node's dataset, split as the run splits it (:func:`~securefed.training.load_split`),
    loaded once per run, data settings and partition in this process (the seed and
    :data:`~securefed.flower.messages.DATA_SETTINGS`: what ``load_split`` reads): a node reads
    it to report the dataset's public sizes in its hello reply and again to build its
    runtime.

    With ``partition`` (``(partition_id, num_partitions)``) in a run that does not replay
    (a DP run drawing from the OS, the default: :attr:`NodeRuntime.replay`), the split holds
    the rows of the partition's users alone (:attr:`~securefed.data.types.Split.held_users`):
    the node trains, encodes and evaluates those users only, each exactly as on the split of
    every user. The whole file is still read (the users' and items' indices, and who has
    enough interactions, depend on every row) and the whole data checked, but not kept: at
    Gowalla's scale a node's split went from 60 to 21 MB of arrays with three nodes
    (docs/deployment.md, "What a node holds"). A replaying node keeps every user's rows: it
    plans the whole cohort's round."""
    own = partition if partition is not None and config.privacy.os_randomness else None
    run = (run_token, config.seed, *(_hashable(getattr(config, k)) for k in DATA_SETTINGS))
    key = (*run, own)
    split = _SPLITS.get(key)
    if split is None:
        for old in [k for k in _SPLITS if k[:-1] != run]:
            del _SPLITS[old]  # another run's: not held while this one loads
        if own is None:
            split = load_split(config)
        else:
            data = load_interactions(config)
            if config.privacy.interaction_dp:
                # Interaction-level DP's delta is checked against every user's training
                # interactions (two of each user's are held out), not the partition's.
                from protocols.dp.dpsgd import check_interaction_delta

                n_train = int(data.users.shape[0]) - 2 * data.n_users
                check_interaction_delta(config.privacy.delta, n_interactions=n_train)
            users = partition_users(data.n_users, *own).numpy()
            split = leave_one_out(
                data, seed=config.seed, n_eval_negatives=config.eval_negatives, users=users
            )
            del data
        _SPLITS[key] = split
    return split


def _hashable(value: Any) -> Any:
    """A data setting as part of the split cache's key (``columns`` is a mapping)."""
    return tuple(sorted(value.items())) if isinstance(value, dict) else value


def config_digest(config: TrainConfig) -> str:
    """SHA-256 of the resolved config (a node refuses state written under another one)."""
    return hashlib.sha256(runs.dumps_toml(config.to_dict()).encode()).hexdigest()


# ----------------------------------------------------------------------------- tasks


#: A secure round's public parameters: a training round's or an evaluation round's.
_Params = TypeVar("_Params", RoundParameters, EvalParameters)


@dataclass(frozen=True, kw_only=True)
class TrainTask:
    """What the server asks of a node at the start of a round (all public)."""

    round_index: int
    cohort: torch.Tensor  # sorted user ids; a user's secagg id is its index here
    public_seed: bytes
    fingerprint: str  # RoundParameters.fingerprint() of the server, "" when not aggregating
    aggregate: bool
    resume: bool = False  # the first round of a resumed run: rewind to it if trained past


@dataclass(frozen=True, kw_only=True)
class EvalTask:
    """What the server asks of a node for a secure evaluation round (all public): its SecAgg
    round index (:data:`~securefed.flower.pipeline.EVAL_ROUND_OFFSET` plus the training
    round's), public seed, parameters' fingerprint and whether it ranks in full."""

    round_index: int
    public_seed: bytes
    fingerprint: str
    full: bool


@dataclass(frozen=True)
class TrainReply:
    """Per-user SecAgg messages (cohort position -> wire bytes) and the round's session."""

    adverts: dict[int, bytes]
    session: NodeSession


class ReleaseRefused(ProtocolError):
    """The node refuses a round its users' release count cannot afford; the node answers
    with it (``messages.REFUSED``) and the server stops the run on it."""


class NodeRuntime:
    """A node's view of the federation: its partition, its users' state, its model copy.

    Args:
        config: The run's resolved config (sent by the server with every task).
        run_token: The server's id of this run (names the state sub-directory).
        partition_id: This node's partition.
        num_partitions: How many partitions the users are split into.
        state_dir: Where private state persists (``None``: memory only, for tests).
        enrollment: The enrollment directory file (:mod:`securefed.flower.enrollment`) of a
            run whose secure aggregation is in malicious mode; the users' private signing
            keys are then in ``state_dir`` (``identity-keys.json``).
    """

    def __init__(
        self,
        config: TrainConfig,
        *,
        run_token: str,
        partition_id: int,
        num_partitions: int,
        state_dir: str | Path | None,
        enrollment: str | Path | None = None,
    ) -> None:
        if not run_token.isalnum():
            raise ConfigError(f"run token must be alphanumeric, got {run_token!r}")
        if enrollment is not None and config.privacy.secagg_mode != "malicious":
            # The config comes from the server with every message: an enrolled node that
            # followed a server asking for semi-honest mode would send unsigned keys and skip
            # the consistency round, so an active server could unmask its users' inputs
            # (docs/deployment.md, "Malicious server"). The node's enrollment pins the mode.
            raise ProtocolError(
                "this node is enrolled for malicious-mode secure aggregation, and the server "
                f"asked for {config.privacy.secagg_mode!r} mode; refused (an active server "
                "could read its users' inputs in that mode)"
            )
        self.config = config
        self.split = node_split(config, run_token, (partition_id, num_partitions))
        self.users = partition_users(self.split.n_users, partition_id, num_partitions)
        self.partition_id = partition_id
        self.model = build_model(config, self.split)
        if getattr(self.model, "views", "dense") == "sparse":
            # The node saves its users' rows of every private_state entry; FedRAP's sparse
            # views have no per-user rows to slice yet.
            raise ConfigError(
                "a Flower node cannot hold FedRAP's sparse private views yet (the in-process "
                "simulation can): use --param views=dense where the dense views fit"
            )
        self.digest = config_digest(config)
        self.path = (
            Path(state_dir) / run_token / f"partition-{partition_id}.pt"
            if state_dir is not None
            else None
        )
        self.trained_rounds = 0
        self.state_dir = Path(state_dir) if state_dir is not None else None
        self.enrollment = Path(enrollment) if enrollment is not None else None
        self._identity_keys: tuple[dict[int, bytes], dict[int, Any]] | None = None
        self._aggregator: Any = None
        self._snapshots: dict[int, dict[str, Any]] = {}  # without a state directory
        # Every release of this partition's users on this state directory, across runs: a
        # server cannot buy a fresh budget with a new run token (found in review). One file
        # per privacy unit (their events do not compose in one ledger).
        unit = config.privacy.privacy_unit
        self.releases = ReleaseLedger(
            Path(state_dir) / f"partition-{partition_id}.{unit}.ledger.json"
            if state_dir is not None
            else None
        )
        self._load()

    # -- persistence --------------------------------------------------------------------

    def _load(self) -> None:
        saved = runs.load_state(self.path) if self.path is not None else None
        if saved is None:
            return
        if saved.get("config_digest") != self.digest or not torch.equal(
            saved.get("users", torch.empty(0)), self.users
        ):
            raise ConfigError(
                f"node state {self.path} was written for another config or partition; "
                "give this node a fresh --state-dir"
            )
        models.load_private(self.config.model, self.model, self.users, saved["private"])
        self.trained_rounds = int(saved["trained_rounds"])

    def _state(self) -> dict[str, Any]:
        return {
            "config_digest": self.digest,
            "users": self.users,
            "trained_rounds": self.trained_rounds,
            "private": models.private_state(self.config.model, self.model, self.users),
        }

    def save(self) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        runs.save_state(self.path, self._state())

    def _snapshot_path(self, round_index: int) -> Path | None:
        if self.path is None:
            return None
        return self.path.with_name(f"{self.path.stem}.at-{round_index}.pt")

    def _snapshot_rounds(self) -> list[int]:
        if self.path is None:
            return sorted(self._snapshots)
        prefix = f"{self.path.stem}.at-"
        found = []
        for f in self.path.parent.glob(f"{prefix}*.pt"):
            digits = f.name[len(prefix) : -len(".pt")]
            if digits.isdigit():
                found.append(int(digits))
        return sorted(found)

    def _keep_snapshot(self, round_index: int) -> None:
        """Before training ``round_index``: if a checkpoint round ``R`` lies between the
        rounds already trained and this one, the current state is the state as of ``R``
        (nothing trained in between): keep it for a resume to ``R``; drop all but the two
        newest snapshots (the server may die before writing its checkpoint of ``R``, and
        resume from the one before)."""
        every = self.config.resolved_checkpoint_every(flower=True)
        boundary = (round_index // every) * every
        if boundary < self.trained_rounds:
            return
        path = self._snapshot_path(boundary)
        if path is None:
            self._snapshots[boundary] = self._state()
        else:
            assert self.path is not None
            path.parent.mkdir(parents=True, exist_ok=True)
            path.unlink(missing_ok=True)
            if self.trained_rounds and self.path.exists():
                # The state file holds exactly this state (written after the last training,
                # replaced by rename, never in place): a second name for it costs nothing.
                os.link(self.path, path)
            else:
                runs.save_state(path, self._state())
        for old in self._snapshot_rounds()[:-2]:
            self._drop_snapshot(old)

    def _drop_snapshot(self, round_index: int) -> None:
        path = self._snapshot_path(round_index)
        if path is None:
            self._snapshots.pop(round_index, None)
        else:
            path.unlink(missing_ok=True)

    def _charge(self, round_index: int, m: int) -> None:
        """Count the most a round of ``m`` clients can cost this node's users, written
        ahead; refused past the run's epsilon (docs/deployment.md, "Malicious server")."""
        try:
            self.releases.charge(self.aggregator, round_index, m)
        except PrivacyBudgetError as exc:
            raise ReleaseRefused(
                f"refused beyond the budget: {exc}; this node counts its users' releases on "
                "its state directory across runs and resumes, and nothing was trained or "
                "sent (a new budget for these users is a new state directory: the node "
                "operator's decision)"
            ) from None

    def _snapshot_of(self, round_index: int) -> dict[str, Any]:
        """The users' private state as of ``round_index``, kept for a resume."""
        path = self._snapshot_path(round_index)
        saved = self._snapshots.get(round_index) if path is None else runs.load_state(path)
        if saved is None:
            raise ProtocolError(
                f"the server resumes at round {round_index}, but this node has trained "
                f"{self.trained_rounds} rounds and keeps no snapshot of round {round_index} "
                f"(it has {self._snapshot_rounds()}); resume the run from a checkpoint this "
                "node took part in, or start a new run"
            )
        if saved.get("config_digest") != self.digest:
            raise ConfigError(f"node snapshot {path} was written for another config")
        return saved

    def _rewind(self, round_index: int, saved: dict[str, Any] | None = None) -> None:
        """Put back the users' private state as of ``round_index`` (a resumed run), from
        ``saved`` when the caller has loaded it (:meth:`_snapshot_of`)."""
        if saved is None:
            saved = self._snapshot_of(round_index)
        models.load_private(self.config.model, self.model, self.users, saved["private"])
        self.trained_rounds = int(saved["trained_rounds"])
        for later in self._snapshot_rounds():
            if later > round_index:  # the abandoned rounds' snapshots
                self._drop_snapshot(later)
        self.save()

    # -- rounds --------------------------------------------------------------------------

    @property
    def aggregator(self) -> Any:
        if self._aggregator is None:
            self._aggregator = PrivateAggregator(
                self.config, self.split, dim=self.model.layout.size
            )
        return self._aggregator

    @property
    def replay(self) -> bool:
        """Replay the run's seeded streams (exactly ``securefed.train``): in a replay run or a
        run without DP. A DP run draws its noise from the OS (the default) and trains, rounds
        and noises this node's users only."""
        return not self.config.privacy.os_randomness

    def advertise(self, task: TrainTask) -> tuple[NodeSession, dict[int, bytes]]:
        """SecAgg round 0 of a coming round ahead of its training (keys ahead, semi-honest
        mode): fresh keys for each of this node's users in ``task.cohort``, so that the
        round's train message can carry the neighbours' keys (:meth:`train` with ``ahead``)."""
        cohort = _checked_cohort(task)
        own = cohort[torch.isin(cohort, self.users)]
        session = NodeSession(round_index=task.round_index, task=task_digest(task))
        if own.numel() == 0 or not task.aggregate:
            return session, {}
        params = self._parameters(task, int(cohort.numel()))
        if params.secagg.malicious:
            raise ProtocolError("keys ahead are for semi-honest secure aggregation only")
        sid_of = {int(u): i for i, u in enumerate(cohort.tolist())}
        width = params.width(self.aggregator.dim)
        expander = MaskExpander(width, wire.ring_dtype(params.codec.modulus_bits))
        adverts = {}
        for user in own.tolist():
            sid = sid_of[int(user)]
            session.clients[sid] = client = _new_client(sid, params, task, expander)
            adverts[sid] = client.advertise()
        return session, adverts

    def _parameters(self, task: TrainTask, m: int) -> RoundParameters:
        return self._agreed(task, m, lambda: round_parameters(self.aggregator, m), "round")

    def _agreed(
        self, task: TrainTask | EvalTask, m: int, build: Callable[[], _Params], what: str
    ) -> _Params:
        """A secure ``what`` round's parameters for ``m`` clients, built here and refused
        unless the server's fingerprint is theirs, or where ``m`` is below the minimum these
        settings need (an honest server never asks: it aborts there before sending)."""
        if m < self.aggregator.secure_minimum():
            raise ProtocolError(
                f"the server asked for a secure {what} of {m} clients, fewer than the "
                f"{self.aggregator.secure_minimum()} these settings need; refusing it"
            )
        params = build()
        if params.fingerprint() != task.fingerprint:
            raise ProtocolError(
                f"the server's {what} parameters differ from this node's "
                f"({task.fingerprint!r} != {params.fingerprint()!r}); are both on the same "
                "securefed version and config?"
            )
        return params

    def train(
        self,
        task: TrainTask,
        arrays: dict[str, np.ndarray],
        scalars: dict[str, float],
        *,
        ahead: NodeSession | None = None,
        keys: dict[int, bytes] | None = None,
    ) -> TrainReply:
        """Local training of this node's participants, then SecAgg round 0 for each of them.

        With ``ahead`` (the session :meth:`advertise` made for this round) and ``keys`` (the
        neighbours' KEYS per user, from the train message), each user's reply is instead its
        shares and eager masked input (:func:`~securefed.flower.messages.join_messages`):
        rounds 0-2 of the round done, the server's next message is the unmask request.
        """
        cohort = _checked_cohort(task)
        if ahead is not None and (
            ahead.round_index != task.round_index or ahead.task != task_digest(task)
        ):
            # Keys advertised for another cohort, seed or parameters (found in review: the
            # session's n could differ from the m charged and encoded).
            raise IntegrityError()
        if task.round_index < self.trained_rounds and not task.resume:
            raise ProtocolError(
                f"round {task.round_index} was already trained on this node "
                f"(it has trained {self.trained_rounds} rounds)"
            )
        own = cohort[torch.isin(cohort, self.users)]
        # Whatever could refuse the round is checked before its release is charged.
        snapshot = (
            self._snapshot_of(task.round_index) if task.round_index < self.trained_rounds else None
        )
        m = int(cohort.numel())
        params: RoundParameters | None = None
        directory: IdentityDirectory | None = None
        identities: dict[int, ClientIdentity] = {}
        if own.numel():
            if task.aggregate:
                params = self._parameters(task, m)
                directory, identities = self._round_identities(params, cohort, own)
            # Local DP-SGD releases into the users' private state even in a round too small
            # to aggregate (its D_u feeds later uploads): charged too.
            if task.aggregate or self.aggregator.dpsgd is not None:
                self._charge(task.round_index, m)
        if snapshot is not None:
            self._rewind(task.round_index, snapshot)
        session = NodeSession(round_index=task.round_index)
        if own.numel() == 0:
            return TrainReply({}, session)
        self._keep_snapshot(task.round_index)
        models.load_global(self.config.model, self.model, arrays, scalars)
        # The in-process round's seeded stream when replaying, else (a DP run) one from the OS.
        gen = training_generator(self.config, task.round_index)
        updates, positions, stats = models.train_own(
            self.config.model, self.model, cohort, own, task.round_index, gen, replay=self.replay
        )
        self.trained_rounds = task.round_index + 1
        self.save()
        if not task.aggregate:  # no secure sum: nothing of the round leaves the node
            return TrainReply({}, session)
        assert params is not None
        # Each user carries its loss in its masked input; the batch's mean loss stands for
        # each of this node's users (exact with one user per node, as the bounds assume).
        ring = encode_updates(
            self.aggregator,
            updates,
            round_index=task.round_index,
            params=params,
            losses=np.full(len(updates), float(stats.loss)),
            positions=positions,
        )
        sid_of = {int(u): i for i, u in enumerate(cohort.tolist())}
        if ahead is not None:
            inbox: dict[int, bytes] = {}
            for row, user in enumerate(updates.clients.tolist()):
                sid = sid_of[int(user)]
                if sid in ahead.clients and keys is not None and sid in keys:
                    ahead.inputs[sid] = ring[row]
                    inbox[sid] = keys[sid]
            replies = ahead.step("share", inbox, eager=True)
            return TrainReply(replies, ahead)
        expander = MaskExpander(ring.shape[1], wire.ring_dtype(params.codec.modulus_bits))
        adverts = {}
        for row, user in enumerate(updates.clients.tolist()):
            sid = sid_of[int(user)]
            client = _new_client(sid, params, task, expander, identities.get(sid), directory)
            session.clients[sid] = client
            session.inputs[sid] = ring[row]
            adverts[sid] = client.advertise()
        return TrainReply(adverts, session)

    def _round_identities(
        self, params: RoundParameters | EvalParameters, cohort: torch.Tensor, own: torch.Tensor
    ) -> tuple[IdentityDirectory | None, dict[int, ClientIdentity]]:
        """In malicious mode: the round's directory (cohort position -> enrolled key) and this
        node's users' signing identities; ``(None, {})`` otherwise."""
        if not params.secagg.malicious:
            return None, {}
        if self.enrollment is None or self.state_dir is None:
            raise ConfigError(
                "this run's secure aggregation is in malicious mode: every user signs with an "
                "enrolled key; give the SuperNode --node-config 'enrollment=\"/path/"
                "enrollment.json\"' and keep its users' keys in its state-dir "
                "(docs/deployment.md, 'Malicious server')"
            )
        if self._identity_keys is None:
            self._identity_keys = (
                enrollment.load_directory(self.enrollment),
                enrollment.load_private_keys(self.state_dir),
            )
        public, private = self._identity_keys
        users = cohort.tolist()
        return (
            enrollment.round_directory(users, public),
            enrollment.round_identities(users, own.tolist(), private),
        )

    def evaluate(
        self, task: EvalTask, arrays: dict[str, np.ndarray], scalars: dict[str, float]
    ) -> TrainReply:
        """A secure evaluation round's first stage: this node's users' HR@10 / NDCG@10 under
        the shared model, each user's as one SecAgg input (:func:`evaluation_counters`) over
        every user of the run, and their advertisements; the server learns the sums over the
        users who stay to the end, as in process, not a user's or this node's."""
        n = self.split.n_users
        after = task.round_index - EVAL_ROUND_OFFSET  # the training round it follows
        if not 0 <= after < self.config.rounds:
            raise ProtocolError(
                f"an evaluation round's index must be {EVAL_ROUND_OFFSET} plus one of the run's "
                f"{self.config.rounds} rounds, got {task.round_index}; refusing it"
            )
        params = self._agreed(
            task,
            n,
            lambda: evaluation_parameters(self.aggregator, n, full=task.full),
            "evaluation",
        )
        models.load_global(self.config.model, self.model, arrays, scalars)
        own = self.users
        res = evaluate_splits(
            self.model, self.split, k=10, full=task.full, per_user=True, users=own.numpy()
        )
        ranks: dict[str, np.ndarray] = {}
        for which, r in res.items():  # the node's own users only, in their order
            assert r.ranks is not None
            ranks[which] = np.asarray(r.ranks)
            if r.full_ranks is not None:
                ranks[f"{which}_full"] = np.asarray(r.full_ranks)
        ring = params.counters.encode(evaluation_counters(params, ranks))
        everyone = torch.arange(n)  # a user's secagg id is its user id
        directory, identities = self._round_identities(params, everyone, own)
        expander = MaskExpander(params.counters.width, wire.ring_dtype(EVAL_RING_BITS))
        session = NodeSession(round_index=task.round_index)
        adverts = {}
        for row, user in enumerate(own.tolist()):
            client = _new_client(user, params, task, expander, identities.get(user), directory)
            session.clients[user] = client
            session.inputs[user] = ring[row]
            adverts[user] = client.advertise()
        return TrainReply(adverts, session)


def task_digest(task: TrainTask) -> str:
    """SHA-256 of what a round's keys depend on: its index, cohort, public seed, round
    parameters and whether it aggregates."""
    h = hashlib.sha256()
    h.update(f"{task.round_index};{task.fingerprint};{task.aggregate};".encode())
    h.update(task.public_seed)
    h.update(task.cohort.to(torch.int64).numpy().tobytes())
    return h.hexdigest()


def _checked_cohort(task: TrainTask) -> torch.Tensor:
    cohort = task.cohort.to(torch.long)
    if cohort.ndim != 1 or (cohort.numel() > 1 and bool((cohort.diff() <= 0).any())):
        raise ProtocolError("the round's cohort must be strictly increasing user ids")
    return cohort


def _new_client(
    sid: int,
    params: RoundParameters | EvalParameters,
    task: TrainTask | EvalTask,
    expander: MaskExpander,
    identity: ClientIdentity | None = None,
    directory: IdentityDirectory | None = None,
) -> SecAggClient:
    return SecAggClient(
        sid,
        config=params.secagg,
        round_index=task.round_index,
        public_seed=task.public_seed,
        dim=expander.dim,
        expander=expander,  # one scratch buffer for all of this node's users
        identity=identity,
        directory=directory,
    )
