"""The server side of a distributed run: cohort, SecAgg server stages, model step, ledger.

:class:`FederatedServer` drives the rounds over any :class:`Transport` (Flower's ``Grid`` in
the ``ServerApp``; a direct call in tests). It reads no data: at the hello the nodes tell it
the dataset's name and sizes (:class:`~securefed.data.manifest.DataManifest`), and it builds
its model, cohorts, noise and graphs on a split of that shape with no interaction in it; its
summary has no yardsticks (the operator's command adds them:
:func:`securefed.training.add_yardsticks`). A round reads top to bottom::

    sample cohort (as securefed.train: from the OS in a DP run, else from the seed)
      -> train:    nodes train their participants, clip, noise, encode, ADVERTISE
      -> share:    KEYS -> SHARES + eager MASKED_INPUT   (receive_eager / finish_eager)
      -> masked:   FORWARD -> MASKED_INPUT    (only when a share reply was missing, or with
                   eager masking off; streamed into the running sum)
      -> consistency (malicious mode): SURVIVORS -> signatures (finish_consistency)
      -> ledger:   the round's privacy event, written ahead to privacy_ledger.json (fsync);
                   a round the budget refuses, or with fewer inputs than the noise is
                   sized for, is never unmasked
      -> unmask:   UNMASK_REQUEST (+ FORWARD when eager) -> UNMASK_SHARES -> finish_unmask
      -> decode (the update's sum and the training counters'), model.apply_aggregate,
         end_round
      -> evaluate: a secure round over every user (ADVERTISE, share, masked, unmask) whose
                   inputs are the users' hits and NDCG: the server learns their sums only
      -> metrics line, checkpoint, ledger (the same run directory as securefed.train)

The server only ever holds per-user wire messages: public keys, sealed share boxes, masked
inputs, revealed shares, and the dataset's name and sizes. A user's input and interactions
exist in the clear only on its node.

Dropouts are real: a node that does not answer a stage within ``stage_timeout`` seconds (or
answers with an error) is silent for every user it holds, from that stage on, exactly as a
:class:`~protocols.secagg.DropoutSchedule` entry in simulation: the survivors' sum is recovered
while at least ``t`` clients remain, otherwise the round aborts with ``RoundAborted``, nothing
is released and nothing is charged to the privacy budget.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from protocols.secagg import RoundAborted, SecAggServer
from securefed import runs
from securefed.data.manifest import DataManifest, public_split
from securefed.errors import ConfigError, IntegrityError, PrivacyBudgetError, ProtocolError
from securefed.federation.cohort import round_cohort
from securefed.flower import enrollment, models
from securefed.flower.messages import (
    ADVERT,
    KEYS_AHEAD,
    NEXT,
    NEXT_ROUND,
    PROTOCOL,
    REFUSED,
    SCALAR,
    SID,
    Payload,
    join_messages,
    pack_sids,
    split_messages,
    unpack_sids,
)
from securefed.flower.node import partition_users
from securefed.flower.pipeline import (
    EVAL_ROUND_OFFSET,
    ReleaseLedger,
    RoundCounters,
    commit_before_unmask,
    evaluation_consistent,
    evaluation_metrics,
    evaluation_parameters,
    finish_round,
    public_seed,
    record_abort,
    round_parameters,
)
from securefed.privacy import PrivateAggregator
from securefed.training import (
    LossWatch,
    RoundRecord,
    TrainConfig,
    _is_better,
    _selected_round,
    _selection_keys,
    _summary,
    build_aggregator,
    build_model,
    restore_checkpoint,
    save_released_model,
)

TRANSCRIPT_FILE = "flower_transcript.jsonl"
#: The run token and partition sizes of a Flower run (a resume reads them).
FLOWER_FILE = "flower.json"


class Transport(Protocol):
    """Delivers one stage's messages to nodes and collects the replies that arrive in time."""

    def node_ids(self) -> list[int]:
        """The nodes currently connected."""
        ...

    def exchange(
        self, stage: str, messages: Mapping[int, Payload], *, timeout: float
    ) -> dict[int, Payload]:
        """Send ``messages`` (node id -> payload); return the replies received within
        ``timeout`` seconds. Nodes that failed or stayed silent are absent."""
        ...


@dataclass(frozen=True, kw_only=True)
class ServerSettings:
    """How the server waits for nodes and what it records.

    Args:
        stage_timeout: Seconds to wait for the replies of one stage; a node silent for longer
            is a dropout for the rest of the round.
        connect_timeout: Seconds to wait for every partition's node to connect.
        transcript: Also write every received per-user message to ``transcript/`` in the run
            directory (an audit of what the server saw; large).
        enrollment: The enrollment directory file (:mod:`securefed.flower.enrollment`), needed
            when the run's secure aggregation is in malicious mode: the server checks each
            advertisement's signature and drops a forger (the clients check them anyway).
        eager_masking: Ask for each user's masked input together with its shares (semi-honest
            mode; :mod:`protocols.secagg.client`): three exchanges a round instead of four
            while nobody drops, the paper's four (the masks computed twice) when someone does.
        keys_ahead: With eager masking, draw each next round's cohort during this round's
            unmask stage and have its users advertise their keys with the unmask replies, so
            that its train message carries the neighbours' keys: two exchanges a round (train,
            unmask) after the first.
    """

    stage_timeout: float = 120.0
    connect_timeout: float = 300.0
    transcript: bool = False
    enrollment: str | None = None
    eager_masking: bool = True
    keys_ahead: bool = True

    def __post_init__(self) -> None:
        for name in ("stage_timeout", "connect_timeout"):
            value = getattr(self, name)
            if not value > 0:
                raise ConfigError(f"{name.replace('_', ' ')} must be > 0 seconds, got {value!r}")


@dataclass(frozen=True)
class FederatedResult:
    """What :meth:`FederatedServer.run` returns."""

    run_dir: Path
    summary: dict[str, Any]
    metrics: list[dict[str, Any]]


class FederatedServer:
    """The server of one distributed run (see the module docstring).

    Args:
        config: The run's config; must enable secure aggregation (``privacy.secagg``).
        run_dir: The run directory to create (same layout as ``securefed.train``).
        transport: How messages reach the nodes.
        settings: Timeouts and auditing.
        progress: Called after every round with that round's metrics.
        resume: Continue the interrupted run in ``run_dir`` from its last checkpoint (its
            ``config.toml`` and run token; ``config`` must be that config, see
            :meth:`resume`) instead of starting a new one.
    """

    def __init__(
        self,
        config: TrainConfig,
        *,
        run_dir: str | Path,
        transport: Transport,
        settings: ServerSettings | None = None,
        progress: Callable[[RoundRecord], None] | None = None,
        sleep: Callable[[float], None] = time.sleep,
        resume: bool = False,
    ) -> None:
        check_config(config)
        self.config = config
        self.run_dir = Path(run_dir)
        self.resuming = resume
        self._partitions: int | None = None
        if resume:
            recorded = read_flower_record(self.run_dir)
            self.run_token = str(recorded["run_token"])
            self._partitions = len(recorded["nodes"])
        else:
            self._refuse_a_run_in()
            self.run_token = secrets.token_hex(8)
        self.transport = transport
        self.settings = settings or ServerSettings()
        self.progress = progress
        self._sleep = sleep
        self.config_toml = runs.dumps_toml(config.to_dict())
        self._enrolled: dict[int, bytes] = {}
        # Seconds of each stage's exchange in the current round (metrics: flower_*_seconds).
        self._stage_seconds: dict[str, float] = {}
        # Keys ahead: the next round's cohort, parameters and advertised keys, collected with
        # this round's unmask replies (None: the next round advertises in its train reply).
        self._ahead: _KeysAhead | None = None
        self._cohort_spec: Any = None
        self._n_users = 0
        self._lock: runs.RunLock | None = None  # held by run()

    def _refuse_a_run_in(self) -> None:
        if (self.run_dir / runs.CONFIG_FILE).exists():
            raise ConfigError(f"{self.run_dir} already holds a run; choose another run directory")

    @classmethod
    def resume(
        cls,
        run_dir: str | Path,
        *,
        transport: Transport,
        settings: ServerSettings | None = None,
        progress: Callable[[RoundRecord], None] | None = None,
    ) -> FederatedServer:
        """The server of an interrupted Flower run, to continue from its last checkpoint.

        The run's own ``config.toml`` (resolved when it started) and run token are used, so
        the nodes find their state; the nodes' partitions must be those of the first start.
        Rounds after the checkpoint run again and their releases are counted again (the
        ledger file, written ahead, already holds them: docs/privacy.md, "Resume").

        Raises:
            ConfigError: ``run_dir`` is not a Flower run directory, or it finished.
        """
        from securefed.training import check_resume

        run_dir = Path(run_dir)
        config = check_resume(run_dir)
        return cls(
            config,
            run_dir=run_dir,
            transport=transport,
            settings=settings,
            progress=progress,
            resume=True,
        )

    # ------------------------------------------------------------------ setup
    def _base(self) -> dict[str, Any]:
        return {"protocol": PROTOCOL, "run-token": self.run_token}

    def _connect(self) -> tuple[dict[int, torch.Tensor], DataManifest]:
        """Wait for the nodes, learn each one's partition and the dataset they hold (its name
        and sizes: the server reads no data); returns node -> its users, and the dataset."""
        deadline = time.monotonic() + self.settings.connect_timeout
        hello = {**self._base(), "config": self.config_toml}
        errors: list[tuple[str, int, str]] = getattr(self.transport, "errors", [])
        while True:
            nodes = self.transport.node_ids()
            seen = len(errors)
            replies = (
                self.transport.exchange(
                    "hello",
                    {n: Payload(config=dict(hello)) for n in nodes},
                    timeout=self.settings.stage_timeout,
                )
                if nodes
                else {}
            )
            failed = [(n, why) for stage, n, why in errors[seen:] if why != "node offline"]
            if failed:
                # A node that answers the hello with an error (its pinned config refused the
                # run, its dataset is missing or malformed) will answer it so again.
                node, why = failed[0]
                raise ConfigError(
                    f"node {node} failed the hello: {why}; fix that node (its dataset, its "
                    "node config, its pin-config) and start the run again"
                )
            parts: dict[int, tuple[int, int]] = {}
            held: dict[int, DataManifest] = {}
            for node, reply in replies.items():
                parts[node] = (
                    int(reply.config["partition-id"]),
                    int(reply.config["num-partitions"]),
                )
                try:
                    held[node] = DataManifest.from_fields(reply.config)
                except ValueError:
                    raise ProtocolError(
                        f"node {node} did not say which dataset it holds; run the same "
                        "securefed version on the server and the nodes"
                    ) from None
            if len(set(held.values())) > 1:
                held_by = "; ".join(
                    f"partition {parts[n][0]}: {m.describe()}" for n, m in sorted(held.items())
                )
                raise ConfigError(
                    f"the nodes hold different datasets ({held_by}); each node reads the one "
                    "the run's config names, so their copies differ (a relative path, "
                    "SECUREFED_DATA_DIR, another file at the same path): give every node the "
                    "same data"
                )
            counts = {n for _, n in parts.values()}
            if len(counts) > 1:
                raise ConfigError(
                    f"nodes disagree on num-partitions ({sorted(counts)}); give every SuperNode "
                    "the same --node-config num-partitions"
                )
            ids = sorted(p for p, _ in parts.values())
            if len(ids) != len(set(ids)):
                raise ConfigError(
                    f"two nodes claim the same partition-id ({ids}); give each its own"
                )
            if counts and ids == list(range(counts.pop())):
                break
            if time.monotonic() > deadline:
                raise ProtocolError(
                    f"not every partition connected within {self.settings.connect_timeout:g} s "
                    f"(have partitions {ids}); start one SuperNode per partition"
                )
            self._sleep(1.0)
        nparts = len(ids)
        if self._partitions is not None and nparts != self._partitions:
            raise ConfigError(
                f"the run was started with {self._partitions} partitions and {nparts} nodes "
                f"connected; resume it with {self._partitions} SuperNodes (num-partitions="
                f"{self._partitions}), each with its own partition-id and state-dir"
            )
        manifest = next(iter(held.values()))
        return {
            node: partition_users(manifest.n_users, p, nparts) for node, (p, _) in parts.items()
        }, manifest

    def _check_recorded_data(self, manifest: DataManifest) -> None:
        """A resumed run's nodes must hold the dataset the run started on (name and sizes as
        its ``data.json`` recorded them)."""
        try:
            recorded = json.loads((self.run_dir / runs.DATA_FILE).read_text())
            before = (recorded["name"], recorded["users"], recorded["items"])
        except (OSError, ValueError, KeyError, TypeError):
            raise ConfigError(
                f"{self.run_dir / runs.DATA_FILE} is missing or unreadable: the run's dataset "
                "cannot be checked against the nodes'; restore it from a backup"
            ) from None
        if before != (manifest.name, manifest.n_users, manifest.n_items):
            name, users, items = before
            raise ConfigError(
                f"this run started on {name} ({users} users x {items} items) and the nodes "
                f"hold {manifest.describe()}; resume it with the nodes on the run's dataset"
            )

    # ------------------------------------------------------------------ the run
    def run(self) -> FederatedResult:
        """Train ``config.rounds`` rounds and write the run directory, which this process
        holds while it does (:class:`securefed.runs.RunLock`; a resumed run's from the start,
        a new run's once it exists).

        Raises:
            ConfigError: another process trains the run directory now.
        """
        self._lock = runs.RunLock.acquire(self.run_dir) if self.resuming else None
        try:
            if self.resuming:  # again, under the lock: the run may have finished since
                from securefed.training import check_resume

                check_resume(self.run_dir)
            return self._run()
        finally:
            if self._lock is not None:
                self._lock.release()
                self._lock = None

    def _run(self) -> FederatedResult:
        started = time.perf_counter()
        config = self.config
        if config.privacy.secagg_mode == "malicious":
            if self.settings.enrollment is None:
                raise ConfigError(
                    "this run's secure aggregation is in malicious mode: the server needs the "
                    "enrollment directory (run config 'enrollment', ServerSettings.enrollment; "
                    "docs/deployment.md, 'Malicious server')"
                )
            self._enrolled = enrollment.load_directory(self.settings.enrollment)
        # The server holds no data: the nodes say which dataset they hold (its name and
        # sizes), and the model, cohorts, noise and graphs are built on a split of that shape
        # with no interaction in it (docs/deployment.md, "Threat model").
        holders, manifest = self._connect()
        if self.resuming:
            self._check_recorded_data(manifest)
        split = public_split(manifest)
        resolve_for_data = config.spec.resolve_for_data
        if resolve_for_data is not None and not self.resuming:
            # Settled before the nodes receive the config; a resume keeps config.toml's.
            config, _ = resolve_for_data(config, split)
            self.config = config
            self.config_toml = runs.dumps_toml(config.to_dict())
        model = build_model(config, split)
        agg = build_aggregator(config, split, model)
        # A Flower run always aggregates securely (check_config), hence privately.
        assert isinstance(agg, PrivateAggregator)
        cohort_spec = config.cohort(split.n_users)
        self._cohort_spec, self._n_users = cohort_spec, split.n_users
        if cohort_spec.kind == "fixed" and cohort_spec.size > split.n_users:
            raise ConfigError(
                f"--clients-per-round {cohort_spec.size} exceeds the {split.n_users} users"
            )
        owner = [-1] * split.n_users  # Flower node ids are 64-bit unsigned: a Python list
        for node, users in holders.items():
            for u in users.tolist():
                owner[u] = node
        start_round, elapsed_before = 0, 0.0
        metrics: list[dict[str, Any]] = []
        if self.resuming:
            # The server keeps only its own part of the model; the nodes rewind theirs.
            start_round, elapsed_before, metrics = restore_checkpoint(
                self.run_dir,
                agg,
                lambda ckpt: models.load_server_state(config.model, model, ckpt["server"]),
            )
        else:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            self._lock = runs.RunLock.acquire(self.run_dir, new=True)
            self._refuse_a_run_in()  # again: a server started beside this one may have written it
            runs.atomic_write_text(self.run_dir / runs.CONFIG_FILE, self.config_toml)
            agg.attach(self.run_dir, resume=False)
            runs.write_json(self.run_dir / runs.DATA_FILE, manifest.record())
            runs.write_json(
                self.run_dir / FLOWER_FILE,
                {
                    "protocol": PROTOCOL,
                    "run_token": self.run_token,
                    "nodes": {str(n): int(u.numel()) for n, u in holders.items()},
                    "stage_timeout": self.settings.stage_timeout,
                },
            )
        started -= elapsed_before
        # The most each round asked for can have cost a user (the nodes count the same for
        # their users), written ahead and kept across resumes: the run stops on it before any
        # node would refuse a round (docs/deployment.md, "Malicious server").
        releases = ReleaseLedger(self.run_dir / WORST_CASE_FILE)
        if self.resuming and not (self.run_dir / WORST_CASE_FILE).exists():
            # A run directory from before this count (or restored without it): start from
            # the releases its ledger holds; the nodes' own counts still bound every user.
            releases.ledger = agg.ledger
        best = _selected_round(metrics, config)
        watch = LossWatch(metrics)
        stopped: str | None = None
        train_seconds = sum(float(m.get("train_seconds", 0.0)) for m in metrics)
        every = config.resolved_checkpoint_every(flower=True)  # the nodes snapshot the same
        for r in range(start_round, config.rounds):
            t0 = time.perf_counter()
            try:  # client-side DP (interaction unit) is accounted before anyone trains
                agg.begin_round(r)
            except PrivacyBudgetError as exc:
                stopped = str(exc)
                break
            ahead = self._ahead if self._ahead is not None and self._ahead.round == r else None
            self._ahead = None
            # With keys ahead this round's cohort was drawn during the last one's unmask.
            participants = ahead.participants if ahead is not None else self._cohort(r)
            self._stage_seconds = {}
            try:
                m = int(participants.shape[0])
                if m >= agg.secure_minimum() or agg.dpsgd is not None:
                    # Every round's worst case, re-runs included, as the nodes count it.
                    releases.charge(agg, r, m)
                resumed_at = start_round if self.resuming and r == start_round else None
                evaluating = (r + 1) % config.eval_every == 0 or r + 1 == config.rounds
                agg_result, counters = self._round(
                    r,
                    participants,
                    owner,
                    model,
                    agg,
                    resumed_at=resumed_at,
                    ahead=ahead,
                    evaluate_after=evaluating,
                )
            except PrivacyBudgetError as exc:
                stopped = str(exc)
                break
            if agg_result is not None:
                model.apply_aggregate(agg_result, r)
            model.end_round(r)
            t1 = time.perf_counter()
            record: dict[str, Any] = {
                "round": r + 1,
                # The secure sum's counters: no loss without one (aborted or too few users).
                "loss": (
                    counters.loss_sum / counters.trained
                    if counters is not None and counters.trained
                    else float("nan")
                ),
                "participants": int(participants.shape[0]),
                "contributors": agg_result.contributors if agg_result is not None else 0,
                "train_seconds": t1 - t0,
                **{k: round(v, 4) for k, v in self._stage_seconds.items()},
            }
            record.update(agg.round_record())
            if evaluating:
                full = (r + 1) % config.resolved_full_eval_every() == 0 or r + 1 == config.rounds
                record.update(self._evaluate(model, holders, owner, agg, r, full=full))
                record["eval_seconds"] = time.perf_counter() - t1
                # An aborted evaluation round has no metrics: _is_better skips it.
                if _is_better(record, best, _selection_keys(config)):
                    best = record
            train_seconds += t1 - t0
            metrics.append(record)
            runs.append_metrics(self.run_dir, record)
            if (r + 1) % every == 0 or r + 1 == config.rounds:
                self._checkpoint(model, agg, r + 1, time.perf_counter() - started)
            trained = counters is not None and counters.trained > 0
            warning = watch.see(r + 1, record["loss"], trained=trained)
            if self.progress is not None:
                self.progress(RoundRecord(record, warning=warning))
        seconds = time.perf_counter() - started
        if stopped is not None and metrics:
            self._checkpoint(model, agg, metrics[-1]["round"], seconds)
        summary = _summary(config, split, metrics, seconds, agg, stopped, model, held=False)
        summary["train_seconds"] = round(train_seconds, 3)
        summary["engine"] = "flower"
        if watch.warnings:
            summary["warnings"] = watch.warnings
        if stopped is not None:  # no later round can be released: finished, not resumable
            summary["budget_spent"] = True
        if metrics and (stopped is not None or metrics[-1]["round"] == config.rounds):
            # The released model, as an in-process run writes it (before the summary: a run
            # with a summary has its model). The server's checkpoint stays: it holds no
            # user's private state (that stays on the nodes).
            save_released_model(self.run_dir, config, model, metrics[-1]["round"])
        runs.write_json(self.run_dir / runs.SUMMARY_FILE, summary)
        return FederatedResult(run_dir=self.run_dir, summary=summary, metrics=metrics)

    def _checkpoint(self, model: Any, agg: Any, rounds_done: int, seconds: float) -> None:
        # The server holds only the shared model and its own step's state (e.g. FedRecGEL's
        # server Adam); every user's private rows stay on the nodes, which keep their own
        # snapshot at each checkpoint round (node.py) for a resume.
        runs.save_checkpoint(
            self.run_dir,
            {
                "round": rounds_done,
                "global": {k: v.clone() for k, v in model.global_parameters().items()},
                "server": models.server_state(self.config.model, model),
                "aggregator": agg.state_dict(),
                "seconds": seconds,
            },
        )
        runs.write_json(self.run_dir / runs.LEDGER_FILE, agg.ledger_dicts())

    def _shared(self, model: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        arrays, scalars = models.global_payload(self.config.model, model)
        return arrays, {f"{SCALAR}{k}": v for k, v in scalars.items()}

    # ------------------------------------------------------------------ one round
    def _round(
        self,
        r: int,
        participants: torch.Tensor,
        owner: list[int],
        model: Any,
        agg: Any,
        *,
        resumed_at: int | None = None,
        ahead: _KeysAhead | None = None,
        evaluate_after: bool = False,
    ) -> tuple[Any, RoundCounters | None]:
        """One round: train message, the secure sum's stages, unmask and decode. Returns the
        aggregate and the counters' sums, both ``None`` where the round aborted. With
        ``evaluate_after`` the unmask announces no next round (keys ahead): the secure
        evaluation round comes first and takes the nodes' round session."""
        m = int(participants.shape[0])
        timeout = self.settings.stage_timeout
        started = time.perf_counter()
        aggregate = m >= agg.secure_minimum()
        if ahead is not None:  # drawn with the keys, during the last round's unmask
            params, seed = ahead.params, ahead.seed
        else:
            params = round_parameters(agg, m) if aggregate else None
            seed = public_seed(agg, r)
        arrays, scalars = self._shared(model)
        cohort = participants.tolist()
        node_of_sid = _node_of_sid(cohort, owner)
        nodes = sorted(set(node_of_sid.values()))
        task = {
            **self._base(),
            **scalars,
            "config": self.config_toml,
            "round": r,
            "cohort": [int(u) for u in cohort],
            "public-seed": seed,
            "fingerprint": params.fingerprint() if params is not None else "",
            "aggregate": aggregate,
        }
        if resumed_at is not None:
            # The first round of a resume: a node that trained past it rewinds its users'
            # private state to its snapshot of this round.
            task["resume"] = True
        # Keys ahead: each node's users' neighbour KEYS ride on the train message; the
        # replies are their shares and eager masked inputs.
        keys_of = _by_node(ahead.keys if ahead is not None else {}, node_of_sid)
        messages = {
            n: Payload(
                config={**task, KEYS_AHEAD: True, **pack_sids(keys_of[n])}
                if n in keys_of
                else task,
                arrays=arrays,
            )
            for n in nodes
        }
        replies = self._exchange("train", messages, timeout=timeout)
        for node, reply in replies.items():
            if REFUSED in reply.config:
                # The node's own count of its users' releases (across runs on its state
                # directory) is spent: no round can go out to it again.
                raise PrivacyBudgetError(f"node {node} {reply.config[REFUSED]}")
        if params is None:
            record_abort(agg, agg.too_few(m))
            return None, None
        assert params is not None
        directory = (
            enrollment.round_directory(cohort, self._enrolled) if params.secagg.malicious else None
        )
        transcript = _Transcript(self.run_dir, r, enabled=self.settings.transcript)
        eager = self.settings.eager_masking and not params.secagg.malicious
        # Keys ahead need eager masking (even after a fallback this round). Before an
        # evaluation round they ride on its unmask instead (the nodes keep one round session).
        ahead_next = eager and not evaluate_after
        if ahead is not None:
            server = ahead.server
        else:
            server = SecAggServer(
                config=params.secagg,
                round_index=r,
                public_seed=seed,
                dim=params.width(agg.dim),
                directory=directory,
            )
        try:
            outbox, eager = self._to_unmask(
                server, replies, r, node_of_sid, transcript, ahead=ahead is not None, eager=eager
            )
        except RoundAborted as exc:
            record_abort(agg, str(exc))
            return None, None
        ddg = agg.discrete_noise(m)
        if ddg is not None and len(server.u3) < ddg.plan.min_survivors:
            # The noise shares are sized for at least that many inputs: never unmask fewer.
            reason = (
                f"{len(server.u3)} masked inputs, fewer than the {ddg.plan.min_survivors} the "
                "noise shares are sized for"
            )
            record_abort(agg, reason)
            return None, None
        # Account before unmasking: a round the budget refuses is never unmasked.
        event = commit_before_unmask(agg, round_index=r, survivors=len(server.u3), participants=m)
        upcoming = self._upcoming(r, agg, owner) if ahead_next else None
        try:
            total = self._unmask(server, outbox, r, node_of_sid, transcript, eager, upcoming)
        except RoundAborted as exc:
            if event is not None:
                agg.withdraw(event)  # too few shares: nothing was unmasked or released
            record_abort(agg, str(exc))
            return None, None
        result, counters = finish_round(
            agg, total, survivors=len(server.u3), round_index=r, params=params, started=started
        )
        agg._last["secagg_dropped"] = len(server.dropped)
        agg._last["secagg_eager"] = eager
        return result, counters

    def _to_unmask(
        self,
        server: SecAggServer,
        replies: Mapping[int, Payload],
        r: int,
        node_of_sid: Mapping[int, int],
        transcript: _Transcript,
        *,
        ahead: bool,
        eager: bool,
    ) -> tuple[dict[int, bytes], bool]:
        """A secure round's stages from its first replies to the unmask requests: with
        ``ahead`` the replies were the share stage's (keys ahead), else the advertisements;
        then the shares (eagerly with their masked inputs where ``eager``), the masked inputs
        (on a fallback or without eager masking) and, in malicious mode, the consistency
        check. Returns the unmask requests and whether they are eager ones.

        Raises:
            RoundAborted: too few users stayed at some stage.
        """
        timeout = self.settings.stage_timeout
        if ahead:
            self._collect(
                server.receive_eager, replies, node_of_sid, transcript, "share", eager=True
            )
            outbox, eager = self._finish_eagerly(server)
        else:
            self._collect(server.receive_advertise, replies, node_of_sid, transcript, "advertise")
            keys = server.finish_advertise()
            if eager:
                outbox, eager = self._share_eagerly(server, keys, r, node_of_sid, transcript)
            else:
                replies = self._send("share", r, keys, node_of_sid, timeout)
                self._collect(server.receive_shares, replies, node_of_sid, transcript, "share")
                outbox = server.finish_shares()
        if not eager:
            replies = self._send("masked", r, outbox, node_of_sid, timeout)
            self._collect(server.receive_masked_input, replies, node_of_sid, transcript, "masked")
            outbox = server.finish_masked_input()
        if server.config.malicious:
            outbox = self._consistency(server, outbox, r, node_of_sid, transcript)
        return outbox, eager

    def _unmask(
        self,
        server: SecAggServer,
        outbox: Mapping[int, bytes],
        r: int,
        node_of_sid: Mapping[int, int],
        transcript: _Transcript,
        eager: bool,
        upcoming: _KeysAhead | None,
    ) -> np.ndarray:
        """A secure round's unmask stage: the requests out (announcing ``upcoming``, the next
        round's keys ahead, whose advertisements come back with the shares), the survivors'
        sum back.

        Raises:
            RoundAborted: too few unmasking shares came back.
        """
        replies = self._send(
            "unmask",
            r,
            outbox,
            node_of_sid,
            self.settings.stage_timeout,
            eager=eager,
            extra=upcoming.announcement if upcoming is not None else None,
        )
        if upcoming is not None:
            self._collect_ahead(upcoming, replies)
        self._collect(server.receive_unmask_shares, replies, node_of_sid, transcript, "unmask")
        return server.finish_unmask()

    def _share_eagerly(
        self,
        server: SecAggServer,
        keys: Mapping[int, bytes],
        r: int,
        node_of_sid: Mapping[int, int],
        transcript: _Transcript,
    ) -> tuple[dict[int, bytes], bool]:
        """The share stage with eager masking (see :meth:`_finish_eagerly`)."""
        replies = self._send("share", r, keys, node_of_sid, self.settings.stage_timeout, eager=True)
        self._collect(server.receive_eager, replies, node_of_sid, transcript, "share", eager=True)
        return self._finish_eagerly(server)

    @staticmethod
    def _finish_eagerly(server: SecAggServer) -> tuple[dict[int, bytes], bool]:
        """After the eager shares: the next stage's messages and whether they are the unmask
        requests (each joined with its FORWARD) or, on fallback, the FORWARD messages of the
        ``masked`` stage."""
        outcome = server.finish_eager()
        if outcome.fallback:
            return outcome.forward, False
        joined = {sid: join_messages(outcome.forward[sid], m) for sid, m in outcome.unmask.items()}
        return joined, True

    def _cohort(self, r: int) -> torch.Tensor:
        """Round ``r``'s cohort (as securefed.train: from the OS in a DP run, else the seed)."""
        return round_cohort(
            self._cohort_spec,
            self._n_users,
            seed=self.config.seed,
            round_index=r,
            secure=self.config.privacy.os_randomness,
        )

    def _upcoming(self, r: int, agg: Any, owner: list[int]) -> _KeysAhead | None:
        """Keys ahead for round ``r + 1``: its cohort, seed and parameters, drawn now so that
        the nodes advertise its keys with this round's unmask replies and its train message
        carries the neighbours' keys (two exchanges a round). ``None`` after the last round
        or when the next round would not aggregate."""
        if not self.settings.keys_ahead or r + 1 >= self.config.rounds:
            return None
        participants = self._cohort(r + 1)
        m = int(participants.shape[0])
        if m < agg.secure_minimum():
            return None
        params = round_parameters(agg, m)
        seed = public_seed(agg, r + 1)
        cohort = [int(u) for u in participants.tolist()]
        node_of_sid = _node_of_sid(cohort, owner)
        announcement = {
            "config": self.config_toml,
            NEXT_ROUND: r + 1,
            f"{NEXT}cohort": cohort,
            f"{NEXT}public-seed": seed,
            f"{NEXT}fingerprint": params.fingerprint(),
            f"{NEXT}aggregate": True,
        }
        server = SecAggServer(
            config=params.secagg, round_index=r + 1, public_seed=seed, dim=params.width(agg.dim)
        )
        return _KeysAhead(
            round=r + 1,
            participants=participants,
            params=params,
            seed=seed,
            server=server,
            node_of_sid=node_of_sid,
            announcement={node: announcement for node in set(node_of_sid.values())},
        )

    def _collect_ahead(self, upcoming: _KeysAhead, replies: Mapping[int, Payload]) -> None:
        """The next round's advertisements from the unmask replies; keeps the keys ahead if
        at least ``t`` users advertised (else the next round advertises in its train reply)."""
        transcript = _Transcript(self.run_dir, upcoming.round, enabled=self.settings.transcript)
        self._collect(
            upcoming.server.receive_advertise,
            replies,
            upcoming.node_of_sid,
            transcript,
            "advertise",
            prefix=ADVERT,
        )
        try:
            upcoming.keys = upcoming.server.finish_advertise()
        except RoundAborted:
            return
        self._ahead = upcoming

    def _consistency(
        self,
        server: SecAggServer,
        survivors: Mapping[int, bytes],
        r: int,
        node_of_sid: Mapping[int, int],
        transcript: _Transcript,
    ) -> dict[int, bytes]:
        """Malicious mode's round 3 (Bonawitz et al.'s ConsistencyCheck): every survivor is
        sent the survivor set and signs it; returns the signed unmask requests. (A test
        overrides this to play a server that equivocates.)"""
        replies = self._send("consistency", r, survivors, node_of_sid, self.settings.stage_timeout)
        self._collect(server.receive_consistency, replies, node_of_sid, transcript, "consistency")
        return server.finish_consistency()

    def _exchange(
        self, stage: str, messages: Mapping[int, Payload], *, timeout: float
    ) -> dict[int, Payload]:
        """``transport.exchange``, its wall time added to the round's ``flower_<stage>_seconds``
        (the message path there and back plus the nodes' work)."""
        t0 = time.perf_counter()
        try:
            return self.transport.exchange(stage, messages, timeout=timeout)
        finally:
            key = f"flower_{stage}_seconds"
            self._stage_seconds[key] = self._stage_seconds.get(key, 0.0) + (
                time.perf_counter() - t0
            )

    def _send(
        self,
        stage: str,
        r: int,
        outbox: Mapping[int, bytes],
        node_of_sid: Mapping[int, int],
        timeout: float,
        *,
        eager: bool = False,
        extra: Mapping[int, Mapping[str, Any]] | None = None,
    ) -> dict[int, Payload]:
        """One stage's per-user messages, grouped per node; ``extra`` adds config entries
        for some nodes (keys ahead: the next round's task, to nodes with or without users in
        this stage)."""
        per_node = _by_node(outbox, node_of_sid)
        head = {**self._base(), "round": r, **({"eager": True} if eager else {})}
        extra = extra or {}
        messages = {
            node: Payload(
                config={**head, **pack_sids(per_node.get(node, {})), **extra.get(node, {})}
            )
            for node in sorted(set(per_node) | set(extra))
        }
        return self._exchange(stage, messages, timeout=timeout)

    @staticmethod
    def _collect(
        receive: Callable[..., None],
        replies: Mapping[int, Payload],
        node_of_sid: Mapping[int, int],
        transcript: _Transcript,
        stage: str,
        *,
        eager: bool = False,
        prefix: str = SID,
    ) -> int:
        """Feed every per-user reply to the SecAgg server; returns how many were accepted.

        The channel authenticates the node, not the user: a node may speak only for the
        users it holds. A node that speaks for another's user, or sends anything the wire
        decoder rejects, is treated as dropped from that stage on (its later messages are
        not requested), the same as an aborting client in simulation. With ``eager`` each
        reply is a user's shares and masked input (:func:`split_messages`), recorded as
        ``share`` and ``eager`` (a fallback's input is ``masked``) and received together.
        ``prefix`` selects the per-user entries (:data:`~securefed.flower.messages.ADVERT`:
        the next round's advertisements in unmask replies).
        """
        accepted = 0
        for node, reply in sorted(replies.items()):
            try:
                msgs = unpack_sids(reply.config, prefix=prefix)
            except IntegrityError:
                continue
            for sid, msg in sorted(msgs.items()):
                if node_of_sid.get(sid) != node:
                    continue
                try:
                    if eager:
                        shares, masked = split_messages(msg)
                        transcript.record(stage, node, sid, shares)
                        # not "masked": a fallback's input of the same user is recorded there
                        transcript.record("eager", node, sid, masked)
                        receive(sid, shares, masked)
                    else:
                        transcript.record(stage, node, sid, msg)
                        receive(sid, msg)
                except IntegrityError:
                    continue
                accepted += 1
        return accepted

    def _evaluate(
        self,
        model: Any,
        holders: Mapping[int, torch.Tensor],
        owner: list[int],
        agg: Any,
        r: int,
        *,
        full: bool,
    ) -> dict[str, Any]:
        """A secure evaluation round after round ``r``: every user's HR@10 / NDCG@10 under the
        shared model is one SecAgg input (:func:`~securefed.flower.pipeline.evaluation_parameters`),
        so the server learns their sums over the users who stay to the end, as the in-process
        evaluation reports, and no user's or node's. ``eval_aborted`` where too few stayed."""
        n = self._n_users
        if n < agg.secure_minimum():
            return {"eval_aborted": agg.too_few(n)}
        try:
            params = evaluation_parameters(agg, n, full=full)
        except ConfigError as exc:  # no graph for n users at these settings
            return {"eval_aborted": str(exc)}
        e = EVAL_ROUND_OFFSET + r
        seed = public_seed(agg, e)
        arrays, scalars = self._shared(model)
        users = list(range(n))
        node_of_sid = _node_of_sid(users, owner)  # a user's secagg id is its user id
        task = {
            **self._base(),
            **scalars,
            "config": self.config_toml,
            "full": full,
            "round": e,
            "public-seed": seed,
            "fingerprint": params.fingerprint(),
        }
        replies = self._exchange(
            "evaluate",
            {node: Payload(config=task, arrays=arrays) for node in holders},
            timeout=self.settings.stage_timeout,
        )
        malicious = params.secagg.malicious
        server = SecAggServer(
            config=params.secagg,
            round_index=e,
            public_seed=seed,
            dim=params.counters.width,
            directory=enrollment.round_directory(users, self._enrolled) if malicious else None,
        )
        transcript = _Transcript(self.run_dir, e, enabled=self.settings.transcript)
        eager = self.settings.eager_masking and not malicious
        # Keys ahead for the next training round ride on this round's unmask (the training
        # round before it announced none: the nodes keep one round session). They need
        # eager masking, as there.
        upcoming = self._upcoming(r, agg, owner) if eager else None
        try:
            outbox, eager = self._to_unmask(
                server, replies, e, node_of_sid, transcript, ahead=False, eager=eager
            )
            total = self._unmask(server, outbox, e, node_of_sid, transcript, eager, upcoming)
        except RoundAborted as exc:
            return {"eval_aborted": str(exc)}
        sums = params.counters.decode_sum(total)
        if not evaluation_consistent(params, sums, len(server.u3)):
            # A client wrote something else than its fields (no one checks a masked input).
            return {"eval_aborted": "the evaluation sums do not add up to its survivors"}
        return evaluation_metrics(params, sums)


def _node_of_sid(cohort: list[int], owner: list[int]) -> dict[int, int]:
    """Each cohort position's node (``owner``: the node of every user)."""
    return {sid: int(owner[u]) for sid, u in enumerate(cohort)}


def _by_node(
    messages: Mapping[int, bytes], node_of_sid: Mapping[int, int]
) -> dict[int, dict[int, bytes]]:
    """Per-user messages grouped by the node that holds each user."""
    out: dict[int, dict[int, bytes]] = {}
    for sid, msg in messages.items():
        out.setdefault(node_of_sid[sid], {})[sid] = msg
    return out


@dataclass
class _KeysAhead:
    """The next round's cohort, parameters and SecAgg server, drawn during this round's
    unmask stage, and (``keys``) the KEYS of the users who advertised with their node's
    unmask reply."""

    round: int
    participants: torch.Tensor
    params: Any
    seed: bytes
    server: SecAggServer
    node_of_sid: dict[int, int]
    announcement: dict[int, dict[str, Any]]
    keys: dict[int, bytes] = field(default_factory=dict)


class _Transcript:
    """What the server received, per user and stage (``flower_transcript.jsonl``); with
    ``enabled`` also the raw bytes (``transcript/r<round>-<stage>-<sid>.bin``) for audits."""

    def __init__(self, run_dir: Path, round_index: int, *, enabled: bool) -> None:
        self.run_dir = run_dir
        self.round_index = round_index
        self.enabled = enabled
        self._lines: list[str] = []

    def record(self, stage: str, node: int, sid: int, msg: bytes) -> None:
        if not self.enabled:
            return
        folder = self.run_dir / "transcript"
        folder.mkdir(exist_ok=True)
        (folder / f"r{self.round_index}-{stage}-{sid}.bin").write_bytes(msg)
        line = {"round": self.round_index, "stage": stage, "node": node, "sid": sid}
        line["bytes"] = len(msg)
        with (self.run_dir / TRANSCRIPT_FILE).open("a") as fh:
            fh.write(json.dumps(line) + "\n")


def read_flower_record(run_dir: Path) -> dict[str, Any]:
    """The run token and node partition sizes a Flower run recorded (``flower.json``).

    Raises:
        ConfigError: the file is missing or malformed.
    """
    path = run_dir / FLOWER_FILE
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        token, nodes = record["run_token"], record["nodes"]
    except (OSError, ValueError, KeyError, TypeError):
        raise ConfigError(
            f"{run_dir} is not a Flower run that can be resumed (no readable {FLOWER_FILE}); "
            "resume a run that `securefed flower` started, or start a new one"
        ) from None
    if not isinstance(token, str) or not token.isalnum() or not isinstance(nodes, dict):
        raise ConfigError(f"{path} is malformed; resume a run that `securefed flower` started")
    return record


#: The server's count of the most each round it asked for can have cost a user
#: (:class:`~securefed.flower.pipeline.ReleaseLedger`), beside the run's privacy ledger.
WORST_CASE_FILE = "worst_case_ledger.json"


def check_config(config: TrainConfig) -> None:
    """A distributed run must use secure aggregation and real (not simulated) dropouts."""
    p = config.privacy
    if not p.secagg:
        raise ConfigError(
            "a Flower run aggregates with securefed's secure aggregation only; add --secagg "
            "(the server must never hold an unmasked client update)"
        )
    if p.secagg_simulate_dropout:
        raise ConfigError(
            "dropouts are real in a Flower run; drop --secagg-simulate-dropout "
            f"(got {p.secagg_simulate_dropout!r})"
        )
    if p.noise == "central" and p.dp:
        raise ConfigError(
            "central DP noise needs a server that sees the clear sum before noising; with "
            "Flower use the default distributed noise (drop --noise central)"
        )
    if p.interaction_dp and p.replay:
        raise ConfigError(
            "interaction-level DP on Flower runs each node's own DP-SGD with noise from the "
            "OS; --replay-from-seed (the in-process plan replayed on every node) is not "
            "supported there: drop it"
        )
    if not p.os_randomness and not config.spec.replays_on_nodes:
        raise ConfigError(
            f"model {config.model} cannot run on Flower "
            f"{'with --replay-from-seed' if p.dp else 'without DP'}: a node then replays the "
            "in-process round with the model's plan_round and train_subset methods, which it "
            "does not have (docs/models.md, 'Adding a model')"
        )
    if config.eval_users is not None:
        raise ConfigError(
            "eval_users (full ranking of a user sample) is not supported on Flower yet: each "
            "node ranks its own users in full; drop eval_users"
        )
